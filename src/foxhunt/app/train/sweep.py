"""The sweep summary a Hydra multirun leaves in its sweep directory.

`SweepSummary` is a Hydra callback (registered in conf/train.yaml): when a multirun ends it reads
every job directory (its `.hydra/` config and overrides, and `summary.json` or `status.json`)
and writes `sweep_summary.csv` (one row per job), `sweep_summary.md` (the same as a table sorted
by the optimized metric) and `sweep_summary.png` (the metric against model.hidden_dim, one line
per model.num_heads). `summarize(sweep_dir)` does the same for a finished or interrupted sweep.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.render import markdown_table
from foxhunt.run.dir import RunDir

log = logging.getLogger(__name__)
COLUMNS = (
    "job",
    "overrides",
    "status",
    "metric",
    "val_loss",
    "test_loss",
    "batch_size",
    "num_parameters",
    "peak_memory_mb",
    "wall_s",
    "run_dir",
    "error",
)


def _job(job_dir: Path) -> dict[str, Any]:
    run = RunDir(job_dir)
    cfg = OmegaConf.load(run.config)
    overrides = OmegaConf.load(run.overrides)
    metric_name = cfg.get("optimized_metric", "val_loss")
    row: dict[str, Any] = {
        "job": job_dir.name,
        "overrides": " ".join(overrides),
        "status": "failed",  # no summary and no status: it crashed or was interrupted
        "run_dir": str(job_dir),
        "hidden_dim": cfg.model.hidden_dim,
        "num_heads": cfg.model.num_heads,
        "metric_name": metric_name,
    }
    summary, status = run.summary, run.status
    if not summary.exists():  # a job of foxhunt backtest: its folds pooled
        summary = job_dir / "backtest_summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        m = s["metrics"]
        row |= {
            "status": "ok",
            "metric": m.get(metric_name),
            "val_loss": m.get("val_loss"),
            "test_loss": m.get("test_loss"),
            "batch_size": s.get("batch_size"),
            "num_parameters": s.get("num_parameters"),
            "peak_memory_mb": s.get("memory", {}).get("peak_mb"),
            "wall_s": s.get("wall_s"),
        }
    elif status.exists():
        row |= json.loads(status.read_text())
    return row


def summarize(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Write the three summary files of a sweep directory; return its rows."""
    sweep_dir = Path(sweep_dir)
    jobs = [d for d in sweep_dir.iterdir() if RunDir(d).config.exists()]
    rows = [_job(d) for d in sorted(jobs, key=lambda d: int(d.name) if d.name.isdigit() else 0)]
    # the markdown shows what varies between jobs; the CSV keeps every override
    common = set.intersection(*(set(r["overrides"].split()) for r in rows)) if rows else set()
    for r in rows:
        r["swept"] = " ".join(o for o in r["overrides"].split() if o not in common)
    with open(sweep_dir / "sweep_summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    _write_markdown(sweep_dir / "sweep_summary.md", rows)
    _write_plot(sweep_dir / "sweep_summary.png", rows)
    return rows


def _sort_key(row: dict[str, Any]) -> tuple[int, float]:
    m = row.get("metric")
    ok = row["status"] == "ok" and m is not None and not math.isnan(m)
    return (0, m) if ok else (1, 0.0)


def _write_markdown(path: Path, rows: list[dict[str, Any]]) -> None:
    name = rows[0]["metric_name"] if rows else "metric"
    head = ["job", "swept", "status", name, "test_loss", "batch_size", "num_parameters"]
    head += ["peak_memory_mb", "wall_s", "error"]
    cells = [
        [r.get("metric") if h == name else r.get(h) for h in head]
        for r in sorted(rows, key=_sort_key)
    ]
    lines = [f"# Sweep summary (sorted by {name})", "", *markdown_table(head, cells)]
    path.write_text("\n".join(lines) + "\n")


def _write_plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ok = [r for r in rows if r["status"] == "ok" and r.get("metric") is not None]
    for heads in sorted({r["num_heads"] for r in ok}):
        points = sorted((r["hidden_dim"], r["metric"]) for r in ok if r["num_heads"] == heads)
        ax.plot(*zip(*points, strict=True), marker="o", label=f"num_heads={heads}")
    name = rows[0]["metric_name"] if rows else "metric"
    ax.set_xlabel("model.hidden_dim")
    ax.set_ylabel(name)
    ax.set_title(f"{name} by hidden size ({len(ok)} of {len(rows)} jobs finished)")
    if ok:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # a sweep that selects on the test split reports a test score it was chosen for
        metric = str(config.get("optimized_metric", ""))
        if metric.startswith("test_") or metric.startswith("baseline_test"):
            print(
                f"error: optimized_metric={metric} would select the sweep's best on the test "
                "split, whose score is then no longer out of sample; use val_loss",
                file=sys.stderr,
            )
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.exists():
            rows = summarize(sweep_dir)
            ok = sum(r["status"] == "ok" for r in rows)
            log.info("sweep summary: %d of %d jobs finished, in %s", ok, len(rows), sweep_dir)
