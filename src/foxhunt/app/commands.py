"""The `foxhunt` command: `foxhunt <command> [group=option ...] [key=value ...]`, one Hydra task
per command over the configs shipped in the package (`foxhunt.conf`). `python -m foxhunt` and
the shims in scripts/ run the same functions."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.app.backtest.command import backtest_command
from foxhunt.app.backtest.folds import resume_argv
from foxhunt.app.inspect_data.command import inspect_command
from foxhunt.app.predict.command import export_command, interpret_command, predict_command
from foxhunt.app.train.command import estimate_memory_command, train_command
from foxhunt.app.tune.command import tune_command


def _run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def _overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task)


# each command's Hydra task: its package's command line (app/<package>/command.py) with the run
# directory and the overrides Hydra composed; what it returns is what a Hydra sweeper optimises
def train(cfg: DictConfig) -> float | None:
    return train_command(cfg, _run_dir(), _overrides())


def predict(cfg: DictConfig) -> None:
    predict_command(cfg, _run_dir(), _overrides())


def backtest(cfg: DictConfig) -> float:
    return backtest_command(cfg, _run_dir(), _overrides())


def tune(cfg: DictConfig) -> float | None:
    return tune_command(cfg, _overrides())


def export(cfg: DictConfig) -> None:
    export_command(cfg, _run_dir(), _overrides())


def interpret(cfg: DictConfig) -> None:
    interpret_command(cfg, _run_dir(), _overrides())


def inspect(cfg: DictConfig) -> None:
    if inspect_command(cfg):
        sys.exit(cli.EXIT_USER_ERROR)


def estimate_memory(cfg: DictConfig) -> None:
    estimate_memory_command(cfg)


COMMANDS = {
    c.name: c
    for c in (
        cli.Command("train", "train", train, "train a TFT, test it, report (the main job)"),
        cli.Command("predict", "predict", predict, "forecast with a checkpoint or an export"),
        cli.Command(
            "backtest", "backtest", backtest, "walk-forward folds, each a training run", resume_argv
        ),
        cli.Command("tune", "tune", tune, "an Optuna study over walk-forward periods"),
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
