"""A cross-sectional book on a panel's horizon-1 forecasts, as a quant trades a panel: at each
date the instruments are ranked by their median forecast, the top fraction held long and the
bottom fraction short, traded `lag` bars after the forecast and charged for turnover.

Conventions (shared with `foxhunt.evaluation.strategy`, whose `horizon_one` gives the returns):

- A date is an origin time. The forecast made at date d sets the position held over the bar
  after date d + lag: with lag 1 (the default for a panel) the book trades one bar after the
  close the forecast was made from, so no forecast earns the move of the bar it was made on.
- Ranks: each date's instruments with a forecast, n of them; k = max(1, floor(top x n)) long
  and k short (n >= 2k; a date with fewer than 2 instruments holds nothing). Ties keep the
  instruments' order by name.
- Weights: `equal`, 1 / (2k) each side's name (gross exposure 1, net 0); `risk`, each side's
  names in proportion to 1 / their ex-ante volatility (`strategy.ewma_variance`, from returns
  realised before the date), each side summing to 1/2. A name without a volatility yet is left
  out of a risk-weighted side.
- Returns: gross_d = sum_i w_{d-lag, i} r_{d, i}, the realised next-bar return of each name
  (a name with no bar at the date earns 0); turnover_d = sum_i |w_d - w_{d-1}|, the first from
  flat; net = gross - cost_bps x 1e-4 x turnover. Sharpe is annualised by the dates per year
  (`strategy.bars_per_year`); `net_return` is the sum of net returns (not compounded).
- Beside it: the same book on the best baseline's forecasts, and an equal-weight long book of
  every name (the market), costed alike.
- The long-short IC: each date's rank correlation of the forecast with the realised return
  across the names (`stats.ic`, its Newey-West t), at every horizon (its decay); the deciles:
  the mean realised return of each date's forecast decile, pooled over dates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt.errors import DataError
from foxhunt.evaluation import stats
from foxhunt.evaluation.forecasts import quantile_column, quantile_levels
from foxhunt.evaluation.quality import baseline_table
from foxhunt.evaluation.strategy import (
    Bars,
    bars_per_year,
    ewma_variance,
    horizon_one,
    max_drawdown,
    plot_equity,
    sharpe,
)

WEIGHTS = ("equal", "risk")
DECILES = 10
BOOK_MIN_NAMES = 5  # eval.book=auto: a panel of at least this many instruments gets the book
BOOK_PLOT = "book.png"


@dataclass
class Panel:
    """Horizon-1 bars as [dates, names] matrices (NaN where a name has no bar at a date)."""

    dates: np.ndarray  # [D] int64 origin times
    names: list[str]
    forecast: np.ndarray  # [D, N] the median forecast return
    returns: np.ndarray  # [D, N] the realised next-bar return
    variance: np.ndarray  # [D, N] the ex-ante variance (NaN before a name's warm-up)

    @classmethod
    def of(cls, bars: Bars) -> Panel:
        dates, at = np.unique(bars.time_ns, return_inverse=True)
        names, col = np.unique(bars.instrument, return_inverse=True)
        shape = (len(dates), len(names))
        forecast, returns, variance = (
            np.full(shape, np.nan),
            np.full(shape, np.nan),
            np.full(shape, np.nan),
        )
        forecast[at, col], returns[at, col] = bars.median(), bars.returns
        for rows in bars.segments().values():
            variance[at[rows], col[rows]] = ewma_variance(bars.returns[rows])
        return cls(dates, [str(n) for n in names], forecast, returns, variance)


def weights(panel: Panel, top: float, scheme: str) -> np.ndarray:
    """[D, N] each date's long-short weights from its forecasts (see the module)."""
    if scheme not in WEIGHTS:
        raise ValueError(f"book weights must be one of {', '.join(WEIGHTS)}, got {scheme!r}")
    out = np.zeros_like(panel.forecast)
    for d, f in enumerate(panel.forecast):
        have = np.flatnonzero(np.isfinite(f))
        k = max(1, int(np.floor(top * len(have))))
        if len(have) < 2 * k:
            continue
        ranked = have[np.argsort(f[have], kind="stable")]
        for side, sign in ((ranked[-k:], 1.0), (ranked[:k], -1.0)):
            raw = np.ones(len(side))
            if scheme == "risk":
                var = panel.variance[d, side]
                raw = np.where(np.nan_to_num(var) > 0, 1 / np.sqrt(np.where(var > 0, var, 1)), 0)
            if raw.sum() > 0:
                out[d, side] = sign * 0.5 * raw / raw.sum()
    return out


def run_book(panel: Panel, w: np.ndarray, lag: int, cost_bps: float) -> dict[str, Any]:
    """The book of weights `w` [D, N] traded `lag` dates later: its per-date returns and stats."""
    held = np.zeros_like(w)
    held[lag:] = w[: len(w) - lag] if lag else w
    gross = np.sum(held * np.nan_to_num(panel.returns), axis=1)
    turnover = np.abs(np.diff(held, axis=0, prepend=0)).sum(axis=1)
    net = gross - cost_bps * 1e-4 * turnover
    per_year = bars_per_year(panel.dates)
    live = slice(lag, None)  # the dates a position can be held
    return {
        "sharpe": sharpe(net[live], per_year),
        "gross_sharpe": sharpe(gross[live], per_year),
        "net_return": float(net[live].sum()),
        "gross_return": float(gross[live].sum()),
        "max_drawdown": max_drawdown(net[live]),
        "turnover": float(turnover[live].mean()) if len(turnover[live]) else 0.0,
        "dates": int(len(net[live])),
        "time_ns": panel.dates[live],
        "net": net[live],
    }


def market(panel: Panel, cost_bps: float) -> dict[str, Any]:
    """An equal-weight long book of every name with a bar (the panel's buy-and-hold)."""
    have = np.isfinite(panel.returns).astype(float)
    count = have.sum(axis=1, keepdims=True)
    w = np.divide(have, count, out=np.zeros_like(have), where=count > 0)
    return run_book(panel, w, 0, cost_bps)


def deciles(panel: Panel) -> list[float | None]:
    """The mean realised return of each forecast decile (lowest first), each date ranked alone
    and pooled over the dates with at least DECILES names."""
    sums, counts = np.zeros(DECILES), np.zeros(DECILES)
    for f, r in zip(panel.forecast, panel.returns, strict=True):
        have = np.flatnonzero(np.isfinite(f) & np.isfinite(r))
        if len(have) < DECILES:
            continue
        rank = np.argsort(np.argsort(f[have], kind="stable"))
        bucket = rank * DECILES // len(have)
        np.add.at(sums, bucket, r[have])
        np.add.at(counts, bucket, 1)
    return [float(s / c) if c else None for s, c in zip(sums, counts, strict=True)]


def ic_by_horizon(table: pa.Table, lags: int) -> list[dict[str, Any]]:
    """Each horizon's long-short rank IC by date (the forecast's median against the actual)."""
    median = quantile_column(min(quantile_levels(table), key=lambda q: abs(q - 0.5)))
    out = []
    horizon = table["horizon"].to_numpy()
    for h in np.unique(horizon):
        rows = horizon == h
        s = stats.ic(
            table[median].to_numpy()[rows] - table["naive"].to_numpy()[rows],
            table["actual"].to_numpy()[rows] - table["naive"].to_numpy()[rows],
            table["origin_time"].cast(pa.int64()).to_numpy()[rows],
            lags=lags,
            rank=True,
        )
        out.append(
            {"horizon": int(h), "rank_ic": s["mean"], "rank_ic_t": s["t"], "mode": s["mode"]}
        )
    return out


def applies(e: Any, names: int) -> bool:
    """Whether eval.book asks for the cross-sectional book of a panel of `names` instruments."""
    choice = str(getattr(e, "book", "none"))
    return names >= (BOOK_MIN_NAMES if choice == "auto" else 2) and choice != "none"


def judged_book(table: pa.Table, target_kind: str, e: Any) -> dict[str, Any] | None:
    """The book of a test forecast table (and of its best baseline's columns), when eval.book
    applies; {skipped: why} for a level that is no price."""
    names = len(set(table["instrument"].to_pylist()))
    if not applies(e, names):
        return None
    try:
        return book(table, target_kind, e, baseline_table(table, quantile_levels(table)))
    except DataError as why:
        return {"skipped": str(why)}


def book(
    table: pa.Table,
    target_kind: str,
    e: Any,
    baseline: pa.Table | None = None,
) -> dict[str, Any]:
    """summary.json's `book`: the model's cross-sectional book by eval's top, weights, lag and
    book cost, the same book on the best baseline's forecasts, the market, the long-short IC by
    horizon and the forecast deciles. Plain JSON but each book's `time_ns` and `net` (the
    equity curve's), which the caller plots and drops."""
    panel = Panel.of(horizon_one(table, target_kind))
    top, scheme, lag, cost = (
        float(e.book_top),
        str(e.book_weights),
        int(e.execution_lag),
        float(e.book_cost_bps),
    )
    out = {"top": top, "weights": scheme, "execution_lag": lag, "cost_bps": cost}
    out["names"] = len(panel.names)
    out["model"] = run_book(panel, weights(panel, top, scheme), lag, cost)
    if baseline is not None:
        theirs = Panel.of(horizon_one(baseline, target_kind))
        out["best_baseline"] = run_book(theirs, weights(theirs, top, scheme), lag, cost)
    out["market"] = market(panel, cost)
    h = int(table["horizon"].to_numpy().max()) if table.num_rows else 1
    out["ic_by_horizon"] = ic_by_horizon(table, lags=h)
    out["deciles"] = deciles(panel)
    return out


def curves(found: dict[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The books' equity curves (times, cumulative net return) by label, for the plot."""
    labels = {"model": "model's book", "best_baseline": "best baseline's book", "market": "market"}
    return {
        labels[k]: (found[k]["time_ns"], np.cumsum(found[k]["net"])) for k in labels if k in found
    }


def plot_book(found: dict[str, Any], path: Any) -> bool:
    """book.png: the books' equity curves (`strategy.plot_equity`'s figure)."""
    return plot_equity(curves(found), path, "Cross-sectional book (cumulative net return)")


def plain(found: dict[str, Any]) -> dict[str, Any]:
    """`book`'s result without the per-date arrays: what summary.json holds."""
    return {
        k: {x: y for x, y in v.items() if x not in ("time_ns", "net")} if isinstance(v, dict) else v
        for k, v in found.items()
    }
