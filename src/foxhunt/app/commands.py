"""The `foxhunt` command: `foxhunt <command> [group=option ...] [key=value ...]`, one Hydra task
per command over the configs shipped in the package (`foxhunt.conf`). `python -m foxhunt` and
the shims in scripts/ run the same functions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from foxhunt.app import backtest, cli, tune
from foxhunt.app.console import console_summary, final_line
from foxhunt.app.export import export_command
from foxhunt.app.inspect import inspect_data
from foxhunt.app.interpret import interpret_checkpoint
from foxhunt.app.predict_cli import predict_command
from foxhunt.app.train import train as train_run
from foxhunt.config import validate
from foxhunt.memory import MB, MemoryEstimate, estimate, max_batch_size, measure
from foxhunt.memory.table import breakdown_rows, format_table
from foxhunt.run import resume
from foxhunt.run.dir import RunDir


def _run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def _overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task)


def train(cfg: DictConfig) -> float | None:
    run_dir = _run_dir()
    summary = None
    if cfg.get("sweep", {}).get("resume"):  # +sweep.resume=true: a finished job is not re-run
        summary = resume.finished(RunDir(run_dir), "sweep.resume: job")
    if summary is None:
        summary = train_run(cfg, run_dir, overrides=_overrides())
    if rank_zero_only.rank == 0:  # under DDP every process runs this command; one prints
        print("\n".join(console_summary(summary)))
        # the headline and where summary.json is: a panel's summary is far too long to print
        print(final_line(summary, RunDir(run_dir).summary))
    return summary["metrics"][cfg.optimized_metric]  # the value a Hydra sweeper optimises


def predict(cfg: DictConfig) -> None:
    predict_command(cfg, _run_dir(), _overrides())


def backtest_folds(cfg: DictConfig) -> float:
    run_dir = _run_dir()
    summary = backtest.run(cfg, run_dir, overrides=_overrides())
    if cfg.backtest.fold is None:  # the whole backtest: its pooled figures, for a person
        print("\n".join(console_summary(summary, run_dir / backtest.REPORT)))
        print(final_line(summary, run_dir / backtest.SUMMARY))
    else:  # one fold's run (a job of `-m backtest.fold=...`)
        print(final_line(summary, RunDir(run_dir).summary))
    # val_loss: the mean over the folds (one fold's with backtest.fold), for a sweeper
    return summary["metrics"][cfg.optimized_metric]


def tune_study(cfg: DictConfig) -> float | None:
    summary = tune.tune(cfg, overrides=_overrides())
    if "best_trial" in summary:
        print(f"tune: {Path(summary['study_dir']) / tune.REPORT}")
    print(json.dumps(summary))
    return summary.get("best_val_loss")


def export(cfg: DictConfig) -> None:
    export_command(cfg, _run_dir(), _overrides())


def interpret(cfg: DictConfig) -> None:
    out_dir = Path(cfg.out_dir or _run_dir())
    result = interpret_checkpoint(cfg, out_dir, _overrides())
    files = ["interpretation.json", *result["plots"].values()]
    print(json.dumps({"out_dir": str(out_dir.resolve()), "files": files}))


def inspect(cfg: DictConfig) -> None:
    found = inspect_data(cfg, time_batches=bool(cfg.get("time_batches", True)))
    print("\n".join(found.lines))
    print(f"problems: {len(found.problems) or 'none'}")
    for problem in found.problems:
        print(f"problem: {problem}")
    print(json.dumps(found.facts | {"problems": found.problems}))
    if found.problems:
        sys.exit(cli.EXIT_USER_ERROR)


def _memory_table(result: dict, est: MemoryEstimate) -> list[str]:
    steps = (est.train, est.val)
    rows = [
        ["(batch size)", *(str(s.batch_size) for s in steps)],
        *breakdown_rows([{k: v / MB for k, v in s.parts.items()} for s in steps]),
        ["peak", *(f"{s.total / MB:.1f}" for s in steps)],
    ]
    lines = [f"{est.device}: {est.params:,} parameters"]
    lines.append(format_table(["component", "train MB", "val MB"], rows))
    for kind in ("train", "val"):
        if f"measured_{kind}_peak_mb" in result:
            lines.append(
                f"measured {kind} peak: {result[f'measured_{kind}_peak_mb']:.1f} MB "
                f"(estimate {result[f'{kind}_rel_error']:+.1%})"
            )
    if "max_batch_size" in result:
        lines.append(
            f"largest batch size for {result['budget_mb']:.0f} MB "
            f"(less {result['safety_margin_mb']:.0f} MB margin): {result['max_batch_size']}"
        )
    return lines


def estimate_memory(cfg: DictConfig) -> None:
    validate(cfg)
    est = estimate(cfg)
    result = est.to_dict()
    if cfg.memory.budget_mb is not None:
        best, _ = max_batch_size(cfg, cfg.memory.budget_mb)
        result |= {
            "budget_mb": cfg.memory.budget_mb,
            "safety_margin_mb": cfg.memory.safety_margin_mb,
            "max_batch_size": best,
        }
    if cfg.get("measure"):
        result |= measure(cfg, est.train.batch_size, est.val.batch_size, device=est.device)
        for kind in ("train", "val"):
            real = result[f"measured_{kind}_peak_mb"]
            result[f"{kind}_rel_error"] = round((result[f"{kind}_peak_mb"] - real) / real, 4)
    print("\n".join(_memory_table(result, est)))
    print(json.dumps(result))


COMMANDS = {
    c.name: c
    for c in (
        cli.Command("train", "train", train, "train a TFT, test it, report (the main job)"),
        cli.Command("predict", "predict", predict, "forecast with a checkpoint or an export"),
        cli.Command(
            "backtest",
            "backtest",
            backtest_folds,
            "walk-forward folds, each a training run",
            backtest.resume_argv,
        ),
        cli.Command("tune", "tune", tune_study, "an Optuna study over walk-forward periods"),
        cli.Command("export", "export", export, "model.onnx and model.json for serving"),
        cli.Command("interpret", "interpret", interpret, "variable importance and attention"),
        cli.Command("inspect", "inspect_data", inspect, "a panel's facts and its problems"),
        cli.Command(
            "estimate-memory", "estimate_memory", estimate_memory, "a step's peak, before it runs"
        ),
    )
}

USAGE = """usage: foxhunt <command> [group=option ...] [key=value ...]

commands:
{commands}

Each command takes Hydra's overrides and options: `foxhunt train --help` lists its config
groups and settings, `foxhunt train --cfg job` prints the composed config, `--config-dir DIR`
adds your own groups and files. More in README.md and docs/ beside the source."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {c.about}" for name, c in COMMANDS.items()]
    return USAGE.format(commands="\n".join(lines))


def main(name: str | None = None) -> None:
    """`foxhunt <command> ...` (sys.argv), or with `name` a command's own script
    (`python scripts/train.py ...`: sys.argv[1:] are its overrides)."""
    if name is not None:
        cli.run(COMMANDS[name])
        return
    word = sys.argv[1] if len(sys.argv) > 1 else "--help"
    if word in ("-h", "--help", "help"):
        print(usage())
        return
    if word not in COMMANDS:
        print(f"error: unknown command {word!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(cli.EXIT_USER_ERROR)
    cli.run(COMMANDS[word], words=(word,))
