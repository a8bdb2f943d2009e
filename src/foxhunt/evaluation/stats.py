"""Forecast statistics with their uncertainty: pure functions over numpy arrays of one horizon
step (or [n, H] where said), for a run's summary to report per horizon, per instrument and
pooled.

- Direction: `ic`, the information coefficient (Pearson) or rank IC (Spearman) of the median
  forecast against the realised target, across instruments at each timestamp when there are at
  least MIN_CROSS_SECTION of them, else over time; with its mean, Newey-West standard error
  (`newey_west_se`: overlapping targets make neighbouring ICs dependent) and t-statistic.
  `hit_rates`: the sign hits against the share of up moves and against always calling the
  majority sign. `strided`: every stride-th forecast origin per instrument (non-overlapping
  windows when the stride is the prediction length), for the headline numbers.
- Probabilistic quality: `pinball_per_quantile`, `crps_from_quantiles`, `winkler_score` (the
  interval score), `coverage` (observed against nominal: the calibration curve, per horizon)
  and `pit_histogram`.

Written by hand, each a few lines: the Bartlett-kernel HAC variance, the per-timestamp
correlation (bincount sums), the quantile-score CRPS and the PIT; ranks are scipy's
`rankdata` (average ranks for ties, so the rank IC is scipy's `spearmanr`)."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

MIN_CROSS_SECTION = 5  # instruments a timestamp needs for a cross-sectional IC (2 give +-1)


def _bartlett_sum(e: np.ndarray, lags: int) -> float:
    """sum_t e_t^2 + 2 sum_k (1 - k / (lags + 1)) sum_t e_t e_{t-k} of a centred series e:
    n times its Newey-West long-run variance (Bartlett weights, never negative)."""
    lags = min(max(int(lags), 0), len(e) - 1)
    total = float(e @ e)
    for k in range(1, lags + 1):
        total += 2 * (1 - k / (lags + 1)) * float(e[k:] @ e[:-k])
    return total


def newey_west_se(x: np.ndarray, lags: int) -> float | None:
    """The Newey-West (HAC, Bartlett kernel) standard error of the mean of the series x [n],
    autocovariances up to `lags` steps apart; None for fewer than two values.

    No small-sample correction: with lags = 0 it is the population standard deviation over
    sqrt(n), and it equals statsmodels' `OLS(x, ones).fit(cov_type="HAC", cov_kwds={"maxlags":
    lags, "use_correction": False})` standard error of the constant."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if len(x) < 2:
        return None
    return float(np.sqrt(_bartlett_sum(x - x.mean(), lags)) / len(x))


def _stat(mean: float, se: float | None, n: int) -> dict[str, float | int | None]:
    """{mean, se, t, n}; t = mean / se, None where the standard error is missing or zero."""
    t = mean / se if se else None
    return {"mean": float(mean), "se": se, "t": None if t is None else float(t), "n": int(n)}


def mean_stat(x: np.ndarray, lags: int) -> dict[str, float | int | None]:
    """{mean, se, t, n} of the series x [n]: its mean, Newey-West standard error (`lags`) and
    t-statistic; mean None when x is empty."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if not len(x):
        return {"mean": None, "se": None, "t": None, "n": 0}
    return _stat(x.mean(), newey_west_se(x, lags), len(x))


def _cross_section_ic(f: np.ndarray, r: np.ndarray, at: np.ndarray) -> np.ndarray:
    """[timestamps] the Pearson correlation of f and r within each timestamp `at` (dense
    indices 0..T-1); NaN where either side is constant."""
    count = np.bincount(at)
    df = f - (np.bincount(at, f) / count)[at]
    dr = r - (np.bincount(at, r) / count)[at]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(at, df * dr) / np.sqrt(
            np.bincount(at, df * df) * np.bincount(at, dr * dr)
        )


def _ranks_within(x: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The average ranks of x within each timestamp `at` (dense indices), each timestamp's
    shifted by the rows of the earlier ones (which no correlation within it sees)."""
    # one rankdata over (timestamp, value): ties only within a timestamp
    return rankdata(at * (len(x) + 1) + rankdata(x, method="dense").astype(np.int64))


def ic(
    forecast: np.ndarray,
    realised: np.ndarray,
    time: np.ndarray | None,
    lags: int,
    rank: bool = False,
) -> dict[str, float | int | str | None]:
    """The information coefficient of the median `forecast` [n] against the `realised` target
    [n] at the times `time` [n] (int64 ns; None: the rows are one series, in their order):
    {mode, mean, se, t, n}, the Pearson correlation, or the Spearman one (Pearson of the
    average ranks) with `rank`.

    - mode "cross_section", when the median timestamp has at least MIN_CROSS_SECTION rows: the
      correlation across the rows of each such timestamp (constant ones skipped), then mean,
      Newey-West standard error over `lags` timestamps and t over those n timestamps, and
      `icir`, their mean over their standard deviation (per timestamp, not annualised).
    - mode "time_series", otherwise: the correlation over all n rows (pooled as given, so
      differences in level between instruments count). It is the mean of u = z_f * z_r, the
      products of the series standardized with the population deviation, and its standard error
      is that mean's Newey-West one over `lags` timestamps, with the u of one timestamp summed
      first (Driscoll-Kraay: one instrument gives `newey_west_se(u, lags)`; several also
      count their dependence at the same time). Without correlation it is the usual
      1 / sqrt(n) (for independent rows); with one it is conservative, as it leaves out that
      the means and deviations are estimated (for normal data by sqrt(1 + rho^2) / (1 - rho^2),
      13% at rho = 0.29)."""
    f = np.asarray(forecast, dtype=np.float64)
    r = np.asarray(realised, dtype=np.float64)
    if time is None:
        time = np.arange(len(f))
    _, at = np.unique(time, return_inverse=True)  # sorted, dense timestamp indices
    at = at.ravel()
    if len(f) and np.median(np.bincount(at)) >= MIN_CROSS_SECTION:
        wide = np.bincount(at)[at] >= MIN_CROSS_SECTION
        f, r = f[wide], r[wide]
        _, at = np.unique(at[wide], return_inverse=True)
        if rank:
            f, r = _ranks_within(f, at), _ranks_within(r, at)
        per_time = _cross_section_ic(f, r, at)
        per_time = per_time[np.isfinite(per_time)]
        spread = per_time.std(ddof=1) if len(per_time) > 1 else 0.0
        icir = float(per_time.mean() / spread) if spread > 0 else None
        return {"mode": "cross_section", "icir": icir} | mean_stat(per_time, lags)
    if rank:
        f, r = rankdata(f), rankdata(r)
    if len(f) < 2 or f.std() == 0 or r.std() == 0:
        return {"mode": "time_series", "mean": None, "se": None, "t": None, "n": len(f)}
    u = (f - f.mean()) / f.std() * (r - r.mean()) / r.std()
    per_time = np.bincount(at, u - u.mean())
    se = float(np.sqrt(_bartlett_sum(per_time, lags)) / len(u))
    return {"mode": "time_series"} | _stat(u.mean(), se, len(u))


def hit_rates(median: np.ndarray, realised: np.ndarray) -> dict[str, float | int | None]:
    """The sign calls of the `median` forecast against the `realised` moves (any shape):
    {calls, hit_rate, base_rate, majority_rate, edge}. A step counts where both are nonzero (a
    median of exactly zero abstains; a zero move has no sign); over those steps: the share of
    hits, the share of up moves (what always calling up scores), the better of always up or
    always down (the majority sign, known only afterwards: a generous baseline), and the hit
    rate less that. None where nothing counts."""
    median, realised = np.asarray(median), np.asarray(realised)
    counted = (median != 0) & (realised != 0)
    calls = int(counted.sum())
    if not calls:
        return {
            "calls": 0,
            "hit_rate": None,
            "base_rate": None,
            "majority_rate": None,
            "edge": None,
        }
    hit_rate = float((np.sign(median[counted]) == np.sign(realised[counted])).mean())
    base_rate = float((realised[counted] > 0).mean())
    majority = max(base_rate, 1 - base_rate)
    return {
        "calls": calls,
        "hit_rate": hit_rate,
        "base_rate": base_rate,
        "majority_rate": majority,
        "edge": hit_rate - majority,
    }


def strided(origin: np.ndarray, group: np.ndarray, stride: int) -> np.ndarray:
    """[n] bool: the rows whose forecast `origin` (an integer position, e.g. the window's first
    decoder row) is a multiple of `stride` past its instrument's (`group`) first origin; with
    stride = the prediction length no two kept windows of an instrument overlap."""
    origin, group = np.asarray(origin, dtype=np.int64), np.asarray(group, dtype=np.int64)
    if stride <= 1 or not len(origin):
        return np.ones(len(origin), dtype=bool)
    first = np.full(group.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, group, origin)
    return (origin - first[group]) % stride == 0


def _pinball(pred: np.ndarray, y: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    """[..., Q] max(q * e, (q - 1) * e), e = y - pred: the model's quantile loss, unreduced."""
    errors = np.asarray(y, dtype=np.float64)[..., None] - pred
    return np.maximum(quantiles * errors, (quantiles - 1) * errors)


def pinball_per_quantile(pred: np.ndarray, y: np.ndarray, quantiles: np.ndarray) -> np.ndarray:
    """[Q] the mean pinball loss of each quantile forecast, pred [..., Q] against y [...]."""
    pinball = _pinball(pred, y, np.asarray(quantiles, dtype=np.float64))
    return pinball.reshape(-1, pinball.shape[-1]).mean(axis=0)


def pinball_by_horizon(pred: np.ndarray, y: np.ndarray, quantiles: np.ndarray) -> list[float]:
    """The mean pinball loss at each horizon step, pred [windows, H, Q] against y [windows, H]."""
    return _pinball(pred, y, np.asarray(quantiles, dtype=np.float64)).mean(axis=(0, 2)).tolist()


def crps_from_quantiles(pred: np.ndarray, y: np.ndarray, quantiles: np.ndarray) -> float:
    """The CRPS approximated from quantile forecasts pred [..., Q] of y [...]: twice the mean
    pinball loss over the levels (CRPS = 2 * integral over levels of the pinball loss; the
    levels' average, which is the weighted interval score of Bracher et al. 2021 for central
    intervals and a median). For levels i / (Q + 1) it overstates the CRPS by a factor of about
    (Q + 1) / Q, which vanishes as levels are added."""
    return float(2 * pinball_per_quantile(pred, y, quantiles).mean())


def winkler_score(lower: np.ndarray, upper: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """The mean interval (Winkler) score of the central (1 - alpha) intervals [lower, upper]
    (levels alpha / 2 and 1 - alpha / 2) for y: the width plus 2 / alpha times the miss;
    for the outer pair of quantile levels, alpha = 1 - (q_last - q_first)."""
    lower, upper, y = (np.asarray(a, dtype=np.float64) for a in (lower, upper, y))
    miss = np.maximum(lower - y, 0) + np.maximum(y - upper, 0)
    return float((upper - lower + 2 / alpha * miss).mean())


def coverage(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[..., Q] the share of y [n, ...] at or below each quantile forecast pred [n, ..., Q]
    (the observed levels, to set against the nominal ones): [H, Q] for [n, H, Q]."""
    return (np.asarray(y)[..., None] <= np.asarray(pred)).mean(axis=0)


def pit_histogram(
    pred: np.ndarray, y: np.ndarray, quantiles: np.ndarray, bins: int = 10
) -> np.ndarray:
    """[bins] the counts (fractional) of the probability integral transforms of y [...] under
    its quantile forecasts pred [..., Q] (sorted first), in equal bins over [0, 1]: flat for a
    calibrated forecast, U-shaped for a too narrow one.

    The forecast CDF runs linearly between adjacent (quantile, level) points; outside the outer
    quantiles it is unknown, so a y below the first (at or above the last) adds one count spread
    evenly over [0, q_first] ([q_last, 1])."""
    q = np.asarray(quantiles, dtype=np.float64)
    pred = np.sort(np.asarray(pred, dtype=np.float64), axis=-1).reshape(-1, len(q))
    y = np.asarray(y, dtype=np.float64).ravel()
    j = (pred <= y[:, None]).sum(axis=1)  # quantiles at or below y
    inside = (j > 0) & (j < len(q))
    rows, k = np.flatnonzero(inside), j[inside]
    lo, hi = pred[rows, k - 1], pred[rows, k]
    pit = q[k - 1] + (q[k] - q[k - 1]) * (y[rows] - lo) / (hi - lo)
    edges = np.linspace(0, 1, bins + 1)
    counts = np.histogram(pit, edges)[0].astype(np.float64)

    def spread(a: float, b: float) -> np.ndarray:  # one count, even over [a, b], per bin
        return np.clip(np.minimum(b, edges[1:]) - np.maximum(a, edges[:-1]), 0, None) / (b - a)

    counts += (j == 0).sum() * spread(0.0, q[0])
    counts += (j == len(q)).sum() * spread(q[-1], 1.0)
    return counts
