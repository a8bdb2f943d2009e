"""The forecast statistics: each equals a hand computation on small fixed arrays; the IC's
t-statistic stays within +-2 on noise with overlapping targets (where the naive one does not)
and finds a planted signal at its theoretical size."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm, pearsonr, spearmanr

from foxhunt.evaluation.stats import (
    MIN_CROSS_SECTION,
    coverage,
    crps_from_quantiles,
    hit_rates,
    ic,
    mean_stat,
    newey_west_se,
    pinball_per_quantile,
    pit_histogram,
    strided,
    winkler_score,
)

H = 5  # the horizon of the overlapping noise panel


def test_ic_and_rank_ic_with_ties_by_hand():
    f = np.array([1.0, 2, 2, 10])
    r = np.array([0.0, 3, 1, 2])
    # one row per timestamp: the correlation over time. Pearson: deviations f [-2.75, -1.75,
    # -1.75, 6.25], r [-1.5, 1.5, -0.5, 0.5]; cross products 5.5, squares 52.75 and 5
    pearson = ic(f, r, np.arange(4), lags=0)
    assert pearson["mode"] == "time_series"
    assert pearson["mean"] == pytest.approx(5.5 / np.sqrt(52.75 * 5))
    # average ranks f [1, 2.5, 2.5, 4] (the tie), r [1, 4, 2, 3]: 3 / sqrt(4.5 * 5)
    spearman = ic(f, r, np.arange(4), lags=0, rank=True)
    assert spearman["mean"] == pytest.approx(2 / np.sqrt(10))
    assert spearman["mean"] == pytest.approx(spearmanr(f, r).statistic)


def test_cross_sectional_ic_with_ties_matches_scipy_per_timestamp():
    # two timestamps of MIN_CROSS_SECTION instruments, ties within and across timestamps,
    # rows shuffled
    f = np.array([[1.0, 2, 2, 10, 5], [2.0, 2, 3, 1, 1]])
    r = np.array([[0.0, 3, 1, 2, 2], [5.0, 1, 2, 2, 0]])
    time = np.repeat([20, 10], MIN_CROSS_SECTION)
    order = np.random.default_rng(0).permutation(f.size)
    f, r, time = f.ravel()[order], r.ravel()[order], time[order]
    for rank, corr in ((False, pearsonr), (True, spearmanr)):
        found = ic(f, r, time, lags=1, rank=rank)
        per_time = [corr(f[time == t], r[time == t]).statistic for t in (10, 20)]
        assert found["mode"] == "cross_section" and found["n"] == 2
        assert found["mean"] == pytest.approx(np.mean(per_time))
        assert found["se"] == pytest.approx(newey_west_se(np.array(per_time), 1))


def test_newey_west_se_by_hand():
    x = np.array([1.0, 2, 3, 4, 6])  # mean 3.2: deviations [-2.2, -1.2, -0.2, 0.8, 2.8]
    squares = 2.2**2 + 1.2**2 + 0.2**2 + 0.8**2 + 2.8**2  # 14.8
    lag_one = 2.2 * 1.2 + 1.2 * 0.2 - 0.2 * 0.8 + 0.8 * 2.8  # 4.96
    # Bartlett weight 1 - 1/2 at lag 1. The same value as statsmodels 0.15's
    # OLS(x, ones).fit(cov_type="HAC", cov_kwds={"maxlags": 1}).bse (its default for HAC,
    # use_correction=False; True would multiply the variance by n / (n - 1)), checked once
    assert newey_west_se(x, 1) == pytest.approx(np.sqrt(squares + 2 * 0.5 * lag_one) / 5)
    assert newey_west_se(x, 0) == pytest.approx(np.std(x) / np.sqrt(5))  # population std
    assert newey_west_se(x[:1], 1) is None
    stat = mean_stat(x, 1)
    assert stat["mean"] == pytest.approx(3.2) and stat["t"] == pytest.approx(3.2 / stat["se"])
    assert stat["n"] == 5


def panel(seed: int, instruments: int, times: int, beta: float = 0.0, overlap: int = 1):
    """(forecast, realised, time) rows of a panel: a feature summed over the last `overlap`
    steps, and the sum over the next `overlap` steps of the moves, each beta x the step
    before's feature + noise (each sum scaled to unit variance): neighbouring rows share
    overlap - 1 draws."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(instruments, times + 2 * overlap))
    moves = beta * np.roll(x, 1, axis=1) + rng.normal(size=x.shape)
    kernel = np.ones(overlap) / np.sqrt(overlap)

    def sums(v: np.ndarray) -> np.ndarray:
        return np.stack([np.convolve(row, kernel, "valid") for row in v])

    forecast = sums(x)[:, :times]  # ends at t: known at t
    realised = sums(moves)[:, overlap : overlap + times]  # starts after t
    time = np.broadcast_to(np.arange(times), (instruments, times))
    return forecast.ravel(), realised.ravel(), time.ravel()


def test_ic_modes_on_a_panel():
    f, r, time = panel(0, 6, 50)
    found = ic(f, r, time, lags=2)
    per_time = [np.corrcoef(f[time == t], r[time == t])[0, 1] for t in range(50)]
    assert found["mode"] == "cross_section" and found["n"] == 50
    assert found["mean"] == pytest.approx(np.mean(per_time))
    assert found["se"] == pytest.approx(newey_west_se(np.array(per_time), 2))
    # a timestamp with too few instruments is left out
    thin = (time != 7) | (np.arange(len(time)) < 2 * 50)  # two instruments at t = 7
    assert ic(f[thin], r[thin], time[thin], lags=2)["n"] == 49

    # two instruments: the correlation over all rows; its standard error sums the products u
    # of each timestamp before the Newey-West sum over time
    f, r, time = panel(0, 2, 50)
    found = ic(f, r, time, lags=2)
    assert found["mode"] == "time_series" and found["n"] == 100
    assert found["mean"] == pytest.approx(np.corrcoef(f, r)[0, 1])
    u = (f - f.mean()) / f.std() * (r - r.mean()) / r.std()
    per_time = (u - u.mean()).reshape(2, 50).sum(axis=0)
    lagged = sum((1 - k / 3) * per_time[k:] @ per_time[:-k] for k in (1, 2))
    assert found["se"] == pytest.approx(np.sqrt(per_time @ per_time + 2 * lagged) / 100)
    # one instrument: the Newey-West error of u's mean
    f, r, time = f[:50], r[:50], time[:50]
    one = ic(f, r, time, lags=2)
    u = (f - f.mean()) / f.std() * (r - r.mean()) / r.std()
    assert one["se"] == pytest.approx(newey_west_se(u, 2))
    assert ic(f, r, None, lags=2) == one  # no times: the rows in their order


@pytest.mark.parametrize("instruments, times", [(1, 1000), (20, 300)])
def test_ic_t_statistic_on_overlapping_noise(instruments, times):
    # forecasts and targets both overlapping over H steps, no signal. Over 400 seeds the |t| with
    # lags = H exceeds 2 in ~8% (Bartlett weights discount the overlap's autocovariances a
    # little), without the HAC correction in ~25-29%
    hac, naive = [], []
    for seed in range(20):
        f, r, time = panel(seed, instruments, times, overlap=H)
        hac.append(ic(f, r, time, lags=H)["t"])
        naive.append(ic(f, r, time, lags=0)["t"])
    hac, naive = np.array(hac), np.array(naive)
    assert (np.abs(hac) <= 2).mean() >= 0.9
    assert (hac**2).mean() < 2
    # the naive standard error ignores the overlap: its t-statistics spread ~1.6x as wide
    assert (naive**2).mean() > 2 * (hac**2).mean()


@pytest.mark.parametrize("instruments, times", [(1, 4000), (50, 200)])
def test_ic_finds_a_planted_signal(instruments, times):
    # target = 0.3 x feature + noise, both N(0, 1): correlation 0.3 / sqrt(1.09), Spearman
    # correlation (6 / pi) arcsin(rho / 2) for a normal pair
    f, r, time = panel(0, instruments, times, beta=0.3)
    rho = 0.3 / np.sqrt(1.09)
    for rank, expected in ((False, rho), (True, 6 / np.pi * np.arcsin(rho / 2))):
        found = ic(f, r, time, lags=1, rank=rank)
        assert abs(found["mean"] - expected) < 3 * found["se"]
        assert found["t"] > 10


def test_hit_rates_by_hand():
    median = np.array([1.0, 1, 0, 2, -3, 1, 1])
    realised = np.array([0.5, -0.2, 1, 1, -2, 0, 0.3])
    # counted: rows 0, 1, 3, 4, 6 (row 2's median abstains, row 5 did not move); hits 0, 3, 4,
    # 6; up moves 0, 3, 6
    assert hit_rates(median, realised) == pytest.approx(
        {"calls": 5, "hit_rate": 0.8, "base_rate": 0.6, "majority_rate": 0.6, "edge": 0.2}
    )
    assert hit_rates(np.zeros(3), realised[:3])["hit_rate"] is None


def test_strided_keeps_every_stride_th_origin_per_instrument():
    origin = np.concatenate([np.arange(10), np.arange(4, 10)])  # the second starts later
    group = np.repeat([0, 1], [10, 6])
    order = np.random.default_rng(0).permutation(len(origin))
    keep = strided(origin[order], group[order], 3)
    kept = set(zip(group[order][keep].tolist(), origin[order][keep].tolist(), strict=True))
    assert kept == {(0, 0), (0, 3), (0, 6), (0, 9), (1, 4), (1, 7)}
    assert strided(origin, group, 1).all()


def test_pinball_and_crps_converge_to_the_normal_closed_form():
    q = np.array([0.1, 0.5, 0.9])
    pred = np.array([[-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0]])
    y = np.array([0.5, -2.0])
    # y = 0.5: 0.1 * 1.5, 0.5 * 0.5, 0.9 * 0.5 - 0.4; y = -2: 0.9 * 1, 0.5 * 2, 0.1 * 3
    expected = np.array([(0.15 + 0.9) / 2, (0.25 + 1.0) / 2, (0.05 + 0.3) / 2])
    assert pinball_per_quantile(pred, y, q) == pytest.approx(expected)

    mu, sigma = 0.5, 2.0
    y = np.array([-3.0, 0.2, 4.0])
    z = (y - mu) / sigma
    exact = sigma * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / np.sqrt(np.pi))
    errors = []
    for levels in (9, 99, 999):
        q = np.arange(1, levels + 1) / (levels + 1)
        pred = norm.ppf(q, mu, sigma)
        found = np.array([crps_from_quantiles(pred, v, q) for v in y])
        errors.append(np.abs(found / exact - 1).max())
        assert errors[-1] < 1.2 / levels  # the levels' average: ~1 / levels too high
    assert errors[0] > errors[1] > errors[2]


def test_winkler_score_and_coverage_by_hand():
    # width 1 each; misses 0, 1 and 2 cost 2 / 0.2 = 10 per unit: scores 1, 11, 21
    lower, upper, y = np.zeros(3), np.ones(3), np.array([0.5, -1.0, 3.0])
    assert winkler_score(lower, upper, y, alpha=0.2) == pytest.approx(11.0)

    pred = np.array([[[-1.0, 1.0], [0.0, 2.0]], [[-1.0, 1.0], [0.0, 2.0]]])  # [n=2, H=2, Q=2]
    y = np.array([[0.0, 3.0], [-1.0, 0.0]])
    # step 0: y 0 and -1 against -1 (one at or below) and 1 (both); step 1: 3 and 0 against
    # 0 (one) and 2 (one)
    assert coverage(pred, y) == pytest.approx(np.array([[0.5, 1.0], [0.5, 0.5]]))


def test_pit_histogram():
    q = np.array([0.25, 0.5, 0.75])
    pred = np.tile([-1.0, 0.0, 1.0], (3, 1))
    # y = 0.5: halfway from level 0.5 to 0.75, 0.625 (bin 6); y = -2: spread over [0, 0.25],
    # 0.4 in bins 0 and 1, 0.1 in bin 2; y = 5: over [0.75, 1], 0.1 in bin 7, 0.4 in 8 and 9
    expected = [0.4, 0.4, 0.2, 0, 0, 0, 1, 0.2, 0.4, 0.4]
    assert pit_histogram(pred, np.array([0.5, -2.0, 5.0]), q) == pytest.approx(expected)

    rng = np.random.default_rng(0)
    y = rng.normal(size=20_000)
    q = np.array([0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95])
    calibrated = pit_histogram(np.broadcast_to(norm.ppf(q), (len(y), len(q))), y, q)
    assert calibrated.sum() == pytest.approx(len(y))
    assert np.abs(calibrated / (len(y) / 10) - 1).max() < 0.1
    narrow = pit_histogram(np.broadcast_to(norm.ppf(q, scale=0.5), (len(y), len(q))), y, q)
    assert min(narrow[0], narrow[-1]) > 2 * narrow[4:6].max()  # U-shaped
