"""A costed trading strategy on a run's forecasts (`forecasts.forecast_table`), per instrument
and as an equal-risk portfolio, beside buy-and-hold and the best baseline's, by the same code.

Conventions, in one place so the report can quote them:

- One bar per row, traded `lag` bars after the forecast (`eval.execution_lag`, default 1): the
  forecast made at the close of origin bar t is traded at the close of bar t + lag and held
  over the next bar, so the position is set by the forecast of that bar, horizon lag + 1, and
  earns its realised return r_{t+lag+1}. At lag 0 that is the bar after the forecast's own
  close, a trade no one can make at the price the forecast was made from. For a return target
  the bar's return is the target itself (`actual - naive`, naive being 0): a log return, as
  foxhunt's `ohlcv` target is, for which p_t * r is the usual small-move approximation of the
  position's return. For a level target (a price) it is the simple return of the bar, the move
  from the level at its start (the realised one; the forecast's own median for the forecast)
  over that level; a level that is not positive has no such return (DataError). The forecast
  quantiles become returns the same way. An instrument's rows are taken in origin-time order as
  consecutive bars (the test windows step one bar at a time). `actual` is the raw target, never
  a transformed one (`forecasts.forecast_table`): the bars' returns are raw returns.
- A relative target (the table's `target_transform` xs_demean or xs_rank) says how a name will
  do against the others, so the strategy trades it against the market (`hedged`): the name
  against the equal-weighted basket of the names with a bar at its origin, earning r_i -
  mean_t(r) of raw returns, both legs paid (turnover counts twice). The position is the
  forecast's sign (or `scaled`), the same in any transform: a rank is never traded as a return.
- Positions (`positions`): `sign` is one unit long or short in the direction of the median
  forecast (flat where it is exactly zero); `scaled` is the median divided by the predicted
  spread (the outermost quantiles' distance), clipped to [-1, 1]: a forecast that is confident
  relative to its own uncertainty gets a larger position, one whose move is small against its
  spread a small one. A spread of zero (a forecast certain of its median) is a full position.
- Costs: `cost_bps` x 1e-4 per unit of turnover |p_t - p_{t-1}| (twice for a hedged trade), the
  first position from flat; the last one is not closed (buy-and-hold pays one entry cost).
- The equity curve is the running sum of the net per-bar returns, not compounded: the log
  wealth of buy-and-hold on a log-return target, a fixed notional otherwise. `net_return` is its
  last value, `max_drawdown` its largest fall from its running peak (the start, 0, included), a
  positive number in return units.
- Sharpe: the mean over the sample standard deviation (ddof 1) of the net per-bar returns, times
  the square root of the bars per year, which is estimated per series from its own origin times,
  (bars - 1) / their span in years of 365.25 days, unless given: it counts the bars a series
  really has, so intraday bars with overnight and weekend gaps and daily bars without weekends
  both come out right (as far as the test period is a typical stretch of the calendar). None
  where undefined (under 2 bars, or no variation).
- `hit_rate`: of the bars with a nonzero position and a nonzero return, the share where their
  signs agree. `turnover` is the mean per bar.
- The portfolio ("pooled"): at each origin time the instruments' net returns weighted in
  proportion to 1 / their ex-ante volatility, the weights summing to one over the instruments
  present. The volatility is the square root of an EWMA (decay 0.94) of the squared returns
  realised by the origin (row t sees the returns of its instrument's earlier rows only). It is
  seeded with the mean of the first WARMUP squared returns; until then, and while it is zero,
  the instrument is out of the portfolio, so the portfolio starts WARMUP bars in. The weights'
  own drift is not costed (each instrument's sleeve pays its own turnover). Its hit rate pools
  the hits of its instruments' bars.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt.errors import ConfigError, DataError
from foxhunt.evaluation.forecasts import quantile_column, quantile_levels, transform_of
from foxhunt.files import write_atomic

log = logging.getLogger(__name__)
RULES = ("sign", "scaled")
EWMA_DECAY = 0.94  # RiskMetrics' lambda, as the volatility-scaled baseline
WARMUP = 20  # returns an instrument needs before it has a volatility (EWMA span ~17 bars)
YEAR_NS = 365.25 * 86_400 * 10**9
UNNAMED = "series"  # the name of one unnamed series (forecast_table's null instrument)
PORTFOLIO = "pooled"
# what summary.json gets
HEADLINE = ("sharpe", "sharpe_se", "max_drawdown", "turnover", "net_return")

Stats = dict[str, float | int | None]


@dataclass
class Bars:
    """Horizon-1 forecasts as returns, one row per instrument and origin bar (sorted on
    construction: by instrument, then origin time)."""

    instrument: np.ndarray  # [n] str
    time_ns: np.ndarray  # [n] int64 origin times
    forecast: np.ndarray  # [n, Q] forecast returns over the next bar, at `quantiles`
    quantiles: np.ndarray  # [Q] ascending
    returns: np.ndarray  # [n] the realised returns over the next bar
    # the data.target_transform the forecasts are in: not none, the strategy is `hedged`
    transform: str = "none"

    def __post_init__(self) -> None:
        self.instrument = np.asarray(self.instrument).astype(str)
        self.time_ns = np.asarray(self.time_ns, dtype=np.int64)
        if not len(self.time_ns):
            raise DataError("no horizon-1 forecasts to trade")
        self.quantiles = np.asarray(self.quantiles, dtype=np.float64)
        forecast = np.asarray(self.forecast, dtype=np.float64).reshape(len(self.time_ns), -1)
        q_order = np.argsort(self.quantiles)
        order = np.lexsort((self.time_ns, self.instrument))
        self.instrument, self.time_ns = self.instrument[order], self.time_ns[order]
        self.quantiles, self.forecast = self.quantiles[q_order], forecast[order][:, q_order]
        self.returns = np.asarray(self.returns, dtype=np.float64)[order]
        repeated = int(np.sum((np.diff(self.time_ns) == 0) & ~self.first[1:]))
        if repeated:
            raise DataError(
                f"{repeated} repeated (instrument, origin_time) rows at horizon 1: pool folds "
                "whose test periods do not overlap"
            )
        if not np.isfinite(self.returns).all() or not np.isfinite(self.forecast).all():
            raise DataError("the forecasts or the realised returns hold NaN or infinite values")

    @cached_property
    def first(self) -> np.ndarray:
        """[n] whether a row is its instrument's first (computed once, #68)."""
        return np.r_[True, self.instrument[1:] != self.instrument[:-1]]

    def segments(self) -> dict[str, slice]:
        """Each instrument's rows."""
        starts = np.flatnonzero(self.first)
        ends = np.r_[starts[1:], len(self.instrument)]
        return {str(self.instrument[s]): slice(s, e) for s, e in zip(starts, ends, strict=True)}

    def median(self) -> np.ndarray:
        """[n] the forecast at the quantile nearest 0.5."""
        return self.forecast[:, int(np.argmin(np.abs(self.quantiles - 0.5)))]


def held_bars(table: pa.Table, target_kind: str, lag: int = 0) -> Bars:
    """The bar a forecast is held over, `lag` bars after its origin (horizon lag + 1), as
    returns, one row per instrument and origin: the quantile columns `q<level>` and the realised
    move `actual - naive`; for a level target the move from the level at the bar's start (the
    origin's `naive` at horizon 1, else the realised level and the median forecast at horizon
    `lag`) divided by that level (see module)."""
    if target_kind not in ("return", "level"):
        raise ValueError(f"target_kind must be 'return' or 'level', not {target_kind!r}")
    h = lag + 1
    rows = _horizon(table, h)
    if not rows.num_rows:
        raise DataError(
            f"no horizon-{h} forecasts to trade {lag} bar(s) after the forecast "
            f"(eval.execution_lag={lag} needs data.prediction_length >= {h})"
        )
    quantiles = np.array(quantile_levels(rows))
    if not len(quantiles):
        raise DataError("the forecast table has no quantile columns (q0.5, ...)")
    forecast = np.column_stack([rows[quantile_column(q)].to_numpy() for q in quantiles])
    actual = rows["actual"].to_numpy().astype(np.float64)
    start = rows["naive"].to_numpy().astype(np.float64)
    forecast_start = start
    if target_kind == "level" and h > 1:
        before = _horizon(table, h - 1)
        start = before["actual"].to_numpy().astype(np.float64)
        median = min(quantile_levels(before), key=lambda q: abs(q - 0.5))
        forecast_start = before[quantile_column(median)].to_numpy().astype(np.float64)
    forecast, actual = forecast - forecast_start[:, None], actual - start
    if target_kind == "level":
        if (start <= 0).any() or (forecast_start <= 0).any():
            raise DataError(
                f"{int((start <= 0).sum())} horizon-{h} rows start from a level of zero or "
                "below: no simple return, so no strategy (use a return target)"
            )
        forecast, actual = forecast / forecast_start[:, None], actual / start
    return Bars(
        instrument=pc.fill_null(rows["instrument"], UNNAMED).to_numpy(zero_copy_only=False),
        time_ns=rows["origin_time"].cast(pa.int64()).to_numpy(),
        forecast=forecast,
        quantiles=quantiles,
        returns=actual,
        transform=transform_of(table),
    )


def hedged(bars: Bars) -> Bars:
    """`bars` with each return less the equal-weighted mean return of the names with a bar at
    its origin time: a name traded against the market (see module)."""
    _, at = np.unique(bars.time_ns, return_inverse=True)
    market = np.bincount(at, bars.returns) / np.bincount(at)
    return replace(bars, returns=bars.returns - market[at])


def horizon_one(table: pa.Table, target_kind: str) -> Bars:
    """The horizon-1 bars (`held_bars` at lag 0): a forecast held over the bar it forecasts."""
    return held_bars(table, target_kind, 0)


def _horizon(table: pa.Table, h: int) -> pa.Table:
    """A forecast table's horizon-`h` rows by instrument, then origin time (two horizons'
    rows line up)."""
    rows = table.filter(pc.equal(table["horizon"], h))
    return rows.sort_by([("instrument", "ascending"), ("origin_time", "ascending")])


def positions(median: np.ndarray, lower: np.ndarray, upper: np.ndarray, rule: str) -> np.ndarray:
    """The position held over the next bar, in [-1, 1], from the forecast's median move and
    its outer quantiles (`sign` or `scaled`, see module)."""
    median = np.asarray(median, dtype=np.float64)
    if rule == "sign":
        return np.sign(median)
    if rule != "scaled":
        raise ConfigError(f"eval.strategy must be one of {', '.join(RULES)}, not {rule!r}")
    spread = np.asarray(upper, dtype=np.float64) - np.asarray(lower, dtype=np.float64)
    # a forecast with no spread is certain of its median: a full position (the clip below)
    ratio = np.divide(median, spread, out=np.sign(median), where=spread > 0)
    return np.clip(ratio, -1.0, 1.0)


def sharpe(returns: np.ndarray, bars_per_year: float | None) -> float | None:
    """The annualised Sharpe ratio of per-bar returns: mean / std (ddof 1) x sqrt(bars/year)."""
    returns = np.asarray(returns, dtype=np.float64)
    if len(returns) < 2 or bars_per_year is None:
        return None
    std = float(np.std(returns, ddof=1))
    if std <= 1e-12 * float(np.mean(np.abs(returns))):  # constant, up to rounding
        return None
    return float(np.mean(returns) / std * np.sqrt(bars_per_year))


def sharpe_se(annual: float | None, bars: int, bars_per_year: float | None) -> float | None:
    """The standard error of an annualised Sharpe ratio from `bars` i.i.d. returns (Lo 2002):
    sqrt((1 + SR^2 / 2) / bars) per bar, annualised alike. A short test period of fast bars
    has a large one: two weeks of 5-minute bars give about 5 whatever the strategy."""
    if annual is None or bars_per_year is None or bars < 2:
        return None
    per_bar = annual / np.sqrt(bars_per_year)
    return float(np.sqrt((1 + per_bar**2 / 2) / bars * bars_per_year))


def equity(returns: np.ndarray) -> np.ndarray:
    """The equity curve of per-bar returns: their running sum (not compounded)."""
    return np.cumsum(np.asarray(returns, dtype=np.float64))


def max_drawdown(returns: np.ndarray) -> float:
    """The largest fall of the equity curve from its running peak, the start (0) included."""
    curve = np.r_[0.0, equity(returns)]
    return float(np.max(np.maximum.accumulate(curve) - curve))


def bars_per_year(time_ns: np.ndarray) -> float | None:
    """Bars per year of a series with these (sorted, distinct) times: (bars - 1) / span."""
    if len(time_ns) < 2 or time_ns[-1] <= time_ns[0]:
        return None
    return float((len(time_ns) - 1) / ((time_ns[-1] - time_ns[0]) / YEAR_NS))


def ewma_variance(returns: np.ndarray) -> np.ndarray:
    """[n] each row's ex-ante variance from the returns of the rows before it: NaN for the
    first WARMUP rows, then the mean of their squares, updated with decay EWMA_DECAY."""
    squared = np.asarray(returns, dtype=np.float64) ** 2
    out = np.full(len(squared), np.nan)
    if len(squared) <= WARMUP:
        return out
    var = float(np.mean(squared[:WARMUP]))
    out[WARMUP] = var
    for t in range(WARMUP + 1, len(squared)):  # a recursion: one pass in plain floats
        var = EWMA_DECAY * var + (1 - EWMA_DECAY) * float(squared[t - 1])
        out[t] = var
    return out


def risk_weights(bars: Bars) -> np.ndarray:
    """[n] each row's weight in the equal-risk portfolio: 1 / ex-ante volatility, normalised to
    sum to one over the instruments with a volatility at its origin time (0: out of it)."""
    var = np.full(len(bars.returns), np.nan)
    for rows in bars.segments().values():
        var[rows] = ewma_variance(bars.returns[rows])
    raw = np.zeros_like(var)
    has = np.nan_to_num(var) > 0
    raw[has] = 1 / np.sqrt(var[has])
    _, at = np.unique(bars.time_ns, return_inverse=True)
    total = np.bincount(at, raw)[at]
    return np.divide(raw, total, out=np.zeros_like(raw), where=total > 0)


@dataclass
class StrategyResult:
    """A backtest's statistics per instrument and for the portfolio, its equity curves and its
    per-bar ledger."""

    per_instrument: dict[str, Stats]
    portfolio: Stats
    # name (an instrument, or PORTFOLIO) -> (origin times ns, the equity once that bar is in)
    curves: dict[str, tuple[np.ndarray, np.ndarray]]
    ledger: dict[str, np.ndarray] = field(repr=False)  # per row: position, turnover, gross...
    # the portfolio's (origin times ns, net return of that bar): a tuning study's DSR and PBO
    portfolio_returns: tuple[np.ndarray, np.ndarray] = field(repr=False)
    hedged: bool = False  # each name traded against the market, both legs costed (`hedged`)

    def to_dict(self) -> dict[str, Any]:
        """Every statistic, JSON-ready: {portfolio: stats, per_instrument: {name: stats}}."""
        return {"portfolio": self.portfolio, "per_instrument": self.per_instrument}

    def summary(self) -> dict[str, Any]:
        """The headline statistics (HEADLINE) for summary.json: {pooled: {...}, by_instrument:
        {name: {...}}}."""
        return {
            "pooled": {k: self.portfolio[k] for k in HEADLINE},
            "by_instrument": {
                name: {k: s[k] for k in HEADLINE} for name, s in self.per_instrument.items()
            },
        }


def _stats(
    time_ns: np.ndarray,
    gross: np.ndarray,
    cost: np.ndarray,
    turnover: np.ndarray,
    hits: int,
    calls: int,
    per_year: float | None,
) -> Stats:
    per_year = per_year if per_year is not None else bars_per_year(time_ns)
    net = gross - cost
    some = len(net) > 0
    annual = sharpe(net, per_year)
    return {
        "sharpe": annual,
        "sharpe_se": sharpe_se(annual, len(net), per_year),
        "gross_sharpe": sharpe(gross, per_year),
        "max_drawdown": max_drawdown(net) if some else None,
        "turnover": float(np.mean(turnover)) if some else None,
        "net_return": float(np.sum(net)),
        "gross_return": float(np.sum(gross)),
        "cost": float(np.sum(cost)),
        "hit_rate": hits / calls if calls else None,
        "bars": len(net),
        "bars_per_year": per_year,
    }


def run_positions(
    bars: Bars,
    position: np.ndarray,
    cost_bps: float,
    bars_per_year: float | None = None,
    legs: int = 1,
) -> StrategyResult:
    """Hold `position` [n] (a row of `bars` each) for one bar, pay `cost_bps` per unit of
    turnover of each of its `legs` (2: a name and its hedge, which trades as much): the
    statistics per instrument and of the equal-risk portfolio (see module)."""
    position = np.asarray(position, dtype=np.float64)
    previous = np.r_[0.0, position[:-1]]
    previous[bars.first] = 0.0  # an instrument's first position is bought from flat
    turnover = legs * np.abs(position - previous)
    gross = position * bars.returns
    cost = cost_bps * 1e-4 * turnover
    net = gross - cost
    called = (position != 0) & (bars.returns != 0)
    hit = called & (np.sign(position) == np.sign(bars.returns))
    per_instrument, curves = {}, {}
    for name, rows in bars.segments().items():
        per_instrument[name] = _stats(
            bars.time_ns[rows],
            gross[rows],
            cost[rows],
            turnover[rows],
            int(hit[rows].sum()),
            int(called[rows].sum()),
            bars_per_year,
        )
        curves[name] = (bars.time_ns[rows], equity(net[rows]))
    weight = risk_weights(bars)
    held = weight > 0
    times, at = np.unique(bars.time_ns[held], return_inverse=True)

    def pooled(x: np.ndarray) -> np.ndarray:
        return np.bincount(at, (weight * x)[held], len(times))

    portfolio = _stats(
        times,
        pooled(gross),
        pooled(cost),
        pooled(turnover),
        int(hit[held].sum()),
        int(called[held].sum()),
        bars_per_year,
    )
    portfolio_net = pooled(net)
    curves[PORTFOLIO] = (times, equity(portfolio_net))
    ledger = {
        "position": position,
        "turnover": turnover,
        "gross": gross,
        "cost": cost,
        "net": net,
        "weight": weight,
    }
    returns = (times, portfolio_net)
    return StrategyResult(per_instrument, portfolio, curves, ledger, returns, legs > 1)


def _bars(forecasts: pa.Table | Bars, target_kind: str | None, lag: int) -> Bars:
    if isinstance(forecasts, Bars):
        return forecasts
    if target_kind is None:
        raise ValueError("a forecast table needs its target_kind ('return' or 'level')")
    return held_bars(forecasts, target_kind, lag)


def backtest_strategy(
    forecasts: pa.Table | Bars,
    rule: str,
    cost_bps: float,
    target_kind: str | None = None,
    bars_per_year: float | None = None,
    lag: int = 0,
) -> StrategyResult:
    """The strategy `rule` (`sign` or `scaled`) on a forecast table's bars held `lag` bars
    after the forecast (its `target_kind` needed) or on Bars, costed at `cost_bps` per unit of
    turnover; on forecasts of a relative target, each name against the market (`hedged`)."""
    bars = _bars(forecasts, target_kind, lag)
    position = positions(bars.median(), bars.forecast[:, 0], bars.forecast[:, -1], rule)
    if bars.transform == "none":
        return run_positions(bars, position, cost_bps, bars_per_year)
    return run_positions(hedged(bars), position, cost_bps, bars_per_year, legs=2)


def buy_and_hold(
    forecasts: pa.Table | Bars,
    cost_bps: float,
    target_kind: str | None = None,
    bars_per_year: float | None = None,
    lag: int = 0,
) -> StrategyResult:
    """One unit long in every instrument throughout (one entry cost each), on the same bars'
    raw returns, whatever the forecasts' target."""
    bars = _bars(forecasts, target_kind, lag)
    return run_positions(bars, np.ones(len(bars.returns)), cost_bps, bars_per_year)


def compare(
    forecasts: pa.Table | Bars,
    rule: str,
    cost_bps: float,
    target_kind: str | None = None,
    baseline: pa.Table | Bars | None = None,
    bars_per_year: float | None = None,
    lag: int = 0,
) -> dict[str, StrategyResult]:
    """{strategy, buy_and_hold, and with `baseline` (another set of forecasts of the same
    bars, e.g. the best baseline's) baseline_strategy}: each a StrategyResult, traded `lag` bars
    after the forecast."""
    bars = _bars(forecasts, target_kind, lag)
    out = {
        "strategy": backtest_strategy(bars, rule, cost_bps, bars_per_year=bars_per_year),
        "buy_and_hold": buy_and_hold(bars, cost_bps, bars_per_year=bars_per_year),
    }
    if baseline is not None:
        other = _bars(baseline, target_kind, lag)
        same = (
            np.array_equal(other.instrument, bars.instrument)
            and np.array_equal(other.time_ns, bars.time_ns)
            and np.allclose(other.returns, bars.returns, rtol=1e-9, atol=0)
        )
        if not same:
            raise ValueError("the baseline's forecasts are not of the same bars as the model's")
        out["baseline_strategy"] = backtest_strategy(
            other, rule, cost_bps, bars_per_year=bars_per_year
        )
    return out


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("matplotlib is not installed: no equity curve (pip install matplotlib)")
        return False
    return True


def plot_equity(
    curves: dict[str, tuple[np.ndarray, np.ndarray]],
    path: str | Path,
    title: str = "Equity curves (cumulative net return, not compounded)",
) -> bool:
    """A PNG of equity curves {label: (times ns, equity)}; False (and no file) without
    matplotlib."""
    if not _have_matplotlib():
        return False
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for label, (time_ns, curve) in curves.items():
        ax.plot(np.asarray(time_ns, dtype="datetime64[ns]"), curve, label=label, lw=1)
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("cumulative net return")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend()
    ax.set_title(title, loc="left")
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    return True
