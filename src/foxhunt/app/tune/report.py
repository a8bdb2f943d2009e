"""tune_report.md: what a study found and how much of it is selection, for a person; its plots
drawn by Optuna's own matplotlib backend (`optuna.visualization.matplotlib`)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from foxhunt.app.render import markdown_table
from foxhunt.files import write_atomic

log = logging.getLogger(__name__)
PLOTS = {
    "optimization_history.png": ("Optimization history", "plot_optimization_history"),
    "param_importances.png": ("Parameter importances (PED-ANOVA)", "plot_param_importances"),
    "slice.png": ("Each parameter against the value (slice plot)", "plot_slice"),
}


def write_report(summary: dict[str, Any], study: optuna.Study, study_dir: Path) -> str:
    """The report's markdown; its plots written beside it (one that cannot be drawn is named
    with the reason)."""
    lines = [
        f"# Tuning study {summary['study']}",
        "",
        f"{summary['trials_completed']} trials completed, {summary['trials_pruned']} pruned "
        f"(saving about {summary['pruning_saved_s']} s), {summary['trials_failed']} failed; "
        f"{summary['search_wall_s']} s of trials in all.",
        "",
        "## Best parameters",
        "",
        *markdown_table(
            ["parameter", "value"], [[k, v] for k, v in summary["best_params"].items()]
        ),
        "",
        f"Trial {summary['best_trial']}: mean validation loss {summary['best_val_loss']:.6g} over "
        f"the study's folds ({_losses(summary['fold_val_losses'])}).",
        *_refit_lines(summary.get("refit")),
        *_selection_lines(summary["selection"]),
        "",
        "## Plots",
        "",
        *_plots(study, study_dir),
        "",
    ]
    return "\n".join(lines)


def _losses(losses: list[float] | None) -> str:
    return ", ".join(f"{x:.6g}" for x in losses or [])


def _refit_lines(refit: dict[str, Any] | None) -> list[str]:
    if not refit:
        return ["", "Not refit (tune.refit=false): no test score."]
    rows = [
        [
            f["fold"],
            f["val_loss"],
            f["calibrated_test_loss"],
            f["best_baseline"],
            f["best_baseline_test_loss"],
        ]
        for f in refit["folds"]
    ]
    rows.append(
        [
            "pooled",
            refit["val_loss"],
            refit["calibrated_test_loss"],
            refit["best_baseline"],
            refit["best_baseline_test_loss"],
        ]
    )
    head = ["fold", "val loss", "test loss (delivered)", "strongest baseline", "its test loss"]
    return [
        "",
        "## The winner refit and tested",
        "",
        "Its configuration trained on every backtest fold, each scored once on its test period "
        f"({refit['backtest_dir']}): skill {_num(refit['skill'])} against the strongest "
        f"baseline ({refit['best_baseline']}), net Sharpe ratio of the costed strategy "
        f"{_num(refit['strategy_sharpe'])} (annualized).",
        "",
        *markdown_table(head, rows),
    ]


def _selection_lines(sel: dict[str, Any]) -> list[str]:
    lines = ["", "## How much of it is selection", ""]
    if "skipped" in sel:
        return [*lines, f"Not measured: {sel['skipped']}."]
    dsr, pbo = sel["dsr"], sel["pbo"]
    return [
        *lines,
        f"Over {sel['trials']} completed trials' costed strategies on {sel['periods']} "
        "validation bars they all traded: the winner's net Sharpe ratio is "
        f"{sel['winner_sharpe']:.3g} (annualized); the best of them, trial "
        f"{sel['naive_best_trial']}, {sel['naive_best_sharpe']:.3g}.",
        "",
        f"- Deflated Sharpe ratio: {_num(dsr['dsr'])} "
        f"({'significant' if dsr['significant'] else 'not significant'} at 5%): "
        f"{sel['about']['dsr']}.",
        f"- Probability of backtest overfitting: {_num(pbo['pbo'])} over {pbo['splits']} "
        f"splits of {pbo['groups']} blocks: {sel['about']['pbo']}.",
    ]


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _plots(study: optuna.Study, study_dir: Path) -> list[str]:
    lines = []
    for file, (title, name) in PLOTS.items():
        drawn = _draw(getattr(optuna.visualization.matplotlib, name), study, study_dir / file)
        lines.append(f"![{title}]({file})" if drawn is None else f"- {title}: not drawn ({drawn})")
    return lines


def _draw(plot: Callable[..., Any], study: optuna.Study, path: Path) -> str | None:
    """Draw and save one plot; the reason it could not be drawn, or None."""
    import matplotlib
    import matplotlib.pyplot as plt

    # Optuna's plots set pyplot's style (ggplot): rc_context gives the process its own back
    with warnings.catch_warnings(), matplotlib.rc_context():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        kwargs: dict[str, Any] = {}
        if plot is optuna.visualization.matplotlib.plot_param_importances:
            # fANOVA, the default, needs scikit-learn; PED-ANOVA is Optuna's own
            kwargs["evaluator"] = optuna.importance.PedAnovaImportanceEvaluator()
        try:
            axes = plot(study, **kwargs)
        except (ValueError, RuntimeError, ZeroDivisionError) as why:
            return str(why).splitlines()[0] if str(why) else type(why).__name__
        fig = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        try:
            fig.set_size_inches(9, 5)
            write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100, bbox_inches="tight"))
        finally:
            plt.close(fig)  # pyplot's figure registry: nothing left behind
    return None
