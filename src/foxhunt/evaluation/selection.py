"""How much of a tuned winner's score is selection: the deflated Sharpe ratio of the best of N
trials and the probability of backtest overfitting. Pure functions over per-period returns.

- **Deflated Sharpe ratio** (Bailey and Lopez de Prado 2014). The best of N trials has a high
  Sharpe ratio by luck alone: under the null of no skill its expected maximum is
  SR0 = sd(SR_n) ((1 - g) z(1 - 1/N) + g z(1 - 1/(N e))), g the Euler-Mascheroni constant, z
  the normal quantile, sd(SR_n) the spread of the trials' Sharpe ratios. DSR is the probability
  that the winner's true Sharpe exceeds SR0, given its T returns' skewness and kurtosis:
  Phi((SR - SR0) sqrt(T - 1) / sqrt(1 - skew SR + (kurt - 1) / 4 SR^2)), per-period Sharpe
  ratios. Above 0.95: significant at 5% after the N trials.
- **Probability of backtest overfitting** (Bailey, Borwein, Lopez de Prado and Zhu 2017,
  combinatorially symmetric cross-validation). The T x N returns are cut into S equal groups of
  consecutive periods; for each of the C(S, S/2) ways to take half of them as the in-sample
  part, the trial with the best in-sample Sharpe is ranked among all N on the other half. PBO is
  the share of those splits where it ranks at or below the median out of sample: near 0 when
  the in-sample winner keeps winning, 0.5 when selection picks noise, above when it picks what
  reverses.

`selection_stats` assembles both for a study: the trials' returns on the bars every one of them
traded, the winner's DSR and the selection's PBO.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from foxhunt.evaluation.strategy import bars_per_year

EULER_GAMMA = 0.5772156649015329


def sharpe(returns: np.ndarray, axis: int = 0) -> np.ndarray:
    """Per-period Sharpe ratios (mean / standard deviation, ddof 1) along `axis`; 0 where the
    returns do not vary."""
    r = np.asarray(returns, dtype=np.float64)
    sd = r.std(axis=axis, ddof=1)
    mean = r.mean(axis=axis)
    return np.divide(mean, sd, out=np.zeros_like(mean), where=sd > 0)


def expected_max_sharpe(trials: int, sd_sharpe: float) -> float:
    """SR0: the expected largest of `trials` Sharpe ratios of no skill whose spread is
    `sd_sharpe` (Bailey and Lopez de Prado 2014, eq. 6, after Bailey et al. 2014)."""
    if trials < 2:
        return 0.0
    z = scipy_stats.norm.ppf
    return sd_sharpe * (
        (1 - EULER_GAMMA) * z(1 - 1 / trials) + EULER_GAMMA * z(1 - 1 / (trials * math.e))
    )


def deflated_sharpe(returns: np.ndarray, trial_sharpes: np.ndarray) -> dict[str, Any]:
    """The deflated Sharpe ratio of a winner's per-period `returns` [T], chosen among trials whose
    per-period Sharpe ratios are `trial_sharpes` [N] (the winner's among them)."""
    r = np.asarray(returns, dtype=np.float64)
    r = r[np.isfinite(r)]
    n_trials = len(trial_sharpes)
    t = len(r)
    sr = float(sharpe(r)) if t > 1 else 0.0
    sd = float(np.std(trial_sharpes, ddof=1)) if n_trials > 1 else 0.0
    sr0 = expected_max_sharpe(n_trials, sd)
    skew = float(scipy_stats.skew(r)) if t > 2 else 0.0
    kurt = float(scipy_stats.kurtosis(r, fisher=False)) if t > 3 else 3.0
    spread = 1 - skew * sr + (kurt - 1) / 4 * sr**2
    dsr = (
        float(scipy_stats.norm.cdf((sr - sr0) * math.sqrt(t - 1) / math.sqrt(spread)))
        if t > 1 and spread > 0
        else None
    )
    return {
        "dsr": dsr,
        "significant": dsr is not None and dsr > 0.95,
        "sharpe": sr,  # per period
        "expected_max_sharpe": sr0,  # per period, under no skill
        "trials": n_trials,
        "periods": t,
        "skew": skew,
        "kurtosis": kurt,
    }


def pbo(returns: np.ndarray, groups: int = 16) -> dict[str, Any]:
    """The probability of backtest overfitting of choosing, by Sharpe ratio, among the N columns
    of `returns` [T, N] (each trial's per-period out-of-sample returns on a shared calendar),
    by combinatorially symmetric cross-validation over `groups` (even) blocks of periods."""
    r = np.asarray(returns, dtype=np.float64)
    t, n = r.shape
    groups = min(groups, t - t % 2) if t >= 2 else 0
    groups -= groups % 2
    if n < 2 or groups < 2:
        return {"pbo": None, "splits": 0, "trials": n, "groups": groups}
    # per block: each trial's count, sum and sum of squares, so a split's Sharpe ratios are sums
    blocks = np.array_split(np.arange(t), groups)
    count = np.array([len(b) for b in blocks], dtype=np.float64)
    total = np.stack([r[b].sum(axis=0) for b in blocks])  # [S, N]
    squares = np.stack([(r[b] ** 2).sum(axis=0) for b in blocks])
    logits = []
    for chosen in itertools.combinations(range(groups), groups // 2):
        inside = np.zeros(groups, dtype=bool)
        inside[list(chosen)] = True
        is_sr = _sharpe_of(count[inside].sum(), total[inside].sum(0), squares[inside].sum(0))
        oos_sr = _sharpe_of(count[~inside].sum(), total[~inside].sum(0), squares[~inside].sum(0))
        best = int(np.argmax(is_sr))
        rank = scipy_stats.rankdata(oos_sr)[best]  # 1: the worst out of sample, N: the best
        omega = rank / (n + 1)
        logits.append(math.log(omega / (1 - omega)))
    logits_a = np.asarray(logits)
    return {
        "pbo": float((logits_a <= 0).mean()),
        "splits": len(logits_a),
        "trials": n,
        "groups": groups,
        "median_logit": float(np.median(logits_a)),
    }


def _sharpe_of(count: float, total: np.ndarray, squares: np.ndarray) -> np.ndarray:
    mean = total / count
    var = (squares - count * mean**2) / max(count - 1, 1)
    sd = np.sqrt(np.clip(var, 0, None))
    return np.divide(mean, sd, out=np.zeros_like(mean), where=sd > 0)


def selection_stats(returns: dict[int, dict[str, list]], winner: int) -> dict[str, Any]:
    """DSR of trial `winner` and PBO of the selection, from each completed trial's portfolio
    returns ({trial: {time_ns, net}}, its validation periods') on the bars every one traded."""
    returns = {n: r for n, r in returns.items() if r.get("net")}
    if winner not in returns or len(returns) < 2:
        return {"skipped": "fewer than two completed trials with strategy returns"}
    common = set.intersection(*(set(r["time_ns"]) for r in returns.values()))
    times = np.array(sorted(common), dtype=np.int64)
    numbers = list(returns)
    matrix = np.empty((len(times), len(numbers)))
    for j, n in enumerate(numbers):
        by_time = dict(zip(returns[n]["time_ns"], returns[n]["net"], strict=True))
        matrix[:, j] = [by_time[t] for t in times]
    per_period = sharpe(matrix, axis=0)
    per_year = bars_per_year(times) or 1.0
    annual = per_period * math.sqrt(per_year)
    best = numbers.index(winner)
    return {
        "trials": len(numbers),
        "periods": len(times),
        "winner_sharpe": float(annual[best]),  # annualized, on the validation periods
        "naive_best_sharpe": float(annual.max()),  # the best of the trials, by luck or not
        "naive_best_trial": numbers[int(np.argmax(annual))],
        "dsr": deflated_sharpe(matrix[:, best], per_period),
        "pbo": pbo(matrix),
        "about": {
            "dsr": "the probability that the winner's Sharpe ratio beats the best that as "
            "many trials of no skill would reach by luck (significant above 0.95)",
            "pbo": "the share of ways to split the validation periods in half in which the "
            "trial best on one half ranks in the lower half on the other (0.5: selection "
            "picks noise; near 0: the winner keeps winning)",
        },
    }
