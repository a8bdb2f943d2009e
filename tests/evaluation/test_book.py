"""The cross-sectional book: it earns a planted cross-sectional signal and nothing on noise, ranks
on the forecast of the bar it holds `execution_lag` bars after the forecast, holds what its
weights say on a panel of staggered listings, pays for its turnover, keeps dates with few names
flat, can rank by a forecast's score, and sees the signal's decay by horizon in returns."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from foxhunt.config import PANEL_NAMES, EvalConfig
from foxhunt.errors import ConfigError, DataError, FoxhuntError
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
from foxhunt.evaluation.strategy import Bars, horizon_one

T0 = np.datetime64("2024-01-01", "ns").astype(np.int64)
DAY = 86_400 * 10**9


def cfg(**kw):
    base = {"book": "auto", "book_top": 0.2, "book_weights": "equal", "execution_lag": 1}
    base |= {"book_rank": "forecast", "book_min_names": 2}
    return SimpleNamespace(**(base | {"cost_bps": 10.0} | kw))


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
    lag0 = cfg(execution_lag=0, cost_bps=0.0)
    found = book(panel_table(returns, forecast), "return", lag0)
    assert found["model"]["sharpe"] > 5 and found["model"]["gross_sharpe"] > 5
    noise = np.random.default_rng(1).normal(size=returns.shape)
    found = book(panel_table(returns, noise), "return", lag0)
    assert abs(found["model"]["sharpe"]) < 2.5  # ~1.6 years of dates: a t of 2 at most by chance
    ranks = deciles(Panel.of(horizon_one(panel_table(returns, forecast), "return")))
    assert ranks == sorted(ranks) and ranks[-1] > 0 > ranks[0]  # the deciles in order


def horizons_table(returns: np.ndarray, forecasts: list[np.ndarray]) -> pa.Table:
    """A forecast table of every origin d whose horizons 1..H all have a bar: at horizon h the
    median `forecasts[h - 1][d]` and the realised return of bar d + h, `returns[d + h - 1]`."""
    h = len(forecasts)
    tables = []
    for step, f in enumerate(forecasts, start=1):
        one = panel_table(returns[step - 1 : len(returns) - h + step], f[: len(returns) - h + 1])
        tables.append(one.set_column(2, "horizon", pa.array(np.full(one.num_rows, step, np.int32))))
    return pa.concat_tables(tables)


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_the_book_ranks_on_the_forecast_of_the_bar_it_holds(lag):
    """A forecast equal to the realised return of exactly the bar held (horizon lag + 1) earns
    the known top-minus-bottom return at every lag; one of the bar before or after it earns
    about nothing (the returns do not persist)."""
    returns, _ = planted(dates=300, names=20)
    h = lag + 2
    shift = {"exact": 0, "before": -1, "after": 1}
    found = {}
    for name, k in shift.items():
        forecasts = [
            np.roll(returns, -(step - 1) - (k if step == lag + 1 else 0), axis=0)
            for step in range(1, h + 1)
        ]
        table = horizons_table(returns, forecasts)
        found[name] = book(table, "return", cfg(execution_lag=lag, cost_bps=0.0))
    held = returns[lag : len(returns) - h + 1 + lag]  # the bar each origin's book holds
    ranked = np.sort(held, axis=1)
    expected = 0.5 * ranked[:, -4:].mean(axis=1) - 0.5 * ranked[:, :4].mean(axis=1)
    exact = found["exact"]["model"]
    assert found["exact"]["horizon"] == lag + 1
    np.testing.assert_allclose(exact["gross_return"], expected.sum())
    assert exact["gross_sharpe"] > 20
    for name in ("before", "after"):
        assert abs(found[name]["model"]["gross_sharpe"]) < 3, name


def test_a_lag_beyond_the_horizons_has_no_book():
    returns, forecast = planted(dates=50, names=12)
    found = judged_book(panel_table(returns, forecast), "return", cfg(execution_lag=1))
    assert "eval.execution_lag=1 needs data.prediction_length >= 2" in found["skipped"]


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
    free, costed = run_book(p, w, 0.0), run_book(p, w, 25.0)
    turnover = np.abs(np.diff(w, axis=0, prepend=0)).sum(axis=1)
    np.testing.assert_allclose(free["net"] - costed["net"], 25e-4 * turnover)
    assert costed["turnover"] == pytest.approx(turnover.mean())
    steady = np.tile(np.arange(10.0), (60, 1))  # the same ranking every date: one trade in
    same = run_book(
        p, weights(Panel(p.dates, p.names, steady, p.returns, p.variance), 0.2, "equal"), 0
    )
    assert same["turnover"] * same["dates"] == pytest.approx(1.0)


def test_a_date_with_fewer_names_than_the_minimum_holds_nothing():
    returns, forecast = planted(dates=40, names=12)
    forecast[:20, 4:] = np.nan  # the first 20 dates: 4 names
    p = Panel.of(horizon_one(panel_table(returns, forecast), "return"))
    w = weights(p, 0.2, "equal", min_names=10)
    assert not w[:20].any() and (np.abs(w[20:]).sum(axis=1) == pytest.approx(1.0))
    assert np.abs(weights(p, 0.2, "equal", min_names=2)[:20]).sum(axis=1) == pytest.approx(1.0)


def test_ranked_by_score_a_loud_name_does_not_fill_the_tails_by_its_volatility():
    """Five loud names forecast 10x wider moves with 10x wider spreads: ranked by forecast they
    crowd the tails; ranked by score (median over spread) they hold their share (5 of 20)."""
    rng = np.random.default_rng(4)
    dates, names = 400, 20
    loud = np.r_[np.full(5, 10.0), np.ones(names - 5)]
    median = (rng.normal(size=(dates, names)) * 0.01 * loud).ravel()
    half = np.tile(0.01 * loud, dates)
    bars = Bars(
        instrument=np.tile([f"N{i:02d}" for i in range(names)], dates),
        time_ns=np.repeat(T0 + DAY * np.arange(dates), names),
        forecast=np.column_stack([median - half, median, median + half]),
        quantiles=np.array([0.1, 0.5, 0.9]),
        returns=rng.normal(size=dates * names) * 0.01,
    )
    share = {}
    for rank in ("forecast", "score"):
        w = weights(Panel.of(bars, rank), 0.2, "equal")
        share[rank] = (w[:, :5] != 0).sum() / (w != 0).sum()
    assert share["forecast"] > 0.5 and 0.15 < share["score"] < 0.35


def test_the_long_short_ic_of_a_level_ranks_returns_not_price_moves():
    """Prices from 10 to 5000 and a forecast right about each date's market move and nothing
    else: across names its returns rank like noise. Raw price moves would rank by price, the
    market's sign deciding the order of both, and show an IC near 1 from no skill."""
    rng = np.random.default_rng(5)
    dates, names = 200, 10
    level = np.geomspace(10, 5000, names)
    market = rng.choice([-0.02, 0.02], size=(dates, 1))
    r = market + rng.normal(0, 0.002, (dates, names))
    forecast = market + rng.normal(0, 0.002, (dates, names))
    table = panel_table(level * r, level * forecast)
    naive = np.tile(level, dates)  # the table's rows: by date, then name
    for c in ("q0.1", "q0.5", "q0.9", "actual", "naive"):
        i = table.schema.get_field_index(c)
        table = table.set_column(i, c, pa.array(table[c].to_numpy() + naive))
    by_h = book(table, "level", cfg(execution_lag=0, book="cross_section"))["ic_by_horizon"]
    assert abs(by_h[0]["rank_ic"]) < 0.1


def test_the_long_short_ic_decays_where_the_signal_does():
    returns, forecast = planted()
    noise = np.random.default_rng(3).normal(size=returns.shape)
    found = book(panel_table(returns, forecast, h2=noise), "return", cfg(execution_lag=0))
    by_h = {row["horizon"]: row for row in found["ic_by_horizon"]}
    assert by_h[1]["mode"] == "cross_section" and by_h[1]["rank_ic_t"] > 10
    assert abs(by_h[2]["rank_ic_t"]) < 3
    assert "best_baseline" not in found and found["market"]["dates"] == len(returns)


def test_the_book_is_for_panels_and_summary_json_gets_plain_figures():
    returns, forecast = planted(dates=50, names=4)
    table = panel_table(returns, forecast)
    assert "books a panel of at least" in judged_book(table, "return", cfg())["skipped"]  # auto
    assert judged_book(panel_table(returns[:, :1], forecast[:, :1]), "return", cfg()) is None
    assert not applies(cfg(book="none"), 100) and applies(cfg(book="cross_section"), 2)
    found = judged_book(table, "return", cfg(book="cross_section", execution_lag=0))
    assert {"time_ns", "net"} <= set(found["model"])
    one = panel_table(returns[:, :1], forecast[:, :1])  # asked for on one instrument: said why
    assert (
        "needs at least 2 instruments"
        in judged_book(one, "return", cfg(book="cross_section"))["skipped"]
    )
    flat = plain(found)
    assert "net" not in flat["model"] and flat["model"]["sharpe"] == found["model"]["sharpe"]


def test_a_panel_of_seven_names_says_why_it_has_no_book():
    """One threshold of a panel (PANEL_NAMES) for eval.book=auto and eval.book_min_names'
    default: summary.json's `book` of a 7-name panel says why it has none, never a Sharpe of
    None with no reason."""
    returns, forecast = planted(dates=60, names=7)
    table = panel_table(returns, forecast)
    defaults = EvalConfig()
    assert defaults.book == "auto" and defaults.book_min_names == PANEL_NAMES > 7
    auto = cfg(execution_lag=0, book_min_names=defaults.book_min_names)
    assert plain(judged_book(table, "return", auto)) == {
        "skipped": f"eval.book=auto books a panel of at least {PANEL_NAMES} names, the test "
        "has 7: eval.book=cross_section books it"
    }
    asked = judged_book(table, "return", with_book(auto, "cross_section"))
    assert asked == {
        "skipped": f"no date has eval.book_min_names={PANEL_NAMES} names with a forecast (at "
        "most 7): lower eval.book_min_names to book this panel"
    }
    fewer = judged_book(table, "return", with_book(auto, "cross_section", book_min_names=7))
    assert "skipped" not in fewer and fewer["model"]["sharpe"] is not None


def with_book(e, book: str, **kw):
    return SimpleNamespace(**(vars(e) | {"book": book} | kw))


def test_a_bad_config_value_surfaces_where_a_data_problem_is_skipped():
    """Errors by kind: the book's `except DataError` (a book the data cannot give: skipped)
    does not catch a ConfigError, which surfaces as its one line."""
    assert issubclass(ConfigError, FoxhuntError) and not issubclass(ConfigError, DataError)
    returns, forecast = planted(dates=60, names=12)
    table = panel_table(returns, forecast)  # horizon 1 alone
    short = judged_book(table, "return", cfg(book="cross_section", execution_lag=1))
    assert "no horizon-2 forecasts" in short["skipped"]  # a data problem: skipped
    bad = cfg(book="cross_section", execution_lag=0, book_rank="bogus")
    with pytest.raises(ConfigError, match="eval.book_rank must be one of forecast, score"):
        judged_book(table, "return", bad)


@pytest.mark.parametrize("transform", ["xs_demean", "xs_rank"])
def test_on_a_relative_target_the_book_and_the_market_trade_raw_returns(transform):
    """A model trained on each date's returns less their mean (or their ranks): its table's
    `actual` is the raw return, the target beside it. The market is the names' equal-weighted
    raw return (not the mean of a demeaned one, zero by construction), and the book earns the
    raw returns of the names it ranks top and bottom by the forecast, never a rank."""
    returns, forecast = planted(dates=200, names=10)
    returns = returns + 2e-3  # a market that rises
    target = returns - returns.mean(axis=1, keepdims=True)
    if transform == "xs_rank":
        target = np.argsort(np.argsort(returns, axis=1), axis=1) - 4.5
    table = panel_table(returns, forecast)  # horizon 1, one row a date and name in order
    table = table.append_column(f"actual_{transform}", pa.array(target.ravel()))
    table = table.append_column("target_transform", pa.array([transform] * table.num_rows))
    found = book(table, "return", cfg(execution_lag=0, cost_bps=0.0))
    np.testing.assert_allclose(found["market"]["gross_return"], returns.mean(axis=1).sum())
    assert found["market"]["gross_return"] > 0.3
    order = np.argsort(forecast, axis=1, kind="stable")  # k = 2 of 10 names a side
    top = np.take_along_axis(returns, order[:, -2:], axis=1)
    bottom = np.take_along_axis(returns, order[:, :2], axis=1)
    expected = 0.5 * top.mean(axis=1) - 0.5 * bottom.mean(axis=1)
    np.testing.assert_allclose(found["model"]["gross_return"], expected.sum())
