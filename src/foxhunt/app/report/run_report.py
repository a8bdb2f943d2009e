"""The run report: `report.md` in a training run's directory, with learning curves, test metrics
against the naive baseline and the honest ones, calibration and the interpretation plots
(`foxhunt.app.predict.interpret`). Each section's figures come from `figures`, its plots from
`plots`, its markdown from `markdown` and `scores`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from foxhunt.app.predict.interpret import interpret
from foxhunt.app.render import have_matplotlib
from foxhunt.app.report.figures import learning_curves
from foxhunt.app.report.markdown import (
    calibration_section,
    config_section,
    curves_section,
    data_section,
    interpretation_section,
    memory_section,
    metrics_section,
    rolls_section,
)
from foxhunt.app.report.plots import LEARNING_CURVES, plot_learning_curves, plot_quality
from foxhunt.app.report.scores import (
    baselines_section,
    book_section,
    conformal_section,
    headline_section,
    quality_section,
    strategy_section,
)
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.run.progress import steps

log = logging.getLogger(__name__)


def report_run(
    cfg: DictConfig,
    run_dir: str | Path,
    summary: dict[str, Any],
    module: Any,
    datamodule: ParquetDataModule,
) -> dict[str, Path]:
    """Interpret the tested model and write `report.md` with its plots into `run_dir`; returns
    the files written by name (report, interpretation and each plot)."""
    run_dir = Path(run_dir)
    started = time.perf_counter()
    plots = have_matplotlib()
    interpretation = interpret(module, datamodule, run_dir, plots=plots)
    report = write_report(run_dir, cfg, summary, datamodule, interpretation, plots=plots)
    log.info("report: %s written in %.1f s", report, time.perf_counter() - started)
    files = {"report": report, "interpretation": run_dir / "interpretation.json"}
    files |= {name: run_dir / f for name, f in interpretation["plots"].items()}
    if (run_dir / LEARNING_CURVES).is_file():
        files["learning_curves"] = run_dir / LEARNING_CURVES
    return files


def write_report(
    run_dir: str | Path,
    cfg: DictConfig,
    summary: dict[str, Any],
    datamodule: ParquetDataModule,
    interpretation: dict[str, Any],
    plots: bool = True,
) -> Path:
    """Write `report.md` (and `learning_curves.png` when `plots`) into `run_dir`, its sections'
    progress shown on a terminal."""
    run_dir = Path(run_dir)
    title = f"# Run report: {run_dir.parent.name}/{run_dir.name}"
    parts: list[tuple[str, Callable[[], list[str]]]] = [
        ("title", lambda: [title, "", f"Run directory: `{run_dir}`"]),
        ("headline", lambda: headline_section(summary)),
        ("configuration", lambda: config_section(run_dir, cfg, summary)),
        ("data", lambda: data_section(datamodule)),
        ("rolls", lambda: rolls_section(datamodule)),
        ("memory", lambda: memory_section(summary)),
        ("learning curves", lambda: _curves_section(run_dir, plots)),
        ("test metrics", lambda: metrics_section(summary, interpretation)),
        ("baselines", lambda: baselines_section(summary)),
        ("information coefficient", lambda: _quality_section(summary, run_dir, plots)),
        ("conformal calibration", lambda: conformal_section(summary)),
        ("strategy", lambda: strategy_section(summary, run_dir)),
        ("book", lambda: book_section(summary, run_dir)),
        ("calibration", lambda: calibration_section(interpretation)),
        ("interpretation", lambda: interpretation_section(interpretation)),
    ]
    sections = [make() for _, make in steps(parts, "report", label=lambda p: p[0])]
    path = run_dir / "report.md"
    path.write_text("\n\n".join("\n".join(s) for s in sections if s) + "\n")
    return path


def _curves_section(run_dir: Path, plots: bool) -> list[str]:
    """The learning curves read from the run's CSV logs, drawn (`plots`), then written."""
    epochs = learning_curves(run_dir)
    drew = plots and bool(epochs) and plot_learning_curves(run_dir / LEARNING_CURVES, epochs)
    return curves_section(epochs, drew)


def _quality_section(summary: dict[str, Any], run_dir: Path, plots: bool) -> list[str]:
    """The IC and calibration section, its plots drawn first (`plots`)."""
    ev = summary.get("evaluation")
    drew = bool(ev) and plots and plot_quality(run_dir, ev, summary.get("calibration"))
    return quality_section(summary, drew)
