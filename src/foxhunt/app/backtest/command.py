"""The backtest command line: `foxhunt backtest` runs the walk-forward folds
(`foxhunt.app.backtest.folds`) and prints the pooled figures; a multirun job of
`-m backtest.fold=...` runs one fold and prints its last line."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from foxhunt.app.backtest import folds
from foxhunt.app.report.console import console_summary, final_line
from foxhunt.run.dir import RunDir


def backtest_command(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> float:
    """foxhunt backtest: the folds' pooled figures for a person (one fold's last line with
    backtest.fold), and val_loss, the mean over the folds, for a sweeper."""
    summary = folds.run(cfg, run_dir, overrides=overrides)
    if cfg.backtest.fold is None:  # the whole backtest: its pooled figures, for a person
        print("\n".join(console_summary(summary, run_dir / folds.REPORT)))
        print(final_line(summary, run_dir / folds.SUMMARY))
    else:  # one fold's run (a job of `-m backtest.fold=...`)
        print(final_line(summary, RunDir(run_dir).summary))
    return summary["metrics"][cfg.optimized_metric]
