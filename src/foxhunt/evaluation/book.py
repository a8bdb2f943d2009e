"""A cross-sectional book on a panel's forecasts, as a quant trades a panel: at each date the
instruments are ranked by their forecast of the bar the book will hold, the top fraction held
long and the bottom fraction short, traded `lag` bars after the forecast and charged for
turnover.

Conventions (shared with `foxhunt.evaluation.strategy`, whose `held_bars` gives the returns):

- A date is an origin time d. The book trades at the close of bar d + lag (`eval.execution_lag`,
  default 1: one bar after the close the forecast was made from) and holds the position over
  the next bar, (d + lag, d + lag + 1]. It ranks on the forecast of that bar: horizon lag + 1
  (`book.horizon` in summary.json), never a forecast of a bar already gone. A table whose
  horizons stop short of lag + 1 has no book (DataError).
- Ranks (`eval.book_rank`): `forecast`, the median forecast return of the held bar; `score`,
  that median over its own spread (the quantiles nearest 0.9 and 0.1), so a loud name's wide
  forecast does not fill the tails by its volatility alone. Each date's instruments with a
  forecast, n of them; k = max(1, floor(top x n)) long and k short; a date with fewer than
  max(`eval.book_min_names`, 2k) names holds nothing. Ties keep the names' order.
- Which runs get a book: `eval.book=cross_section` any of 2 names or more; `auto` a panel of at
  least PANEL_NAMES (`foxhunt.config`'s, the one threshold of a panel: the same makes auto's
  target market-neutral and is `eval.book_min_names`' default); `none` none. A run that was to
  have a book and has none says why in `book.skipped`: too few names for auto, one instrument,
  no date with `eval.book_min_names` names, horizons short of the bar held.
- Weights: `equal`, 1 / (2k) each side's name (gross exposure 1, net 0); `risk`, each side's
  names in proportion to 1 / their ex-ante volatility (`strategy.ewma_variance` of the held
  bars' returns realised before the trade), each side summing to 1/2. A name without a
  volatility yet is left out of a risk-weighted side.
- Returns: gross_d = sum_i w_{d, i} r_{d, i}, r_{d, i} the realised return of the bar held
  (a name without it earns 0), raw (the table's `actual`) whatever target the model
  forecast: under data.target_transform the ranking key is the forecast of the transformed
  target, which orders the names as well, and is never taken for a return;
  turnover_d = sum_i |w_d - w_{d-1}|, the first from flat; net = gross - cost_bps x 1e-4 x
  turnover (`eval.cost_bps`, the strategy's too). Sharpe is annualised by the dates per year
  (`strategy.bars_per_year`); `net_return` is the sum of net returns (not compounded).
- Beside it: the same book on the best baseline's forecasts, and an equal-weight long book of
  every name's raw return (the market) over the same bars, costed alike.
- The long-short IC: at every horizon h (its decay), each date's rank correlation across the
  names of the forecast move to h with the realised one (`stats.ic`, its Newey-West t), both
  as returns for a level target (the move over the origin's level), as the book trades them;
  the deciles: the mean realised return of the held bar in each date's ranking decile, pooled
  over dates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt.config import PANEL_NAMES
from foxhunt.errors import ConfigError, DataError
from foxhunt.evaluation import stats
from foxhunt.evaluation.forecasts import quantile_column, quantile_levels
from foxhunt.evaluation.quality import baseline_table
from foxhunt.evaluation.strategy import (
    Bars,
    bars_per_year,
    ewma_variance,
    held_bars,
    max_drawdown,
    plot_equity,
    sharpe,
)

log = logging.getLogger(__name__)
WEIGHTS = ("equal", "risk")
RANKS = ("forecast", "score")
DECILES = 10
BOOK_PLOT = "book.png"


@dataclass
class Panel:
    """The held bars as [dates, names] matrices (NaN where a name has no bar at a date)."""

    dates: np.ndarray  # [D] int64 origin times
    names: list[str]
    forecast: np.ndarray  # [D, N] what the book ranks on (`eval.book_rank`)
    returns: np.ndarray  # [D, N] the realised return of the bar held
    variance: np.ndarray  # [D, N] the ex-ante variance (NaN before a name's warm-up)

    @classmethod
    def of(cls, bars: Bars, rank: str = "forecast") -> Panel:
        if rank not in RANKS:
            raise ConfigError(f"eval.book_rank must be one of {', '.join(RANKS)}, got {rank!r}")
        dates, at = np.unique(bars.time_ns, return_inverse=True)
        names, col = np.unique(bars.instrument, return_inverse=True)
        shape = (len(dates), len(names))
        forecast, returns, variance = (
            np.full(shape, np.nan),
            np.full(shape, np.nan),
            np.full(shape, np.nan),
        )
        forecast[at, col], returns[at, col] = _signal(bars, rank), bars.returns
        for rows in bars.segments().values():
            variance[at[rows], col[rows]] = ewma_variance(bars.returns[rows])
        return cls(dates, [str(n) for n in names], forecast, returns, variance)


def _signal(bars: Bars, rank: str) -> np.ndarray:
    """[n] the ranking key: the median, or the median over the q0.9 - q0.1 spread (a spread of
    zero: a median certain of itself ranks by its sign at the extreme)."""
    median = bars.median()
    if rank == "forecast":
        return median
    q = bars.quantiles
    lo, hi = (int(np.argmin(np.abs(q - level))) for level in (0.1, 0.9))
    spread = bars.forecast[:, hi] - bars.forecast[:, lo]
    return np.divide(median, spread, out=np.sign(median) * np.inf, where=spread > 0)


def weights(panel: Panel, top: float, scheme: str, min_names: int = 2) -> np.ndarray:
    """[D, N] each date's long-short weights from its ranking key (see the module)."""
    if scheme not in WEIGHTS:
        raise ConfigError(f"eval.book_weights must be one of {', '.join(WEIGHTS)}, got {scheme!r}")
    out = np.zeros_like(panel.forecast)
    for d, f in enumerate(panel.forecast):
        have = np.flatnonzero(np.isfinite(f))
        k = max(1, int(np.floor(top * len(have))))
        if len(have) < max(2 * k, min_names):
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


def run_book(panel: Panel, w: np.ndarray, cost_bps: float) -> dict[str, Any]:
    """The book of weights `w` [D, N], each date's held over its bar: per-date returns, stats."""
    gross = np.sum(w * np.nan_to_num(panel.returns), axis=1)
    turnover = np.abs(np.diff(w, axis=0, prepend=0)).sum(axis=1)
    net = gross - cost_bps * 1e-4 * turnover
    per_year = bars_per_year(panel.dates)
    return {
        "sharpe": sharpe(net, per_year),
        "gross_sharpe": sharpe(gross, per_year),
        "net_return": float(net.sum()),
        "gross_return": float(gross.sum()),
        "max_drawdown": max_drawdown(net),
        "turnover": float(turnover.mean()) if len(turnover) else 0.0,
        "dates": int(len(net)),
        "time_ns": panel.dates,
        "net": net,
    }


def market(panel: Panel, cost_bps: float) -> dict[str, Any]:
    """An equal-weight long book of every name with a bar (the panel's buy-and-hold)."""
    have = np.isfinite(panel.returns).astype(float)
    count = have.sum(axis=1, keepdims=True)
    w = np.divide(have, count, out=np.zeros_like(have), where=count > 0)
    return run_book(panel, w, cost_bps)


def deciles(panel: Panel) -> list[float | None]:
    """The mean realised return of each ranking decile (lowest first), each date ranked alone
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


def ic_by_horizon(table: pa.Table, target_kind: str) -> list[dict[str, Any]]:
    """Each horizon's long-short rank IC by date: the forecast's median move against the
    realised one, over the origin's level for a level target (the returns the book trades):
    its mean, ICIR (mean over standard deviation across dates), Newey-West t over h dates at
    horizon h (its moves overlap h - 1 dates) and dates."""
    median = quantile_column(min(quantile_levels(table), key=lambda q: abs(q - 0.5)))
    naive = table["naive"].to_numpy().astype(np.float64)
    base = naive if target_kind == "level" else np.ones_like(naive)
    forecast = (table[median].to_numpy() - naive) / base
    realised = (table["actual"].to_numpy() - naive) / base
    origin = table["origin_time"].cast(pa.int64()).to_numpy()
    horizon = table["horizon"].to_numpy()
    out = []
    for h in np.unique(horizon):
        rows = horizon == h
        s = stats.ic(forecast[rows], realised[rows], origin[rows], lags=int(h), rank=True)
        out.append(
            {
                "horizon": int(h),
                "rank_ic": s["mean"],
                "icir": s.get("icir"),
                "rank_ic_t": s["t"],
                "dates": s["n"],
                "mode": s["mode"],
            }
        )
    return out


def applies(e: Any, names: int) -> bool:
    """Whether eval.book asks for the cross-sectional book of a panel of `names` instruments."""
    choice = str(getattr(e, "book", "none"))
    return names >= (PANEL_NAMES if choice == "auto" else 2) and choice != "none"


def why_not(e: Any, names: int) -> str | None:
    """Why eval.book asks for a book that `names` instruments cannot give (`applies` false);
    None where it asks for none: eval.book=none, or auto on a single series."""
    choice = str(getattr(e, "book", "none"))
    if choice == "none" or (choice == "auto" and names < 2):
        return None
    if choice == "auto":
        return (
            f"eval.book=auto books a panel of at least {PANEL_NAMES} names, the test has "
            f"{names}: eval.book=cross_section books it"
        )
    return f"eval.book=cross_section needs at least 2 instruments, the test has {names}"


def judged_book(table: pa.Table, target_kind: str, e: Any) -> dict[str, Any] | None:
    """The book of a test forecast table (and of its best baseline's columns), when eval.book
    applies; {skipped: why}, said once in the log, where it was asked for and cannot be had
    (one instrument, a level that is no price, horizons short of the bar held)."""
    names = len(set(table["instrument"].to_pylist()))
    if not applies(e, names):
        why = why_not(e, names)
        if why is None:
            return None
        asked = str(getattr(e, "book", "none")) == "cross_section"  # auto: the default's reason
        log.log(logging.WARNING if asked else logging.INFO, "no cross-sectional book: %s", why)
        return {"skipped": why}
    try:
        return book(table, target_kind, e, baseline_table(table, quantile_levels(table)))
    except DataError as why:
        log.warning("no cross-sectional book: %s", why)
        return {"skipped": str(why)}


def book(
    table: pa.Table,
    target_kind: str,
    e: Any,
    baseline: pa.Table | None = None,
) -> dict[str, Any]:
    """summary.json's `book`: the model's cross-sectional book by eval's top, weights, rank,
    minimum names, lag and cost (ranked on horizon lag + 1, `horizon`), the same book on the
    best baseline's forecasts, the market, the long-short IC by horizon and the deciles. Plain
    JSON but each book's `time_ns` and `net` (the equity curve's), which the caller plots and
    drops. DataError where the forecasts do not reach the bar held."""
    lag, cost, rank = int(e.execution_lag), float(e.cost_bps), str(e.book_rank)
    panel = Panel.of(held_bars(table, target_kind, lag), rank)
    top, scheme, least = float(e.book_top), str(e.book_weights), int(e.book_min_names)
    out = {"top": top, "weights": scheme, "rank": rank, "min_names": least}
    out |= {"execution_lag": lag, "horizon": lag + 1, "cost_bps": cost}
    out["names"] = len(panel.names)
    most = int(np.isfinite(panel.forecast).sum(axis=1).max(initial=0))
    if most < max(least, 2):  # every date flat: no book, rather than a Sharpe of None
        raise DataError(
            f"no date has eval.book_min_names={least} names with a forecast (at most {most}): "
            "lower eval.book_min_names to book this panel"
        )
    out["model"] = run_book(panel, weights(panel, top, scheme, least), cost)
    if baseline is not None:
        theirs = Panel.of(held_bars(baseline, target_kind, lag), rank)
        out["best_baseline"] = run_book(theirs, weights(theirs, top, scheme, least), cost)
    out["market"] = market(panel, cost)
    out["ic_by_horizon"] = ic_by_horizon(table, target_kind)
    if baseline is not None:  # the same dates, the strongest baseline's median
        out["best_baseline_ic_by_horizon"] = ic_by_horizon(baseline, target_kind)
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
