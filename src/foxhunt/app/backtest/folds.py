"""Walk-forward backtests: `foxhunt backtest [train's overrides] backtest.folds=5`.

The last `folds x test_span` bars of the common timeline (every distinct time of any instrument)
are the folds' test periods, consecutive and in order. Fold k validates on the `val_span` bars
just before its test period and trains on what comes before that: everything from the data's
start (mode=expanding) or the last `train_span` bars (mode=rolling), with data.split.embargo bars
kept out before each cut. A fold is an ordinary training run
(`foxhunt.app.train.phases.train` with its
data.split.* cut times) in its own run directory: `fold-<k>/` of the backtest directory, or a
multirun's job directory (`-m backtest.fold=0,1,2,3,4`, any Hydra launcher), which writes its
test windows' forecasts to `test_forecasts.parquet` as every run does; `summarize` pools the
folds into the backtest directory: oos_predictions.parquet, backtest_summary.json and
backtest_report.md.
See docs/backtest.md.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.backtest.pool import pooled
from foxhunt.app.backtest.report import backtest_report
from foxhunt.app.train.phases import train
from foxhunt.app.train.sweep import SweepSummary
from foxhunt.config import EvalConfig
from foxhunt.data.columns import resolve_target_kind
from foxhunt.data.names import resolve_data
from foxhunt.data.read import timeline
from foxhunt.data.splits import NO_CUT, NO_START, iso_time
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.evaluation.book import BOOK_PLOT, judged_book, plain, plot_book
from foxhunt.evaluation.calibration import table_calibration
from foxhunt.evaluation.forecasts import FORECASTS
from foxhunt.evaluation.quality import EQUITY_PLOT, equity_curves, evaluate, strategy_summary
from foxhunt.evaluation.strategy import plot_equity
from foxhunt.files import write_atomic, write_json, write_text
from foxhunt.run import resume
from foxhunt.run.dir import RunDir
from foxhunt.run.progress import steps
from foxhunt.run.resume import resume_backtest
from foxhunt.training.checkpointing import Interrupted

log = logging.getLogger(__name__)
PLAN = "backtest.json"  # the fold plan, written first: marks a backtest directory
OOS = "oos_predictions.parquet"
SUMMARY = "backtest_summary.json"
REPORT = "backtest_report.md"
CUT_KEYS = ("train_start", "val_start", "test_start", "test_end")


@dataclass(frozen=True)
class Fold:
    """One fold's cut times (int64 ns): training targets from `train_start` (NO_START: the
    data's start), validation from `val_start`, test from `test_start` to before `test_end`
    (NO_CUT: the data's end)."""

    index: int
    train_start: int
    val_start: int
    test_start: int
    test_end: int

    def split(self) -> dict[str, str | None]:
        """The fold's data.split settings, ISO times (None: open)."""
        return {k: iso_time(getattr(self, k)) for k in CUT_KEYS}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def plan_folds(times: np.ndarray, backtest: Any, data: Any) -> list[Fold]:
    """The folds of `backtest` (its config) on `times`, the common timeline (sorted int64 ns);
    spans are counted in its bars. Unset spans: the last data.test_fraction of the timeline
    split evenly into the test periods; a validation stretch of data.val_fraction of the bars
    before the first test period; rolling training as long as the first fold's."""
    n, folds = len(times), backtest.folds
    test_span = backtest.test_span or int(n * data.test_fraction) // folds
    first_test = n - folds * test_span
    _require(
        first_test > 0,
        f"{folds} test periods of {test_span} bars take the whole {n}-bar timeline: lower "
        "backtest.folds or backtest.test_span",
    )
    val_span = backtest.val_span or round(data.val_fraction * first_test)
    train_span = backtest.train_span or first_test - val_span
    embargo = data.prediction_length if data.split.embargo is None else data.split.embargo
    _require(
        test_span >= data.prediction_length,
        f"a test period of {test_span} bars holds no {data.prediction_length}-step forecast: "
        "raise backtest.test_span (or data.test_fraction) or lower backtest.folds",
    )
    _require(
        val_span >= data.prediction_length + embargo,
        f"a validation period of {val_span} bars leaves no window after the {embargo}-bar "
        "embargo: raise backtest.val_span (or data.val_fraction)",
    )
    _require(
        train_span <= first_test - val_span,
        f"backtest.train_span={train_span} is longer than the {first_test - val_span} bars "
        "before the first fold's validation period",
    )
    _require(
        train_span >= data.encoder_length + data.prediction_length + embargo,
        f"{n} bars leave the first fold {train_span} bars of training, too few for one "
        "window: lower backtest.folds or backtest.test_span (rolling: raise backtest.train_span)",
    )
    rolling = backtest.mode == "rolling"
    out = []
    for k in range(folds):
        test = first_test + k * test_span
        val = test - val_span
        out.append(
            Fold(
                k,
                int(times[val - train_span]) if rolling else NO_START,
                int(times[val]),
                int(times[test]),
                int(times[test + test_span]) if k < folds - 1 else NO_CUT,
            )
        )
    return out


def check(cfg: DictConfig) -> None:
    """What a backtest refuses, before any data is read."""
    bt = cfg.backtest
    _require(bt.folds >= 1, f"backtest.folds must be at least 1, got {bt.folds}")
    for key in ("test_span", "val_span", "train_span"):
        value = bt[key]
        _require(value is None or value > 0, f"backtest.{key} must be positive or null")
    _require(
        bt.fold is None or 0 <= bt.fold < bt.folds,
        f"backtest.fold={bt.fold} is not one of the {bt.folds} folds (0 to {bt.folds - 1})",
    )
    _require(
        bt.refit == "full" or bt.fold is None,
        "backtest.refit=finetune runs the folds in order in one command (each from the "
        "previous fold's weights); drop backtest.fold or use backtest.refit=full",
    )
    given = [k for k in CUT_KEYS if cfg.data.split[k] is not None]
    _require(
        not given,
        f"the backtest sets data.split.{given[0] if given else ''} for each fold; drop it "
        "(data.split.embargo applies to every fold)",
    )
    _require(
        not cfg.ckpt_path,
        "a backtest resumes each fold from its own last.ckpt: continue one with resume=auto "
        "(or hydra.run.dir=<its directory> resume=auto), not ckpt_path",
    )
    _require(
        "ddp" not in str(cfg.trainer.strategy),
        "a backtest runs its folds in one process; DDP re-runs the command in each process. "
        "Run the folds as jobs instead: -m backtest.fold=0,1,... hydra/launcher=slurm",
    )


def run(cfg: DictConfig, out_dir: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """foxhunt backtest: every fold of cfg.backtest in `out_dir` (or the one fold
    backtest.fold, `out_dir` being its run directory), continuing what an earlier attempt
    left there; returns the backtest's summary (or the fold's)."""
    check(cfg)
    resolve_data(cfg.data)  # the sample generated; the columns found (foxhunt.data.names)
    folds = plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)
    bt = cfg.backtest
    if bt.fold is not None:  # a job of `-m backtest.fold=...`
        return run_fold(cfg, folds[bt.fold], out_dir, overrides)
    plan = {"settings": _settings(cfg), "folds": [f.split() for f in folds]}
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / PLAN).is_file():  # continued (resume=auto): the same folds or none
        earlier = json.loads((out_dir / PLAN).read_text())
        _require(
            earlier == plan,
            f"{out_dir / PLAN} planned other folds (the data or its timeline changed since "
            "the backtest began); start a new backtest",
        )
    write_json(out_dir / PLAN, plan)
    previous = None
    # one line as each fold starts (the folds draw Lightning's bars): done, elapsed, left
    for fold in steps(folds, "backtest", "fold", label=lambda f: f"fold {f.index}", lines=True):
        previous = run_fold(
            cfg,
            fold,
            out_dir / f"fold-{fold.index}",
            [*overrides, f"backtest.fold={fold.index}"],
            init_weights=Path(previous["best_checkpoint"])
            if previous and bt.refit == "finetune"
            else None,
            record_config=True,
        )
    return summarize(out_dir)


def run_fold(
    cfg: DictConfig,
    fold: Fold,
    fold_dir: Path,
    overrides: Sequence[str],
    init_weights: Path | None = None,
    record_config: bool = False,
) -> dict[str, Any]:
    """Train and test one fold in `fold_dir` and return its summary. An earlier attempt's
    work there counts: a fold with summary.json is done, one with checkpoints/last.ckpt
    resumes from it (foxhunt's exact resume). `record_config`: write the fold's .hydra/ as
    Hydra does for a run of its own (predict and interpret read the data config there)."""
    run = RunDir(fold_dir)
    if (done := resume.finished(run, f"backtest: fold {fold.index}")) is not None:
        return done
    fold_cfg = fold_config(cfg, fold)
    if record_config:
        run.hydra.mkdir(parents=True, exist_ok=True)
        write_text(run.config, OmegaConf.to_yaml(fold_cfg))
        write_text(run.overrides, OmegaConf.to_yaml(list(overrides)))
    last = resume.interrupted(run)
    if last is not None:
        fold_cfg.ckpt_path = str(last)
    log.info(
        "backtest: fold %d (train from %s, validation from %s, test %s to %s)%s",
        fold.index,
        *(v or "the data's edge" for v in fold.split().values()),
        f", resuming from {last}" if last else "",
    )
    try:
        return train(fold_cfg, fold_dir, overrides=overrides, init_weights=init_weights)
    except Interrupted as exc:  # ckpt_path is the backtest's to set, per fold
        exc.resume = "resume with the same command and resume=auto: it continues at this fold"
        raise


def fold_config(cfg: DictConfig, fold: Fold) -> DictConfig:
    """The training config of `fold`: the backtest's with the fold's cut times."""
    fold_cfg = cfg.copy()
    fold_cfg.backtest.fold = fold.index
    fold_cfg.data.split.merge_with(fold.split())
    fold_cfg.resume = None  # the backtest's own resume=auto found the backtest directory
    return fold_cfg


def _settings(cfg: DictConfig) -> dict[str, Any]:
    settings = OmegaConf.to_container(cfg.backtest, enum_to_str=True)
    settings.pop("fold")
    return settings


def _fold_dirs(backtest_dir: Path) -> dict[int, Path]:
    """The folds' run directories under `backtest_dir` by fold number: those whose
    .hydra/config.yaml names a backtest.fold (fold-<k>/, or a multirun's job directories)."""
    found = {}
    for config in backtest_dir.glob("*/.hydra/config.yaml"):
        fold = (OmegaConf.load(config).get("backtest") or {}).get("fold")
        if fold is not None:
            found[int(fold)] = config.parent.parent
    return found


def summarize(backtest_dir: str | Path) -> dict[str, Any]:
    """Pool the folds under `backtest_dir`: write oos_predictions.parquet (every finished
    fold's rows, in fold order), backtest_summary.json and backtest_report.md; return the
    summary. Folds without a summary.json are listed as missing."""
    backtest_dir = Path(backtest_dir)
    fold_dirs = _fold_dirs(backtest_dir)
    if not fold_dirs:
        raise FoxhuntError(
            f"no backtest folds (directories with a backtest.fold) in {backtest_dir}"
        )
    cfg = OmegaConf.load(RunDir(next(iter(fold_dirs.values()))).config)
    folds, tables, missing = _read_folds(fold_dirs, cfg.backtest.folds)
    oos = pa.concat_tables(tables) if tables else pa.table({})
    write_atomic(backtest_dir / OOS, lambda f: pq.write_table(oos, f))
    val = [f["metrics"]["val_loss"] for f in folds if f["metrics"].get("val_loss") is not None]
    quantiles = [float(q) for q in cfg.model.quantiles]
    metrics, baselines = pooled(oos, folds, quantiles)
    kind = _target_kind(fold_dirs, cfg)
    found, judged = _judge(oos, cfg, kind, backtest_dir) if oos.num_rows else ({}, {})
    metrics |= found
    summary = {
        "backtest_dir": str(backtest_dir),
        "settings": _settings(cfg),
        "quantiles": quantiles,
        "folds_missing": missing,
        # val_loss: the mean over the folds (what a sweep of backtests optimises); the test_*
        # metrics: every fold's out-of-sample rows pooled
        "metrics": {"val_loss": float(np.mean(val)) if val else None, **metrics},
        "baselines": baselines,
        **judged,
        # every fold calibrated on its own validation windows: the pooled test rows before
        # and after
        "calibration": table_calibration(
            oos, quantiles, str((cfg.get("calibration") or {}).get("method", "none"))
        ),
        "folds": folds,
        "oos_predictions": str(backtest_dir / OOS),
        "wall_s": round(sum(f["wall_s"] or 0 for f in folds), 1),
    }
    write_json(backtest_dir / SUMMARY, summary)
    write_text(backtest_dir / REPORT, backtest_report(summary, CUT_KEYS, SUMMARY))
    return summary


def _read_folds(
    fold_dirs: dict[int, Path], n_folds: int
) -> tuple[list[dict[str, Any]], list[pa.Table], list[int]]:
    """Of folds 0 to `n_folds - 1`: each finished fold's summary figures and test forecasts
    (with a fold column), and the folds not finished."""
    folds, tables, missing = [], [], []
    for k in range(n_folds):
        run_dir = fold_dirs.get(k)
        if run_dir is None or not RunDir(run_dir).summary.is_file():
            missing.append(k)
            continue
        s = json.loads(RunDir(run_dir).summary.read_text())
        table = pq.read_table(run_dir / FORECASTS)
        tables.append(table.add_column(0, "fold", pa.array(np.full(len(table), k, np.int32))))
        folds.append(
            {
                "fold": k,
                "run_dir": str(run_dir),
                "cuts": s["splits"]["cuts"],
                "metrics": s["metrics"],
                **({"baselines": s["baselines"]} if "baselines" in s else {}),
                **({"strategy": s["strategy"]} if "strategy" in s else {}),
                "test_rows": tables[-1].num_rows,
                "initialized_from": s.get("initialized_from"),
                "wall_s": s.get("wall_s"),
            }
        )
    return folds, tables, missing


def _target_kind(fold_dirs: dict[int, Path], cfg: DictConfig) -> str:
    """The target's kind the folds were trained as: the first finished fold's (its summary's;
    data.target_kind=auto is decided from the training rows), else the config's reading."""
    for k in sorted(fold_dirs):
        summary = RunDir(fold_dirs[k]).summary
        if summary.is_file():
            kind = (json.loads(summary.read_text()).get("target") or {}).get("kind")
            if kind:
                return str(kind)
    return resolve_target_kind(cfg.data)


def _judge(
    oos: pa.Table, cfg: DictConfig, kind: str, backtest_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The IC, calibration and strategy over every fold's rows (a target of `kind`): the
    metrics they add, and the summary's evaluation and strategy; the equity curves drawn into
    `backtest_dir`."""
    e = OmegaConf.merge(OmegaConf.structured(EvalConfig), cfg.get("eval") or {})
    found, evaluation, results = evaluate(
        oos.drop_columns(["fold"]),
        kind,
        e.stride,
        e.strategy,
        e.cost_bps,
        e.execution_lag,
    )
    judged = {
        "evaluation": evaluation,
        "strategy": strategy_summary(
            results, e.strategy, e.cost_bps, "each fold's best", e.execution_lag
        ),
    }
    plot_equity(equity_curves(results, "each fold's"), backtest_dir / EQUITY_PLOT)
    book = judged_book(oos.drop_columns(["fold"]), kind, e)
    if book is not None:  # the book over every fold's out-of-sample dates
        judged["book"] = plain(book)
        if "skipped" not in book:
            plot_book(book, backtest_dir / BOOK_PLOT)
    return found, judged


def _swept(config: DictConfig) -> set[str]:
    """The keys a multirun sweeps over."""
    parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    return {o.key_or_group for o in parsed if o.is_sweep_override()}


class BacktestSweep(SweepSummary):
    """The sweep summary, and for a multirun over backtest.fold (each job one fold, any
    launcher): that backtest pooled into the sweep directory when the jobs end. Refused there
    (one line, exit 2): refit=finetune, whose folds run in order, and another swept setting."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        super().on_multirun_start(config, **kwargs)
        swept = _swept(config)
        if "backtest.fold" not in swept:
            return
        problem = None
        if config.backtest.refit == "finetune":
            problem = (
                "backtest.refit=finetune starts each fold from the previous one's weights, so "
                "its folds cannot run as parallel jobs: drop -m backtest.fold=... (the folds "
                "then run in order) or use backtest.refit=full"
            )
        elif len(swept) > 1:
            problem = (
                "a multirun over backtest.fold is one backtest; to compare settings sweep them "
                f"without backtest.fold (each job then runs every fold), not {sorted(swept)}"
            )
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        super().on_multirun_end(config, **kwargs)
        sweep_dir = Path(config.hydra.sweep.dir)
        if "backtest.fold" in _swept(config) and sweep_dir.exists():
            summary = summarize(sweep_dir)
            log.info("backtest summary: %s", sweep_dir / SUMMARY)
            if summary["folds_missing"]:
                log.warning("backtest: folds %s did not finish", summary["folds_missing"])


def resume_argv(argv: list[str], root: Path = Path("outputs")) -> list[str]:
    """foxhunt backtest's command line, sent into the earlier backtest it resumes
    (`foxhunt.run.resume.resume_backtest`)."""
    return resume_backtest(argv, PLAN, root)
