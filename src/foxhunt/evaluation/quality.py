"""What a quant reads from a forecast table (`forecasts.forecast_table`, a run's test forecasts
or a backtest's pooled folds): the information coefficient and rank IC of the median with HAC
standard errors, hit rates against the base rate, probabilistic quality and calibration
(`stats`), and the costed strategy beside buy-and-hold and the best baseline's (`strategy`).

The IC and the hit rates are counted over every `stride`-th window of each instrument
(`eval.stride`, default the prediction length: windows whose targets do not overlap), with
Newey-West lags of the prediction length over the target times. The probabilistic scores are
over every window, normalized by the target's scale as test_loss is."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt.errors import DataError
from foxhunt.evaluation import stats
from foxhunt.evaluation.forecasts import quantile_column, quantile_levels, target_column
from foxhunt.evaluation.strategy import PORTFOLIO, StrategyResult, compare

log = logging.getLogger(__name__)
BASELINE_PREFIX = "baseline_"
EQUITY_PLOT = "equity.png"


def _column(table: pa.Table, name: str, h: int) -> np.ndarray:
    """[windows, H] a per-row column of a window-major table (H rows per window)."""
    return table[name].to_numpy(zero_copy_only=False).reshape(-1, h)


@dataclass(frozen=True)
class _Windows:
    """A forecast table's windows as arrays: [windows, H] per step, [windows, H, Q] forecasts."""

    h: int  # steps per window
    quantiles: list[float]
    q: np.ndarray  # [Q] the quantile levels
    pred: np.ndarray  # the model's quantile forecasts
    actual: np.ndarray
    scale: np.ndarray  # the target's, per row
    norm_pred: np.ndarray  # pred and actual in units of the scale, as test_loss is
    norm_y: np.ndarray
    names: np.ndarray  # [windows] the instrument ("series" for an unnamed one)
    target_time: np.ndarray  # int64 nanoseconds
    median: np.ndarray  # the forecast move: the median less the naive forecast
    realised: np.ndarray  # the realised move

    @classmethod
    def of(cls, table: pa.Table) -> _Windows:
        h = int(pc.max(table["horizon"]).as_py())
        quantiles = quantile_levels(table)
        q = np.asarray(quantiles)
        pred = np.stack([_column(table, quantile_column(x), h) for x in quantiles], axis=-1)
        # the model's target, which the quantiles forecast (the strategy trades raw `actual`)
        actual, naive = _column(table, target_column(table), h), _column(table, "naive", h)
        names = _column(table, "instrument", h)[:, 0]
        names = np.where(names == None, "series", names).astype(str)  # noqa: E711 - numpy's null
        scale = _column(table, "target_scale", h)
        return cls(
            h=h,
            quantiles=quantiles,
            q=q,
            pred=pred,
            actual=actual,
            scale=scale,
            norm_pred=pred / scale[..., None],
            norm_y=actual / scale,
            names=names,
            target_time=_column(table, "target_time", h).astype("datetime64[ns]").astype(np.int64),
            median=pred[..., int(np.argmin(np.abs(q - 0.5)))] - naive,
            realised=actual - naive,
        )

    def strided(self, stride: int | None) -> np.ndarray:
        """[windows] every stride-th window of an instrument, by its position among the
        instrument's windows (in time)."""
        _, group = np.unique(self.names, return_inverse=True)
        position = np.empty(len(group), np.int64)
        for g in np.unique(group):
            rows = np.flatnonzero(group == g)
            position[rows] = np.argsort(np.argsort(self.target_time[rows, 0], kind="stable"))
        return stats.strided(position, group, stride or self.h)

    def ics(self, rows: np.ndarray, steps: slice | int) -> dict[str, Any]:
        """The IC and rank IC of the median over the windows `rows` at `steps`, with their HAC
        standard errors and t statistics."""
        f = self.median[rows][:, steps]
        r, t = self.realised[rows][:, steps], self.target_time[rows][:, steps]
        found = {}
        for key, rank in (("ic", False), ("rank_ic", True)):
            s = stats.ic(f.ravel(), r.ravel(), t.ravel(), lags=self.h, rank=rank)
            found |= {key: s["mean"], f"{key}_se": s["se"], f"{key}_t": s["t"]}
        return found | {"ic_mode": s["mode"], "ic_n": s["n"]}


def evaluate(
    table: pa.Table,
    target_kind: str,
    stride: int | None,
    rule: str,
    cost_bps: float,
    lag: int = 0,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(headline metrics for summary.json's `metrics`, the details (per horizon, instrument and
    quantile, the PIT histogram) for its `evaluation`, the strategy results by name, or
    {skipped: why} for a level target that is no price)."""
    w = _Windows.of(table)
    metrics, evaluation = _scores(w, w.strided(stride), stride)
    baseline = _against_baseline(table, w, evaluation["by_horizon"])
    # a signal at one horizon disappears in a pool of them: the first and the last, apart
    rows = evaluation["by_horizon"]
    metrics["horizons"] = [
        {k: row.get(k) for k in ("horizon", "ic", "ic_t", "rank_ic", "skill")}
        for row in rows[:1] + rows[1:][-1:]
    ]
    try:
        results = compare(table, rule, cost_bps, target_kind, baseline=baseline, lag=lag)
    except DataError as why:  # a level that is not a price (no returns): no strategy
        log.info("no strategy: %s", why)
        results = {"skipped": str(why)}
    return metrics, evaluation, results


def scored_apart(table: pa.Table, names: list[str], stride: int | None) -> dict[str, Any]:
    """The IC of the instruments `names` alone over every stride-th window (`evaluate`'s), at
    horizon 1 and over every step: {ic_h1, ic_h1_t, ic, ic_t, ic_mode}."""
    w = _Windows.of(table)
    rows = np.flatnonzero(w.strided(stride) & np.isin(w.names, names))
    first, every = w.ics(rows, 0), w.ics(rows, slice(None))
    return {
        "ic_h1": first["ic"],
        "ic_h1_t": first["ic_t"],
        "ic": every["ic"],
        "ic_t": every["ic_t"],
        "ic_mode": first["ic_mode"],
    }


def _scores(
    w: _Windows, keep: np.ndarray, stride: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the headline metrics: pooled IC, hit rates, CRPS, Winkler; the details: by horizon,
    by instrument, by quantile, coverage and PIT) over the windows `keep` (the probabilistic
    scores over all)."""
    q, norm_pred, norm_y = w.q, w.norm_pred, w.norm_y
    kept = np.flatnonzero(keep)
    hits = stats.hit_rates(w.median[kept], w.realised[kept])
    alpha = 1 - (q[-1] - q[0])
    metrics = w.ics(kept, slice(None)) | {
        "hit_rate": hits["hit_rate"],
        "majority_rate": hits["majority_rate"],
        "crps": stats.crps_from_quantiles(norm_pred, norm_y, q),
        "winkler": stats.winkler_score(norm_pred[..., 0], norm_pred[..., -1], norm_y, alpha),
    }
    evaluation = {
        "stride": int(stride or w.h),
        "windows": len(w.median),
        "windows_scored": len(kept),
        "by_horizon": [
            {
                "horizon": k + 1,
                **w.ics(kept, k),
                **stats.hit_rates(w.median[kept, k], w.realised[kept, k]),
            }
            for k in range(w.h)
        ],
        "by_instrument": {
            name: w.ics(np.flatnonzero(keep & (w.names == name)), slice(None))
            for name in dict.fromkeys(w.names)
        },
        "quantiles": w.quantiles,
        "pinball_by_quantile": stats.pinball_per_quantile(norm_pred, norm_y, q).tolist(),
        # observed share below each quantile forecast, per horizon: the calibration curve
        "coverage_by_horizon": stats.coverage(w.pred, w.actual).tolist(),
        "pit": stats.pit_histogram(w.pred, w.actual, q).tolist(),
    }
    return metrics, evaluation


def baseline_table(table: pa.Table, quantiles: Any) -> pa.Table | None:
    """The best baseline's forecasts (its `baseline_q...` columns) under the model's column
    names, or None when the table has none."""
    theirs = {BASELINE_PREFIX + quantile_column(x): quantile_column(x) for x in quantiles}
    if not set(theirs) <= set(table.column_names):
        return None
    rest = table.drop_columns(list(theirs.values()))
    return rest.rename_columns([theirs.get(c, c) for c in rest.column_names])


def _against_baseline(
    table: pa.Table, w: _Windows, by_horizon: list[dict[str, Any]]
) -> pa.Table | None:
    """The best baseline's forecasts under the model's column names, or None when the table has
    none; adds each horizon's loss, baseline_loss and skill to `by_horizon`, in place."""
    baseline = baseline_table(table, w.quantiles)
    if baseline is None:
        return None
    theirs = [BASELINE_PREFIX + quantile_column(x) for x in w.quantiles]
    their_pred = np.stack([_column(table, c, w.h) for c in theirs], axis=-1) / w.scale[..., None]
    ours = stats.pinball_by_horizon(w.norm_pred, w.norm_y, w.q)
    for row, loss, best in zip(
        by_horizon, ours, stats.pinball_by_horizon(their_pred, w.norm_y, w.q), strict=True
    ):
        row |= {"loss": loss, "baseline_loss": best, "skill": 1 - loss / best if best else None}
    return baseline


def strategy_summary(
    results: dict[str, StrategyResult],
    rule: str,
    cost_bps: float,
    baseline: str | None,
    lag: int = 0,
) -> dict[str, Any]:
    """summary.json's `strategy`: the model's (pooled: the equal-risk portfolio, and
    by_instrument), buy-and-hold's and the best baseline's, by the same rule and costs; or
    {skipped: why}."""
    if "skipped" in results:
        return {"skipped": results["skipped"]}
    own = results["strategy"].summary()
    out = {"rule": rule, "cost_bps": cost_bps, "execution_lag": lag, **own["pooled"]}
    out["hedged"] = results["strategy"].hedged  # each name against the market (a relative target)
    out |= {"hit_rate": results["strategy"].portfolio["hit_rate"]}
    out |= {"by_instrument": own["by_instrument"]}
    out["buy_and_hold"] = results["buy_and_hold"].summary()["pooled"]
    if "baseline_strategy" in results:
        theirs = results["baseline_strategy"].summary()["pooled"]
        out["best_baseline"] = {"name": baseline, **theirs}
    return out


def equity_curves(
    results: dict[str, StrategyResult], baseline: str | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The portfolios' equity curves by label: the model's strategy, buy-and-hold and the best
    baseline's strategy."""
    labels = {
        "strategy": "model",
        "buy_and_hold": "buy and hold",
        "baseline_strategy": f"best baseline ({baseline})",
    }
    return {
        labels[k]: r.curves[PORTFOLIO]
        for k, r in results.items()
        if isinstance(r, StrategyResult) and PORTFOLIO in r.curves
    }
