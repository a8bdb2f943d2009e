"""A forecast table judged as a quant would: the IC over non-overlapping windows, per horizon,
instrument and pooled, the probabilistic scores, and the strategy beside the best baseline's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from foxhunt.evaluation import stats
from foxhunt.evaluation.quality import evaluate, strategy_summary
from tests.helpers import FIVE_MIN, T0

H, Q = 3, [0.1, 0.5, 0.9]


def forecast_table(signal: float, seed: int = 0, bars: int = 600) -> pa.Table:
    """Two instruments of 5-minute log returns r_t = signal * f_t + noise, forecast with the
    median 0.3 * f_t (and a spread of the noise's): the columns of forecast_table, windows
    at every bar (stride 1), H steps each; the baseline forecasts zero moves."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {}
    for name in ("AAA", "BBB"):
        f = rng.normal(size=bars + H)
        r = signal * 0.001 * f + 0.001 * rng.normal(size=bars + H)
        origin = T0 + FIVE_MIN * np.arange(bars)
        steps = np.arange(1, H + 1)
        target = (np.arange(bars)[:, None] + steps).ravel()
        median = 0.3 * 0.001 * f[target]
        rows = {
            "instrument": [name] * (bars * H),
            "origin_time": np.repeat(origin, H),
            "horizon": np.tile(steps, bars),
            "target_time": T0 + FIVE_MIN * target,
            "q0.1": median - 0.0013,
            "q0.5": median,
            "q0.9": median + 0.0013,
            "actual": r[target],
            "naive": np.zeros(bars * H),
            "target_scale": np.full(bars * H, 0.001),
            "baseline_q0.1": np.full(bars * H, -0.0013),
            "baseline_q0.5": np.zeros(bars * H),
            "baseline_q0.9": np.full(bars * H, 0.0013),
        }
        for k, v in rows.items():
            cols.setdefault(k, []).append(np.asarray(v))
    utc = pa.timestamp("ns", tz="UTC")
    out = {k: np.concatenate(v) for k, v in cols.items()}
    return pa.table(
        {
            **out,
            "origin_time": pa.array(out["origin_time"], utc),
            "target_time": pa.array(out["target_time"], utc),
        }
    )


def test_ic_is_over_non_overlapping_windows_per_horizon_and_instrument():
    table = forecast_table(signal=0.3)
    metrics, ev, _ = evaluate(table, "return", None, "sign", 1.0)
    assert ev["stride"] == H and ev["windows"] == 2 * 600 and ev["windows_scored"] == 2 * 200
    # by hand: every H-th window of each instrument, the median's move against the realised
    inst = table["instrument"].to_numpy(zero_copy_only=False).reshape(-1, H)[:, 0]
    median = table["q0.5"].to_numpy().reshape(-1, H)
    actual = table["actual"].to_numpy().reshape(-1, H)
    times = table["target_time"].cast("int64").to_numpy().reshape(-1, H)
    kept = np.tile(np.arange(600) % H == 0, 2)
    for k in range(H):
        want = stats.ic(median[kept, k], actual[kept, k], times[kept, k], lags=H)
        assert ev["by_horizon"][k]["ic"] == pytest.approx(want["mean"])
        assert ev["by_horizon"][k]["ic_t"] == pytest.approx(want["t"])
    mine = kept & (inst == "BBB")
    want = stats.ic(median[mine].ravel(), actual[mine].ravel(), times[mine].ravel(), lags=H)
    assert ev["by_instrument"]["BBB"]["ic"] == pytest.approx(want["mean"])
    pooled = stats.ic(median[kept].ravel(), actual[kept].ravel(), times[kept].ravel(), lags=H)
    assert metrics["ic"] == pytest.approx(pooled["mean"]) and metrics["ic_mode"] == "time_series"
    # the planted signal: IC near 0.3 / sqrt(1.09), far from zero
    assert metrics["ic"] == pytest.approx(0.3 / np.sqrt(1.09), abs=0.08)
    assert metrics["ic_t"] > 4
    # the probabilistic scores, normalized by the target's scale as test_loss is
    q = np.array(Q)
    pred = np.stack([table[f"q{x:g}"].to_numpy() for x in Q], axis=-1) / 0.001
    assert metrics["crps"] == pytest.approx(
        stats.crps_from_quantiles(pred, actual.ravel() / 0.001, q)
    )
    assert np.shape(ev["coverage_by_horizon"]) == (H, 3) and sum(ev["pit"]) == pytest.approx(
        1200 * H
    )


@pytest.mark.parametrize("rule", ["sign", "scaled"])
def test_the_strategy_runs_beside_buy_and_hold_and_the_best_baseline(rule):
    signal, noise = (
        strategy_summary(
            evaluate(forecast_table(s, seed=1), "return", None, rule, 1.0)[2], rule, 1.0, "zero"
        )
        for s in (0.5, 0.0)
    )
    assert signal["sharpe"] > 1 and set(signal["by_instrument"]) == {"AAA", "BBB"}
    assert noise["sharpe"] < signal["sharpe"]
    # the zero baseline's median never moves: it never trades, so it earns nothing
    assert signal["best_baseline"] == {
        "name": "zero",
        "sharpe": None,
        "sharpe_se": None,
        "max_drawdown": 0.0,
        "turnover": 0.0,
        "net_return": 0.0,
    }
    assert set(signal["buy_and_hold"]) == {
        "sharpe",
        "sharpe_se",
        "max_drawdown",
        "turnover",
        "net_return",
    }


def test_a_level_that_is_no_price_has_no_strategy():
    table = forecast_table(0.3)
    table = table.set_column(
        table.column_names.index("naive"), "naive", pa.array(np.full(len(table), -1.0))
    )
    _, _, results = evaluate(table, "level", None, "sign", 1.0)
    summary = strategy_summary(results, "sign", 1.0, None)
    assert list(summary) == ["skipped"] and "level of zero or below" in summary["skipped"]
