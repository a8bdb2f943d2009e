"""The costed strategy: its statistics equal a hand computation, it loses its costs on noise and
earns a planted signal, its portfolio weights see no future, and buy-and-hold is what it says."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from foxhunt.errors import ConfigError, DataError
from foxhunt.evaluation.strategy import (
    PORTFOLIO,
    WARMUP,
    Bars,
    backtest_strategy,
    buy_and_hold,
    compare,
    held_bars,
    horizon_one,
    max_drawdown,
    plot_equity,
    positions,
    risk_weights,
    sharpe,
)

T0 = np.datetime64("2024-01-01T00:00", "ns").astype(np.int64)
FIVE_MIN = 5 * 60 * 10**9
Z = 1.2815515655446004  # the 0.9 quantile of a standard normal


def forecast_rows(
    instrument: str | None,
    median: np.ndarray,
    actual: np.ndarray,
    spread: float | np.ndarray = 1.0,
    naive: float | np.ndarray = 0.0,
    start: int = 0,
) -> pa.Table:
    """A forecast table (`forecasts.forecast_table`'s columns) of bars on a 5-minute grid: at
    horizon 1 the quantiles 0.1, 0.5, 0.9 around `median` and the realised `actual`; a
    horizon-2 row for every origin whose huge values would show if the strategy read them."""
    n = len(median)
    origin = T0 + FIVE_MIN * (start + np.arange(n))
    median = np.asarray(median, dtype=np.float64)
    half = np.broadcast_to(np.asarray(spread, dtype=np.float64) / 2, (n,))
    naive = np.broadcast_to(np.asarray(naive, dtype=np.float64), (n,))
    utc = pa.timestamp("ns", tz="UTC")

    def rows(horizon: int, q: np.ndarray, actual: np.ndarray) -> pa.Table:
        return pa.table(
            {
                "instrument": pa.array([instrument] * n, pa.string()),
                "origin_time": pa.array(origin, utc),
                "horizon": pa.array(np.full(n, horizon, np.int32)),
                "target_time": pa.array(origin + horizon * FIVE_MIN, utc),
                "q0.1": q - half,
                "q0.5": q,
                "q0.9": q + half,
                "actual": actual,
                "naive": naive,
                "target_scale": np.ones(n),
            }
        )

    junk = np.full(n, 1e6)
    return pa.concat_tables([rows(1, median, actual), rows(2, -junk, junk)])


def panel(
    seed: int, bars: int, instruments: int, signal: float
) -> tuple[pa.Table, list[np.ndarray]]:
    """Returns r_{t+1} = 1e-3 (signal x f_t + noise) per instrument, the median forecast
    1e-3 x 0.3 f_t with the spread of the quantiles 0.1-0.9 of unit noise: a forecast table
    (return target) and the returns."""
    rng = np.random.default_rng(seed)
    tables, returns = [], []
    for i in range(instruments):
        f = rng.normal(size=bars)
        r = 1e-3 * (signal * f + rng.normal(size=bars))
        tables.append(forecast_rows(f"I{i}", 1e-3 * 0.3 * f, r, spread=2e-3 * Z))
        returns.append(r)
    return pa.concat_tables(tables), returns


def test_sharpe_and_drawdown_of_a_known_path():
    r = np.array([0.02, -0.01, -0.03, 0.01, 0.04])
    # by hand: mean 0.03 / 5 = 0.006; deviations 0.014, -0.016, -0.036, 0.004, 0.034 whose
    # squares sum to 29.2e-4; the equity 0.02, 0.01, -0.02, -0.01, 0.03 falls 0.04 from 0.02
    expected = 0.006 / np.sqrt(29.2e-4 / 4) * np.sqrt(252)
    assert sharpe(r, 252) == pytest.approx(expected, rel=1e-12)
    assert max_drawdown(r) == pytest.approx(0.04, rel=1e-12)
    assert max_drawdown([-0.01, 0.005]) == pytest.approx(0.01)  # from the start, 0
    assert sharpe(r, None) is None and sharpe(np.full(4, 0.01), 252) is None
    # the same through a backtest: long one unit, no costs, 252 bars a year given
    held = buy_and_hold(forecast_rows("A", np.ones(5), r), 0.0, "return", bars_per_year=252)
    stats = held.per_instrument["A"]
    assert stats["sharpe"] == pytest.approx(expected, rel=1e-12)
    # its standard error (Lo 2002): sqrt((1 + SR_bar^2 / 2) / n), annualised alike
    per_bar = 0.006 / np.sqrt(29.2e-4 / 4)
    assert stats["sharpe_se"] == pytest.approx(np.sqrt((1 + per_bar**2 / 2) / 5 * 252))
    assert stats["max_drawdown"] == pytest.approx(0.04, rel=1e-12)
    assert stats["net_return"] == pytest.approx(0.03)
    np.testing.assert_allclose(held.curves["A"][1], [0.02, 0.01, -0.02, -0.01, 0.03])


def test_turnover_and_costs_of_a_position_path():
    a = forecast_rows("A", [-0.1, -0.4], [0.01, -0.02])
    b = forecast_rows("B", [0.5, 0.2, -0.3, 0.0], [0.01, 0.02, -0.01, 0.03])
    bars = horizon_one(pa.concat_tables([b, a]), "return")  # sorted: A's rows first
    result = backtest_strategy(bars, "sign", cost_bps=10.0)
    np.testing.assert_array_equal(result.ledger["position"], [-1, -1, 1, 1, -1, 0])
    # each instrument's first position is bought from flat, not from the one before's last
    np.testing.assert_array_equal(result.ledger["turnover"], [1, 0, 1, 0, 2, 1])
    np.testing.assert_allclose(result.ledger["cost"], 1e-3 * np.array([1, 0, 1, 0, 2, 1]))
    stats = result.per_instrument["B"]
    assert stats["turnover"] == pytest.approx(1.0)
    assert stats["gross_return"] == pytest.approx(0.04)
    assert stats["cost"] == pytest.approx(0.004)
    assert stats["net_return"] == pytest.approx(0.036)
    assert stats["hit_rate"] == pytest.approx(1.0)  # the flat bar is no call
    assert result.per_instrument["A"]["net_return"] == pytest.approx(-0.01 + 0.02 - 0.001)


def test_positions():
    median, lower, upper = np.array([0.2, -0.6, 0.0, 0.1]), np.full(4, -0.5), np.full(4, 0.5)
    np.testing.assert_array_equal(positions(median, lower, upper, "sign"), [1, -1, 0, 1])
    np.testing.assert_allclose(positions(median, lower, upper, "scaled"), [0.2, -0.6, 0, 0.1])
    np.testing.assert_allclose(positions([3.0, -3.0], [-1, -1], [1, 1], "scaled"), [1, -1])
    np.testing.assert_allclose(positions([0.1, 0.0], [0.1, 0.0], [0.1, 0.0], "scaled"), [1, 0])
    with pytest.raises(ConfigError, match="eval.strategy"):
        positions(median, lower, upper, "kelly")


@pytest.mark.parametrize("rule", ["sign", "scaled"])
def test_noise_loses_its_costs(rule):
    runs = []
    for seed in range(5):
        table, _ = panel(seed, bars=2000, instruments=3, signal=0.0)
        result = backtest_strategy(table, rule, cost_bps=1.0, target_kind="return")
        for stats in [result.portfolio, *result.per_instrument.values()]:
            runs.append(stats["sharpe"])
            # per bar, a mean return of zero is within ~4 standard errors
            assert abs(stats["gross_sharpe"] / np.sqrt(stats["bars_per_year"])) < 4 / np.sqrt(
                stats["bars"]
            )
            assert stats["net_return"] == pytest.approx(stats["gross_return"] - stats["cost"])
            assert stats["sharpe"] < stats["gross_sharpe"]  # the costs bite
    assert np.mean(runs) <= 0
    assert np.mean(np.array(runs) <= 0) >= 0.8


@pytest.mark.parametrize("rule", ["sign", "scaled"])
def test_a_planted_signal_earns(rule):
    table, _ = panel(0, bars=1000, instruments=3, signal=0.3)
    result = backtest_strategy(table, rule, cost_bps=0.1, target_kind="return")
    for stats in [result.portfolio, *result.per_instrument.values()]:
        per_bar = stats["sharpe"] / np.sqrt(stats["bars_per_year"])
        assert per_bar > 0.1  # ~0.23 expected for sign; a standard error of ~0.03
        assert stats["hit_rate"] > 0.55
    # 5-minute bars around the clock: the estimated bars per year
    assert result.portfolio["bars_per_year"] == pytest.approx(365.25 * 288)


def test_portfolio_weights_see_no_future():
    rng = np.random.default_rng(0)
    n, k = 100, 50
    ra, rb = 1e-3 * rng.normal(size=n), 2e-3 * rng.normal(size=n)

    def weights(ra: np.ndarray) -> np.ndarray:
        table = pa.concat_tables([forecast_rows("A", ra, ra), forecast_rows("B", rb, rb)])
        return risk_weights(horizon_one(table, "return")).reshape(2, n)

    before = weights(ra)
    jumped = ra.copy()
    jumped[k:] = 1e-2 * np.sign(ra[k:])  # ten times A's volatility from the return of row k,
    after = weights(jumped)  # realised at the origin of row k + 1
    np.testing.assert_array_equal(after[:, : k + 1], before[:, : k + 1])
    assert after[0, k + 1] < before[0, k + 1] - 0.1  # the next bar sees it
    assert (before[:, :WARMUP] == 0).all() and (before[:, WARMUP:] > 0).all()
    np.testing.assert_allclose(before[:, WARMUP:].sum(axis=0), 1)
    assert before[0, WARMUP:].mean() > 0.55  # A is the calmer one: the larger weight


def test_buy_and_hold_earns_the_returns_less_one_entry():
    table, returns = panel(1, bars=300, instruments=2, signal=0.0)
    result = buy_and_hold(table, cost_bps=2.0, target_kind="return")
    for name, r in zip(["I0", "I1"], returns, strict=True):
        stats = result.per_instrument[name]
        assert stats["net_return"] == pytest.approx(r.sum() - 2e-4, rel=1e-12)
        assert stats["turnover"] == pytest.approx(1 / 300)
    # the portfolio: the weighted returns from the first bar with volatilities in
    w = result.ledger["weight"].reshape(2, -1)
    gross = (w * np.stack(returns)).sum()
    assert result.portfolio["gross_return"] == pytest.approx(gross, rel=1e-12)
    assert result.portfolio["bars"] == 300 - WARMUP
    assert result.portfolio["cost"] == 0  # the entries were before the portfolio's start


def test_a_level_target_trades_simple_returns():
    rng = np.random.default_rng(0)
    r = 1e-3 * rng.normal(size=200)
    median = 1e-3 * rng.normal(size=200)
    as_return = backtest_strategy(forecast_rows("A", median, r), "scaled", 1.0, "return")
    price = 100 * np.exp(np.cumsum(r))
    level = forecast_rows("A", price * (1 + median), price * (1 + r), spread=price, naive=price)
    as_level = backtest_strategy(level, "scaled", 1.0, "level")
    for key in ("sharpe", "net_return", "max_drawdown", "turnover"):
        assert as_level.portfolio[key] == pytest.approx(as_return.portfolio[key], rel=1e-9)
    with pytest.raises(DataError, match="level of zero"):
        horizon_one(forecast_rows("A", median, r, naive=0.0), "level")


def test_compare_runs_the_baseline_on_the_same_bars(tmp_path):
    table, returns = panel(2, bars=400, instruments=2, signal=0.3)
    noise = pa.concat_tables(
        forecast_rows(f"I{i}", np.random.default_rng(i).normal(size=400), r, spread=1.0)
        for i, r in enumerate(returns)
    )
    found = compare(table, "sign", 0.5, "return", baseline=noise)
    assert set(found) == {"strategy", "buy_and_hold", "baseline_strategy"}
    assert found["strategy"].portfolio["sharpe"] > found["baseline_strategy"].portfolio["sharpe"]
    summary = json.loads(json.dumps({k: r.summary() for k, r in found.items()}))
    assert set(summary["strategy"]["pooled"]) == {
        "sharpe",
        "sharpe_se",
        "max_drawdown",
        "turnover",
        "net_return",
    }
    assert set(summary["strategy"]["by_instrument"]) == {"I0", "I1"}
    json.dumps(found["strategy"].to_dict())
    with pytest.raises(ValueError, match="same bars"):
        compare(table, "sign", 0.5, "return", baseline=forecast_rows("I0", returns[0], returns[0]))
    curves = {name: r.curves[PORTFOLIO] for name, r in found.items()}
    assert plot_equity(curves, tmp_path / "equity.png")
    assert (tmp_path / "equity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeated_bars_and_an_unnamed_series():
    a = forecast_rows("A", np.ones(3), np.ones(3))
    with pytest.raises(DataError, match="repeated"):
        horizon_one(pa.concat_tables([a, a]), "return")
    one = backtest_strategy(forecast_rows(None, np.ones(3), np.ones(3)), "sign", 0.0, "return")
    assert set(one.per_instrument) == {"series"}
    bars = Bars(["B", "A", "A"], [5, 9, 2], [[1.0], [2.0], [3.0]], [0.5], [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(bars.time_ns, [2, 9, 5])
    np.testing.assert_array_equal(bars.returns, [0.3, 0.2, 0.1])
    with pytest.raises(DataError, match="no horizon-1"):
        horizon_one(a.filter(pc.equal(a["horizon"], 2)), "return")


def test_no_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert not plot_equity({"x": (np.arange(3), np.zeros(3))}, tmp_path / "equity.png")
    assert not (tmp_path / "equity.png").exists()


def two_horizons(f1: np.ndarray, f2: np.ndarray, a1: np.ndarray, a2: np.ndarray, naive=0.0):
    """One instrument's forecast table of horizons 1 and 2: medians `f1`, `f2` (quantiles 0.1
    and 0.9 at -+0.5 around them), realised `a1`, `a2`, each origin's `naive`."""
    n = len(f1)
    origin = T0 + FIVE_MIN * np.arange(n)
    utc = pa.timestamp("ns", tz="UTC")
    naive = np.broadcast_to(np.asarray(naive, dtype=np.float64), (n,))
    tables = []
    for h, f, a in ((1, f1, a1), (2, f2, a2)):
        tables.append(
            pa.table(
                {
                    "instrument": pa.array(["A"] * n, pa.string()),
                    "origin_time": pa.array(origin, utc),
                    "horizon": pa.array(np.full(n, h, np.int32)),
                    "target_time": pa.array(origin + h * FIVE_MIN, utc),
                    "q0.1": f - 0.5,
                    "q0.5": f,
                    "q0.9": f + 0.5,
                    "actual": a,
                    "naive": naive,
                    "target_scale": np.ones(n),
                }
            )
        )
    return pa.concat_tables(tables)


def test_traded_a_bar_later_the_strategy_holds_the_bar_its_horizon_two_forecast_is_of():
    """At lag 1 the position is the horizon-2 forecast's, held over bar 2: a horizon-2 forecast
    that knows bar 2 earns every bar's move; a horizon-1 forecast that knows bar 1 (and a
    horizon-2 one that repeats it) earns nothing, the returns not persisting. A level's held
    bar returns the move from the realised level at the bar's start."""
    rng = np.random.default_rng(7)
    r = rng.normal(0, 0.01, 302)  # r[t]: the return of bar t + 1, bar t's close the origin
    b1, b2 = r[:-2], r[1:-1]
    daily = {"bars_per_year": 252.0}  # a Sharpe of a daily bar's size: 300 bars' noise gives ~1
    later = backtest_strategy(two_horizons(b1, b2, b1, b2), "sign", 0.0, "return", lag=1, **daily)
    assert later.per_instrument["A"]["bars"] == 300
    np.testing.assert_allclose(later.ledger["gross"], np.abs(b2))
    stale = backtest_strategy(two_horizons(b1, b1, b1, b2), "sign", 0.0, "return", lag=1, **daily)
    assert abs(stale.portfolio["gross_sharpe"]) < 3 < later.portfolio["gross_sharpe"]
    price = 100 * np.exp(np.r_[0.0, np.cumsum(r)])
    p0, p1, p2 = price[:-3], price[1:-2], price[2:-1]
    level = two_horizons(p1, p1 * 1.01, p1, p2, naive=p0)
    bars = held_bars(level, "level", 1)
    np.testing.assert_allclose(bars.returns, p2 / p1 - 1)
    np.testing.assert_allclose(bars.median(), np.full(300, 0.01))
    with pytest.raises(DataError, match="eval.execution_lag=2 needs data.prediction_length >= 3"):
        held_bars(level, "level", 2)


def relative_panel(transform: str, bars: int = 80, names: int = 4) -> tuple[pa.Table, np.ndarray]:
    """A forecast table of a model trained on a relative target (`transform`: its rank, or the
    return less the names' mean, at each time) on raw returns that share a large market move:
    `actual` raw, `actual_<transform>` the model's target, which the median forecasts with
    noise; (the table, the raw returns [names, bars]). The median is set so that `sign` holds
    each name long as often as short."""
    rng = np.random.default_rng(5)
    raw = 1e-2 * rng.normal(size=bars) + 1e-3 * rng.normal(size=(names, bars))
    target = raw - raw.mean(axis=0)
    if transform == "xs_rank":  # ranks of about one: far from any return
        target = np.argsort(np.argsort(raw, axis=0), axis=0) - (names - 1) / 2
    median = target + target.std() * rng.normal(size=target.shape)
    tables = []
    for i in range(names):
        rows = forecast_rows(f"N{i}", median[i], raw[i])
        junk = np.full(bars, 1e6)  # the horizon-2 rows, never read
        rows = rows.append_column(f"actual_{transform}", pa.array(np.r_[target[i], junk]))
        tables.append(rows.append_column("target_transform", pa.array([transform] * 2 * bars)))
    return pa.concat_tables(tables), raw


@pytest.mark.parametrize("transform", ["xs_demean", "xs_rank"])
def test_on_a_relative_target_the_strategy_trades_raw_returns_against_the_market(transform):
    table, raw = relative_panel(transform)
    cost_bps = 3.0
    found = compare(table, "sign", cost_bps, "return")
    hedged = raw - raw.mean(axis=0)  # each name against the equal-weighted market
    median = table.filter(pc.equal(table["horizon"], 1))["q0.5"].to_numpy().reshape(raw.shape)
    strategy = found["strategy"]
    assert strategy.hedged
    for i, name in enumerate(strategy.per_instrument):
        p = np.sign(median[i])
        moved = np.abs(np.diff(p, prepend=0.0))
        stats = strategy.per_instrument[name]
        # both legs pay: the market basket's turnover is the name's
        assert stats["turnover"] == pytest.approx(2 * moved.mean(), rel=1e-12)
        want = np.sum(p * hedged[i]) - 2 * cost_bps * 1e-4 * moved.sum()
        assert stats["net_return"] == pytest.approx(want, rel=1e-9)
        # buy-and-hold: one unit long in the raw return, one entry
        hold = found["buy_and_hold"].per_instrument[name]["net_return"]
        assert hold == pytest.approx(raw[i].sum() - cost_bps * 1e-4, rel=1e-9)
    assert not found["buy_and_hold"].hedged
