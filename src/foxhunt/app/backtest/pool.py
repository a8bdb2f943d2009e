"""A backtest's pooled figures: every fold's out-of-sample rows and baselines together, in all
and per instrument, with the skill against the strongest baseline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt.evaluation.baselines import skill
from foxhunt.evaluation.forecasts import RAW_PREFIX, quantile_column, target_column


def pooled(
    oos: pa.Table, folds: list[dict[str, Any]], quantiles: list[float]
) -> tuple[dict[str, Any], dict[str, dict]]:
    """The test metrics and the baselines' over the out-of-sample rows `oos` of the finished
    `folds` (their summaries' figures), in all and per instrument."""
    metrics = pooled_metrics(oos, quantiles)
    baselines = pooled_baselines(folds)
    # like for like (foxhunt.evaluation.judge): the model's own against the baselines' own
    metrics |= _skill(metrics.get("test_loss"), baselines)
    metrics |= _calibrated_skill(metrics.get("calibrated_test_loss"), folds)
    metrics |= _by_instrument(oos, folds, quantiles, baselines)
    return metrics, baselines


def pooled_metrics(table: pa.Table, quantiles: list[float]) -> dict[str, float]:
    """The test metrics over out-of-sample rows (`OutOfSampleForecasts`' columns), all folds
    together: test_loss is the pinball loss of the model's own forecasts (raw_q columns, before
    calibration) normalized by each fold's target scale, as a run's test_loss;
    calibrated_test_loss that of the forecasts delivered (the q columns); the skill compares
    test_loss with the baselines' own, like for like; the rest are in the target's own units
    or shares."""
    if table.num_rows == 0:  # no fold finished
        return {}
    q = np.asarray(quantiles)
    delivered = np.stack([table[quantile_column(x)].to_numpy() for x in quantiles], axis=1)
    raw = [RAW_PREFIX + quantile_column(x) for x in quantiles]
    if set(raw) <= set(table.column_names):  # folds run before calibration have none
        pred = np.stack([table[c].to_numpy() for c in raw], axis=1)
    else:
        pred = delivered
    actual, naive = table[target_column(table)].to_numpy(), table["naive"].to_numpy()
    scale = table["target_scale"].to_numpy()[:, None]

    def pinball(forecast: np.ndarray) -> np.ndarray:
        errors = actual[:, None] - forecast
        return np.maximum(q * errors, (q - 1) * errors)

    loss = pinball(pred)
    median = pred[:, int(np.argmin(np.abs(q - 0.5)))]
    moved = actual != naive  # steps without a move count for no direction, as in training
    up = actual[moved] > naive[moved]
    hit = np.sign(median - naive) == np.sign(actual - naive)
    return {
        "test_loss": float((loss / scale).mean()),
        "calibrated_test_loss": float((pinball(delivered) / scale).mean()),
        "test_loss_target_units": float(loss.mean()),
        "test_mae": float(np.abs(median - actual).mean()),
        "test_directional_accuracy": float(hit[moved].mean()) if moved.any() else None,
        "test_up_share": float(up.mean()) if moved.any() else None,
        "test_coverage": float(((actual >= pred[:, 0]) & (actual <= pred[:, -1])).mean()),
        "baseline_test_loss": float((pinball(naive[:, None]) / scale).mean()),  # naive
        "test_rows": table.num_rows,
    }


def _by_instrument(
    oos: pa.Table, folds: list[dict[str, Any]], quantiles: list[float], baselines: dict
) -> dict[str, Any]:
    """The pooled metrics per instrument ({} for one unnamed series), with the skill against
    each instrument's strongest baseline; each baseline's own go into its test_by_instrument."""
    names = sorted(set(oos["instrument"].to_pylist())) if "instrument" in oos.column_names else []
    if None in names:  # one unnamed series: nothing per instrument
        return {}
    by_instrument = {}
    for name in names:
        own = pooled_metrics(oos.filter(pc.equal(oos["instrument"], name)), quantiles)
        rivals = pooled_baselines(folds, name)
        own |= _skill(own["test_loss"], rivals)
        own["windows"] = sum(
            f["metrics"].get("by_instrument", {}).get(name, {}).get("windows", 0) for f in folds
        )
        by_instrument[name] = own
        for rival, found in rivals.items():
            baselines[rival].setdefault("test_by_instrument", {})[name] = found
    return {"by_instrument": by_instrument}


def _calibrated_skill(calibrated: float | None, folds: list[dict[str, Any]]) -> dict[str, Any]:
    """The delivered forecasts against each fold's strongest baseline calibrated alike (its
    calibrated_baseline_test_loss, weighted by the fold's rows), where every fold has one."""
    losses = [f["metrics"].get("calibrated_baseline_test_loss") for f in folds]
    if calibrated is None or not folds or None in losses:
        return {}
    theirs = float(np.average(losses, weights=[f["test_rows"] for f in folds]))
    return {"calibrated_skill": 1 - calibrated / theirs if theirs > 0 else None}


def _skill(test_loss: float | None, baselines: dict[str, dict]) -> dict[str, Any]:
    against, best = skill(test_loss, baselines)
    return {"skill": against, "best_baseline": best}


def pooled_baselines(
    folds: list[dict[str, Any]], instrument: str | None = None
) -> dict[str, dict[str, float]]:
    """Each baseline's test_loss over every fold's windows (of `instrument`, or all): the
    folds' test_loss (a mean over the model's test windows) weighted by their windows;
    baselines some fold lacks are left out."""
    weights, losses = [], {}
    for f in folds:
        if instrument is None:
            weights.append(f["test_rows"])
        else:
            weights.append(
                f["metrics"].get("by_instrument", {}).get(instrument, {}).get("windows", 0)
            )
        for name, b in f.get("baselines", {}).items():
            at = b if instrument is None else b.get("test_by_instrument", {}).get(instrument, {})
            losses.setdefault(name, []).append(at.get("test_loss") if weights[-1] else 0.0)
    return {
        name: {"test_loss": float(np.average(found, weights=weights))}
        for name, found in losses.items()
        if len(found) == len(folds) and None not in found and sum(weights)
    }
