"""The cross-sectional book: it earns a planted cross-sectional signal and nothing on noise, trades
`execution_lag` bars after the forecast, holds what its weights say on a panel of staggered
listings, pays for its turnover, and sees the signal's decay by horizon."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from foxhunt.evaluation.book import (
    Panel,
    applies,
    book,
    deciles,
    judged_book,
    plain,
    run_book,
    weights,
)
from foxhunt.evaluation.strategy import horizon_one

T0 = np.datetime64("2024-01-01", "ns").astype(np.int64)
DAY = 86_400 * 10**9


def cfg(**kw):
    base = {"book": "auto", "book_top": 0.2, "book_weights": "equal", "execution_lag": 1}
    return SimpleNamespace(**(base | {"book_cost_bps": 10.0} | kw))


def panel_table(
    returns: np.ndarray, forecast: np.ndarray, h2: np.ndarray | None = None
) -> pa.Table:
    """A forecast table of `returns` [dates, names] (the realised next-bar return of each
    origin) and median `forecast` [dates, names] at horizon 1 (NaN: no bar), and with `h2` the
    horizon-2 forecasts of the return after it."""
    d, n = returns.shape
    utc = pa.timestamp("ns", tz="UTC")
    tables = []
    for h, f, r in ((1, forecast, returns), (2, h2, np.roll(returns, -1, axis=0))):
        if f is None:
            continue
        at, name = np.nonzero(np.isfinite(f) & np.isfinite(r))
        origin = T0 + DAY * at
        tables.append(
            pa.table(
                {
                    "instrument": pa.array([f"N{i:03d}" for i in name], pa.string()),
                    "origin_time": pa.array(origin, utc),
                    "horizon": pa.array(np.full(len(at), h, np.int32)),
                    "target_time": pa.array(origin + h * DAY, utc),
                    "q0.1": f[at, name] - 0.01,
                    "q0.5": f[at, name],
                    "q0.9": f[at, name] + 0.01,
                    "actual": r[at, name],
                    "naive": np.zeros(len(at)),
                    "target_scale": np.ones(len(at)),
                }
            )
        )
    return pa.concat_tables(tables)


def planted(seed: int = 0, dates: int = 400, names: int = 30, signal: float = 0.3):
    """Returns with a common market move, each name's own noise, and a forecast correlated
    `signal` with each name's move against the market (the cross-sectional part)."""
    rng = np.random.default_rng(seed)
    own = rng.normal(0, 0.01, (dates, names))
    returns = rng.normal(0, 0.01, (dates, 1)) + own
    forecast = signal * own + np.sqrt(1 - signal**2) * rng.normal(0, 0.01, (dates, names))
    return returns, forecast


def test_the_book_earns_a_planted_cross_sectional_signal_and_nothing_on_noise():
    returns, forecast = planted()
    lag0 = cfg(execution_lag=0, book_cost_bps=0.0)
    found = book(panel_table(returns, forecast), "return", lag0)
    assert found["model"]["sharpe"] > 5 and found["model"]["gross_sharpe"] > 5
    noise = np.random.default_rng(1).normal(size=returns.shape)
    found = book(panel_table(returns, noise), "return", lag0)
    assert abs(found["model"]["sharpe"]) < 2.5  # ~1.6 years of dates: a t of 2 at most by chance
    ranks = deciles(Panel.of(horizon_one(panel_table(returns, forecast), "return")))
    assert ranks == sorted(ranks) and ranks[-1] > 0 > ranks[0]  # the deciles in order


def test_the_book_trades_execution_lag_bars_after_the_forecast():
    """A forecast that knows its own bar's next return earns it at lag 0, nothing at lag 1
    (the returns do not persist): the lag moves the trade, not the forecast."""
    returns, _ = planted()
    table = panel_table(returns, returns)
    now = book(table, "return", cfg(execution_lag=0, book_cost_bps=0.0))["model"]
    later = book(table, "return", cfg(execution_lag=1, book_cost_bps=0.0))["model"]
    assert now["sharpe"] > 20 and abs(later["sharpe"]) < 2.5
    assert later["dates"] == now["dates"] - 1


def test_each_date_holds_the_top_and_bottom_names_in_weights_that_sum_as_said():
    """Staggered listings: names list and delist (NaN forecasts) over the dates; each date's
    k = max(1, floor(top x names present)) longs sum to +1/2, its shorts to -1/2, the longs
    being the highest forecasts; risk weights lean to the quieter names."""
    rng = np.random.default_rng(2)
    returns, forecast = planted(dates=120, names=23)
    returns[:, :5] *= 4  # five loud names
    for i in range(23):  # listed from a date, delisted at another
        start, end = rng.integers(0, 40), rng.integers(80, 121)
        forecast[:start, i] = forecast[end:, i] = np.nan
        returns[:start, i] = returns[end:, i] = np.nan
    p = Panel.of(horizon_one(panel_table(returns, forecast), "return"))
    w = weights(p, 0.2, "equal")
    for d in range(len(p.dates)):
        have = np.flatnonzero(np.isfinite(p.forecast[d]))
        k = max(1, int(np.floor(0.2 * len(have))))
        longs, shorts = np.flatnonzero(w[d] > 0), np.flatnonzero(w[d] < 0)
        if len(have) < 2:
            assert not w[d].any()
            continue
        assert len(longs) == len(shorts) == k
        assert set(longs) == set(have[np.argsort(p.forecast[d, have])[-k:]])
        np.testing.assert_allclose([w[d, longs].sum(), w[d, shorts].sum()], [0.5, -0.5])
        assert not (w[d, ~np.isfinite(p.forecast[d])]).any()
    risk = weights(p, 0.5, "risk")
    late = slice(60, None)  # every name has a volatility by then
    loud = np.abs(risk[late, :5])[risk[late, :5] != 0].mean()
    quiet = np.abs(risk[late, 5:])[risk[late, 5:] != 0].mean()
    assert loud < quiet / 2


def test_the_book_pays_its_turnover():
    returns, forecast = planted(dates=60, names=10)
    p = Panel.of(horizon_one(panel_table(returns, forecast), "return"))
    w = weights(p, 0.2, "equal")
    free, costed = run_book(p, w, 1, 0.0), run_book(p, w, 1, 25.0)
    held = np.vstack([np.zeros((1, w.shape[1])), w[:-1]])
    turnover = np.abs(np.diff(held, axis=0, prepend=0)).sum(axis=1)[1:]
    np.testing.assert_allclose(free["net"] - costed["net"], 25e-4 * turnover)
    assert costed["turnover"] == pytest.approx(turnover.mean())
    steady = np.tile(np.arange(10.0), (60, 1))  # the same ranking every date: one trade in
    same = run_book(
        p, weights(Panel(p.dates, p.names, steady, p.returns, p.variance), 0.2, "equal"), 1, 0
    )
    assert same["turnover"] * same["dates"] == pytest.approx(1.0)


def test_the_long_short_ic_decays_where_the_signal_does():
    returns, forecast = planted()
    noise = np.random.default_rng(3).normal(size=returns.shape)
    found = book(panel_table(returns, forecast, h2=noise), "return", cfg())
    by_h = {row["horizon"]: row for row in found["ic_by_horizon"]}
    assert by_h[1]["mode"] == "cross_section" and by_h[1]["rank_ic_t"] > 10
    assert abs(by_h[2]["rank_ic_t"]) < 3
    assert "best_baseline" not in found and found["market"]["dates"] == len(returns)


def test_the_book_is_for_panels_and_summary_json_gets_plain_figures():
    returns, forecast = planted(dates=50, names=4)
    table = panel_table(returns, forecast)
    assert judged_book(table, "return", cfg()) is None  # auto: 4 names are no cross-section
    assert not applies(cfg(book="none"), 100) and applies(cfg(book="cross_section"), 2)
    found = judged_book(table, "return", cfg(book="cross_section"))
    assert {"time_ns", "net"} <= set(found["model"])
    flat = plain(found)
    assert "net" not in flat["model"] and flat["model"]["sharpe"] == found["model"]["sharpe"]
