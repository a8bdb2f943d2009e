"""A run's forecasts evaluated (foxhunt.evaluation.run) and a study's selection statistics
assembled (foxhunt.evaluation.selection.selection_stats): pure, checked on small arrays."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from foxhunt.evaluation import selection
from foxhunt.evaluation.run import headline_metrics, portfolio_returns
from foxhunt.evaluation.strategy import backtest_strategy
from tests.evaluation.test_strategy import forecast_rows

EVAL = SimpleNamespace(strategy="sign", cost_bps=1.0, execution_lag=0)


def test_portfolio_returns_are_the_strategy_s_and_a_level_is_skipped():
    rng = np.random.default_rng(0)
    actual = rng.normal(0, 0.01, 50)
    table = forecast_rows("A", actual + rng.normal(0, 0.01, 50), actual)
    found = portfolio_returns(table, "return", EVAL)
    times, net = backtest_strategy(table, "sign", 1.0, "return").portfolio_returns
    assert found["bars"] == len(net) == len(found["net"]) == len(found["time_ns"])
    assert found["net"] == net.tolist() and found["time_ns"] == times.tolist()
    level = forecast_rows("A", np.full(50, -1.0), np.full(50, -2.0))  # no price is negative
    assert set(portfolio_returns(level, "level", EVAL)) == {"skipped"}


def test_headline_metrics_name_the_test_step_s():
    tested = {"test_loss": 1.0, "test_mae": 2.0, "test_baseline_loss": 3.0}
    found = headline_metrics(0.5, tested)
    assert found["val_loss"] == 0.5 and found["test_loss"] == 1.0 and found["test_mae"] == 2.0
    assert found["baseline_test_loss"] == 3.0 and found["test_coverage"] is None


def _returns(rng: np.random.Generator, times: np.ndarray, edge: float = 0.0) -> dict:
    return {"time_ns": times.tolist(), "net": (rng.normal(0, 0.01, len(times)) + edge).tolist()}


@pytest.mark.slow  # 8 CPU-s (#70)
def test_selection_stats_are_dsr_and_pbo_on_the_bars_every_trial_traded():
    rng = np.random.default_rng(1)
    bars = np.arange(200, dtype=np.int64) * 86_400 * 10**9  # daily
    returns = {
        0: _returns(rng, bars),
        1: _returns(rng, bars[10:], edge=0.002),  # began later: the common bars are its
        2: _returns(rng, bars),
        3: {},  # a trial with no strategy returns is left out
    }
    found = selection.selection_stats(returns, winner=1)
    assert found["trials"] == 3 and found["periods"] == 190
    matrix = np.stack([np.asarray(returns[n]["net"])[-190:] for n in (0, 1, 2)], axis=1)
    per_period = selection.sharpe(matrix)
    assert found["dsr"] == selection.deflated_sharpe(matrix[:, 1], per_period)
    assert found["pbo"] == selection.pbo(matrix)
    assert math.isclose(found["winner_sharpe"], per_period[1] * math.sqrt(365), rel_tol=0.01)
    assert found["naive_best_trial"] == int(np.argmax(per_period))


@pytest.mark.slow  # 1.3 s: the full tier (#70)
def test_selection_stats_need_two_trials_with_returns_and_the_winner_among_them():
    rng = np.random.default_rng(2)
    bars = np.arange(50, dtype=np.int64)
    assert "skipped" in selection.selection_stats({0: _returns(rng, bars)}, winner=0)
    two = {0: _returns(rng, bars), 1: {"time_ns": [], "net": []}, 2: _returns(rng, bars)}
    assert "skipped" in selection.selection_stats(two, winner=1)
    assert "skipped" not in selection.selection_stats(two, winner=2)
