"""The run report's own plots (matplotlib): the learning curves, the IC by horizon and the
calibration; the interpretation's are `foxhunt.app.predict.interpret`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foxhunt.app.render import new_figure

LEARNING_CURVES = "learning_curves.png"
IC_BY_HORIZON = "ic_by_horizon.png"
CALIBRATION = "calibration.png"


def plot_learning_curves(path: Path, epochs: dict[int, dict[str, float]]) -> bool:
    """Train and validation loss per epoch (`figures.learning_curves`) into `path`."""
    fig = new_figure(figsize=(7, 4))
    ax = fig.subplots()
    for key, label in (("train_loss_epoch", "train loss"), ("val_loss", "validation loss")):
        points = [(e, v[key]) for e, v in epochs.items() if key in v]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("quantile loss (normalized target)")
    ax.set_title("Learning curves")
    from matplotlib.ticker import MaxNLocator  # matplotlib is optional: imported once drawing

    if len(epochs) <= 20:
        ax.set_xticks(list(epochs))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)  # one epoch: a point mid-axis, not a dot
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)
    return True


def plot_quality(run_dir: Path, ev: dict[str, Any], cal: dict[str, Any] | None) -> bool:
    """ic_by_horizon.png (IC and rank IC with 2-standard-error bars) and calibration.png
    (observed against nominal level: the model's own and calibrated, pooled, and calibrated
    per horizon; the PIT histogram of the calibrated forecasts)."""
    steps = [h["horizon"] for h in ev["by_horizon"]]
    fig = new_figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    for key, shift in (("ic", -0.1), ("rank_ic", 0.1)):
        values = [h[key] if h[key] is not None else np.nan for h in ev["by_horizon"]]
        errors = [2 * h[f"{key}_se"] if h[f"{key}_se"] else 0 for h in ev["by_horizon"]]
        ax.errorbar(np.add(steps, shift), values, yerr=errors, fmt="o", capsize=3, label=key)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set(xlabel="horizon step", ylabel="correlation", title="IC by horizon (+-2 se)")
    ax.set_xticks(steps)
    ax.legend()
    fig.savefig(run_dir / IC_BY_HORIZON, dpi=110)

    fig = new_figure(figsize=(9, 3.5))
    ax, pit = fig.subplots(1, 2)
    nominal = ev["quantiles"]
    for h, observed in zip(steps, ev["coverage_by_horizon"], strict=True):
        ax.plot(nominal, observed, lw=0.5, alpha=0.5, label=f"step {h}")
    if cal and cal.get("before"):
        ax.plot(nominal, cal["before"]["share_below"], "k--", marker="o", label="model")
        ax.plot(nominal, cal["after"]["share_below"], "k-", marker="o", label=cal["method"])
    ax.plot([0, 1], [0, 1], color="grey", lw=0.6)
    ax.set(xlabel="nominal level", ylabel="observed share below", title="Calibration")
    ax.legend(fontsize=6)
    counts = np.asarray(ev["pit"])
    pit.bar(np.arange(len(counts)) / len(counts), counts, width=1 / len(counts), align="edge")
    pit.axhline(counts.sum() / len(counts), color="grey", lw=0.6)
    pit.set(xlabel="PIT", ylabel="count", title="PIT histogram (flat: calibrated)")
    fig.savefig(run_dir / CALIBRATION, dpi=110)
    return True
