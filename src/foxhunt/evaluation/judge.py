"""A trained model's test forecasts judged as a quant would: beside every baseline on the same
windows (`baselines`), pooled and per instrument, then the IC, calibration and a costed strategy
(`quality`), and on a panel the cross-sectional book (`book`). Pure: the caller runs the model
and writes the files."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt.data.schema import DataSchema
from foxhunt.data.windows import WindowDataset
from foxhunt.evaluation.baselines import Predict, forecast_all, score_baselines
from foxhunt.evaluation.book import judged_book, plain
from foxhunt.evaluation.forecasts import forecast_table, window_facts
from foxhunt.evaluation.quality import equity_curves, evaluate, scored_apart, strategy_summary
from foxhunt.evaluation.stats import pinball_per_quantile

log = logging.getLogger(__name__)
# summary.json's metrics.unseen: the names forecast through the embedding's unseen row (listed
# after training, or without a training window), scored apart
UNSEEN = "unseen"


@dataclass
class Judged:
    table: pa.Table  # test_forecasts.parquet: the model's and the strongest baseline's
    summary: dict[str, Any]  # summary.json's metrics (headline), baselines, evaluation, strategy
    equity: dict[str, Any]  # the equity curves to plot
    book: dict[str, Any] | None = None  # the cross-sectional book, its per-date returns too


# what calibrates a forecaster's quantiles like the model's (`foxhunt.evaluation.run`): its
# forecasts of the calibration windows and of the test windows [windows, H, Q] -> the test's
Calibrate = Callable[[np.ndarray, np.ndarray], np.ndarray]


def judge(
    datasets: dict[str, WindowDataset],
    schema: DataSchema,
    pred: np.ndarray,
    quantiles: list[float],
    eval_cfg: Any,
    seed: int,
    raw: np.ndarray | None = None,
    calibrate: tuple[str, Calibrate] | None = None,
) -> Judged:
    """Judge the model's test forecasts ([test windows, H, Q], normalized, in the test
    dataset's order) beside the baselines fit on the training windows, like for like: its own,
    `raw` (`pred` when not given), against theirs, pooled and per instrument (the skill); the
    delivered, `pred` (calibrated), against the strongest baseline calibrated the same way
    (`calibrate`: the calibration windows' dataset and how; the calibrated skill). The table
    holds `pred`, `raw` and the strongest baseline's (calibrated where the model's are)."""
    started = time.perf_counter()
    series = datasets["test"].series
    unseen = series.unseen(schema.groups)
    names, own = (series.names if schema.groups else []), (pred if raw is None else raw)
    baselines, test, strongest, predict = score_baselines(
        datasets, schema.target_kind, quantiles, names, own, seed, {UNSEEN: unseen}
    )
    pooled = test.pop(None, {})
    apart = test.pop(("apart", UNSEEN), None)
    headline, strongest = _calibrated(
        datasets, schema, pred, quantiles, strongest, predict, calibrate
    )
    best = None if strongest is None else (pooled["best_baseline"], strongest)
    table = forecast_table(datasets["test"], schema, pred, quantiles, best, raw)
    log.info("baselines: fit and scored in %.1f s", time.perf_counter() - started)
    headline |= {
        # the model's own against the baselines' own: the skill and by_instrument; the
        # delivered (calibrated) against the strongest baseline calibrated alike: calibrated_*
        "raw_test_loss": pooled.get("test_loss"),
        "skill": pooled.get("skill"),
        "best_baseline": pooled.get("best_baseline"),
        "test_up_share": pooled.get("up_share"),
        "by_instrument": test,
    }
    e, lag = eval_cfg, int(eval_cfg.execution_lag)
    judged, evaluation, results = evaluate(
        table, schema.target_kind, e.stride, e.strategy, e.cost_bps, lag
    )
    if apart is not None:  # the names the model forecast without having seen them
        names = [str(series.names[g]) for g in unseen if series.names[g] in test]
        headline[UNSEEN] = {"names": names} | apart | scored_apart(table, names, e.stride)
    strategy = strategy_summary(results, e.strategy, e.cost_bps, pooled.get("best_baseline"), lag)
    summary = {
        "metrics": headline | judged,
        "baselines": baselines,
        "evaluation": evaluation,
        "strategy": strategy,
    }
    equity = equity_curves(results, pooled.get("best_baseline"))
    found = judged_book(table, schema.target_kind, eval_cfg)
    if found is not None:
        summary["book"] = plain(found)
    return Judged(table, summary, equity, found)


def _calibrated(
    datasets: dict[str, WindowDataset],
    schema: DataSchema,
    pred: np.ndarray,
    quantiles: list[float],
    strongest: np.ndarray | None,
    predict: Predict | None,
    calibrate: tuple[str, Calibrate] | None,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """The delivered forecasts' test loss, and where a calibration and a strongest baseline
    are given, that baseline calibrated alike: its test loss and the calibrated skill, 1 - the
    model's loss / the baseline's; and the strongest baseline's forecasts for the table
    (calibrated where they could be, else `strongest` as it is)."""
    actual = window_facts(datasets["test"], schema).actual
    q = np.asarray(quantiles)

    def loss(forecasts: np.ndarray) -> float | None:
        return float(pinball_per_quantile(forecasts, actual, q).mean()) if len(actual) else None

    out: dict[str, Any] = {"calibrated_test_loss": loss(pred)}
    if calibrate is None or strongest is None or predict is None:
        return out, strongest
    name, how = calibrate
    theirs = forecast_all(predict, datasets[name], schema.target_kind, "baselines: calibrate")
    forecasts = how(theirs, strongest)
    out["calibrated_baseline_test_loss"] = loss(forecasts)
    mine, base = out["calibrated_test_loss"], out["calibrated_baseline_test_loss"]
    out["calibrated_skill"] = 1 - mine / base if mine is not None and base else None
    return out, forecasts
