"""The command lines of training: `foxhunt train` (one run: trained, tested, reported; its
console summary and last line) and `foxhunt estimate-memory` (a training step's peak, before it
runs), each from its composed config and, for train, its run directory and overrides."""

from __future__ import annotations

import json
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from foxhunt.app.report.console import console_summary, final_line
from foxhunt.app.train.phases import train
from foxhunt.config import validate
from foxhunt.memory import MB, MemoryEstimate, estimate, max_batch_size, measure
from foxhunt.memory.table import breakdown_rows, format_table
from foxhunt.run import resume
from foxhunt.run.dir import RunDir


def train_command(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> float | None:
    """foxhunt train: the run (or, with +sweep.resume=true, a finished job's summary), its
    console lines on rank 0, and the metric a Hydra sweeper optimises."""
    summary = None
    if cfg.get("sweep", {}).get("resume"):  # +sweep.resume=true: a finished job is not re-run
        summary = resume.finished(RunDir(run_dir), "sweep.resume: job")
    if summary is None:
        summary = train(cfg, run_dir, overrides=overrides)
    if rank_zero_only.rank == 0:  # under DDP every process runs this command; one prints
        print("\n".join(console_summary(summary)))
        # the headline and where summary.json is: a panel's summary is far too long to print
        print(final_line(summary, RunDir(run_dir).summary))
    return summary["metrics"][cfg.optimized_metric]


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


def estimate_memory_command(cfg: DictConfig) -> dict:
    """foxhunt estimate-memory: the estimate's table (and, with measure=true, a real step's
    peak beside it), then one JSON line."""
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
    return result
