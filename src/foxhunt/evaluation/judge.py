"""A trained model's test forecasts judged as a quant would: beside every baseline on the same
windows (`baselines`), pooled and per instrument, then the IC, calibration and a costed strategy
(`quality`), and on a panel the cross-sectional book (`book`). Pure: the caller runs the model
and writes the files."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt.data.schema import DataSchema
from foxhunt.data.windows import WindowDataset
from foxhunt.evaluation.baselines import score_baselines
from foxhunt.evaluation.book import judged_book, plain
from foxhunt.evaluation.forecasts import forecast_table
from foxhunt.evaluation.quality import equity_curves, evaluate, scored_apart, strategy_summary

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


def judge(
    datasets: dict[str, WindowDataset],
    schema: DataSchema,
    pred: np.ndarray,
    quantiles: list[float],
    eval_cfg: Any,
    seed: int,
    raw: np.ndarray | None = None,
) -> Judged:
    """Score `pred` ([test windows, H, Q], normalized, in the test dataset's order: the
    forecasts delivered, calibrated) beside the baselines fit on the training windows; `raw`,
    the model's own before calibration, goes into the table beside them. The headline
    metrics: the skill against the strongest baseline, its name, the base rate of up moves,
    the same per instrument, the IC and probabilistic scores."""
    started = time.perf_counter()
    series = datasets["test"].series
    unseen = series.unseen(schema.groups)
    baselines, test, strongest = score_baselines(
        datasets,
        schema.target_kind,
        quantiles,
        series.names if schema.groups else [],
        pred,
        seed,
        {UNSEEN: unseen},
    )
    pooled = test.pop(None, {})
    apart = test.pop(("apart", UNSEEN), None)
    best = None if strongest is None else (pooled["best_baseline"], strongest)
    table = forecast_table(datasets["test"], schema, pred, quantiles, best, raw)
    log.info("baselines: fit and scored in %.1f s", time.perf_counter() - started)
    headline = {
        # the forecasts delivered (calibrated), which the skill and by_instrument score; the
        # model's own is test_loss, the test step's
        "calibrated_test_loss": pooled.get("test_loss"),
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
