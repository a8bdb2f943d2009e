"""The deflated Sharpe ratio and the probability of backtest overfitting
(foxhunt.evaluation.selection) on returns whose skill is known: noise, one real edge, and an
edge that reverses out of sample."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from foxhunt.evaluation import selection

DAYS = 252


@pytest.mark.slow  # 3 CPU-s: the full tier
def test_the_best_of_20_noise_trials_looks_good_and_is_not_significant():
    rng = np.random.default_rng(0)
    returns = rng.normal(0, 0.01, (1000, 20))
    sharpes = selection.sharpe(returns)
    best = int(np.argmax(sharpes))
    assert sharpes[best] * math.sqrt(DAYS) > 0.7  # the naive best: an annual Sharpe near 1
    found = selection.deflated_sharpe(returns[:, best], sharpes)
    assert found["dsr"] < 0.95 and not found["significant"]
    assert found["expected_max_sharpe"] > 0.5 * sharpes[best]
    overfit = selection.pbo(returns)
    assert overfit["splits"] == math.comb(16, 8)
    assert 0.35 < overfit["pbo"] < 0.75  # selection picks noise: the winner is a coin flip


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_a_real_edge_among_noise_is_significant_and_not_overfit():
    rng = np.random.default_rng(1)
    returns = rng.normal(0, 0.01, (1000, 20))
    returns[:, 7] += 0.002  # a per-period Sharpe of 0.2: 3.2 a year
    sharpes = selection.sharpe(returns)
    assert int(np.argmax(sharpes)) == 7
    assert selection.deflated_sharpe(returns[:, 7], sharpes)["significant"]
    assert selection.pbo(returns)["pbo"] < 0.05


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_an_edge_that_reverses_out_of_sample_is_overfit():
    """Each trial earns in a random half of the blocks (exactly half) and loses in the other:
    whichever wins in sample has its losing blocks out of sample."""
    rng = np.random.default_rng(2)
    t, n, groups = 1600, 20, 16
    block = np.repeat(np.arange(groups), t // groups)
    good = np.stack([rng.permutation(groups) < groups // 2 for _ in range(n)], axis=1)
    returns = rng.normal(0, 0.01, (t, n)) + np.where(good[block], 0.003, -0.003)
    assert selection.pbo(returns, groups)["pbo"] > 0.9


def test_the_deflated_sharpe_ratio_is_the_formula():
    rng = np.random.default_rng(3)
    r = rng.standard_t(5, 500) * 0.01 + 0.001
    sr = r.mean() / r.std(ddof=1)
    skew, kurt = stats.skew(r), stats.kurtosis(r, fisher=False)
    trial_sharpes = np.array([sr, 0.01, -0.02, 0.03, 0.0])
    sr0 = np.std(trial_sharpes, ddof=1) * (
        (1 - np.euler_gamma) * stats.norm.ppf(1 - 1 / 5)
        + np.euler_gamma * stats.norm.ppf(1 - 1 / (5 * np.e))
    )
    want = stats.norm.cdf(
        (sr - sr0) * np.sqrt(499) / np.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2)
    )
    found = selection.deflated_sharpe(r, trial_sharpes)
    assert found["dsr"] == pytest.approx(want, rel=1e-12)
    # one trial: nothing to deflate, the probabilistic Sharpe ratio
    assert selection.expected_max_sharpe(1, 0.1) == 0.0


def test_the_expected_maximum_matches_simulation():
    rng = np.random.default_rng(4)
    for n in (10, 100):
        simulated = rng.normal(0, 0.05, (20_000, n)).max(axis=1).mean()
        assert selection.expected_max_sharpe(n, 0.05) == pytest.approx(simulated, rel=0.03)


def test_too_few_trials_or_periods_say_so():
    assert selection.pbo(np.zeros((100, 1)))["pbo"] is None
    assert selection.pbo(np.zeros((1, 5)))["pbo"] is None
    assert selection.deflated_sharpe(np.array([0.01]), np.array([0.1, 0.2]))["dsr"] is None
