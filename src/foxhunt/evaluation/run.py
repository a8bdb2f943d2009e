"""A training run's forecasts evaluated: calibrated on the validation windows, the test's judged
beside the baselines on the same windows (`judge`), the validation's traded by the costed
strategy, and summary.json's headline metrics. Pure: the caller (`foxhunt.app.train.phases`)
runs the model over the splits and writes the files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt.data.schema import DataSchema
from foxhunt.data.windows import WindowDataset
from foxhunt.errors import DataError
from foxhunt.evaluation.calibration import Calibration, calibrate_run, calibration_set
from foxhunt.evaluation.forecasts import forecast_table, window_facts
from foxhunt.evaluation.judge import Judged, judge
from foxhunt.evaluation.stats import pinball_per_quantile
from foxhunt.evaluation.strategy import backtest_strategy


@dataclass
class RunEvaluation:
    summary: dict[str, Any]  # summary.json's metrics, baselines, evaluation, strategy, calibration
    calibration: Calibration  # what predict applies to the model's forecasts
    judged: Judged  # test_forecasts.parquet's table and the equity curves to plot


def evaluate_run(
    datasets: dict[str, WindowDataset],
    schema: DataSchema,
    val_pred: np.ndarray,
    test_pred: np.ndarray,
    model_crossing: float | None,
    quantiles: list[float],
    calibration_cfg: Any,
    eval_cfg: Any,
    seed: int,
) -> RunEvaluation:
    """The model's forecasts [windows, H, Q] (normalized) of the validation and test windows:
    calibrated on the validation's (`foxhunt.evaluation.calibration`), the test's delivered
    forecasts judged beside the baselines, the model's own (`test_pred`) beside them;
    `model_crossing` is the share of the model's steps whose quantiles crossed."""
    calibration, pred, calibrated = calibrate_run(
        calibration_cfg, datasets, schema, val_pred, test_pred, quantiles
    )
    calibrated["crossing_rate_model"] = model_crossing

    def alike(theirs_val: np.ndarray, theirs_test: np.ndarray) -> np.ndarray:
        """A baseline's test forecasts calibrated as the model's were."""
        return calibrate_run(calibration_cfg, datasets, schema, theirs_val, theirs_test, quantiles)[
            1
        ]

    calibrate = (calibration_set(datasets), alike) if calibration.offsets else None
    judged = judge(datasets, schema, pred, quantiles, eval_cfg, seed, test_pred, calibrate)
    return RunEvaluation({**judged.summary, "calibration": calibrated}, calibration, judged)


def validation_returns(
    dataset: WindowDataset,
    schema: DataSchema,
    pred: np.ndarray,
    quantiles: list[float],
    eval_cfg: Any,
) -> dict[str, Any]:
    """The costed strategy's portfolio on the forecasts `pred` of the validation windows."""
    table = forecast_table(dataset, schema, pred, quantiles)
    return portfolio_returns(table, schema.target_kind, eval_cfg)


def portfolio_returns(table: pa.Table, target_kind: str, e: Any) -> dict[str, Any]:
    """The costed strategy's portfolio on a forecast table: its Sharpe ratio and per-bar net
    returns with their times (int64 ns), or {skipped: why} for a level that is no price."""
    try:
        result = backtest_strategy(
            table, str(e.strategy), e.cost_bps, target_kind, lag=int(e.execution_lag)
        )
    except DataError as why:
        return {"skipped": str(why)}
    times, net = result.portfolio_returns
    return {
        "sharpe": result.portfolio["sharpe"],
        "bars": len(net),
        "time_ns": times.tolist(),
        "net": net.tolist(),
    }


def quantile_loss(
    pred: np.ndarray, dataset: WindowDataset, schema: DataSchema, quantiles: list[float]
) -> float | None:
    """The test step's loss of the forecasts `pred` of `dataset`'s windows (normalized)."""
    if not len(pred):
        return None
    actual = window_facts(dataset, schema).actual
    return float(pinball_per_quantile(pred, actual, np.asarray(quantiles)).mean())


def headline_metrics(val_loss: float | None, tested: dict[str, float]) -> dict[str, Any]:
    """summary.json's `metrics` from the best validation loss and the test step's metrics."""
    return {
        "val_loss": val_loss,
        "test_loss": tested.get("test_loss"),
        "test_mae": tested.get("test_mae"),
        "test_directional_accuracy": tested.get("test_directional_accuracy"),
        "test_coverage": tested.get("test_coverage"),
        "baseline_test_loss": tested.get("test_baseline_loss"),
    }
