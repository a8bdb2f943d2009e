"""The conformal calibration applied to a forecast: the quantiles put in order, widened by
CQR's offsets or by adaptive conformal inference's (fitted by `foxhunt.evaluation.calibration`,
stored in a checkpoint and model.json as `calibration`)."""

from __future__ import annotations

from typing import Any

import numpy as np

POOLED = "*"  # the key of the offsets fitted on every instrument's windows


def in_order(pred: np.ndarray, quantiles: list[float]) -> np.ndarray:
    """pred [..., Q] with no crossing: the lower levels capped at the median, the upper ones
    floored at it (so the median stays), then sorted along the last axis."""
    m = next((i for i, q in enumerate(quantiles) if abs(float(q) - 0.5) < 1e-6), None)
    out = np.array(pred, dtype=np.float64)
    if m is not None:
        med = out[..., m : m + 1]
        out[..., :m] = np.minimum(out[..., :m], med)
        out[..., m + 1 :] = np.maximum(out[..., m + 1 :], med)
    return np.sort(out, axis=-1)


def apply(
    pred: np.ndarray,
    cal: dict[str, Any] | None,
    quantiles: list[float],
    instrument: np.ndarray,
    actual: np.ndarray | None = None,
    origin_ns: np.ndarray | None = None,
    target_ns: np.ndarray | None = None,
    method: str | None = None,
) -> np.ndarray:
    """pred [n, H, Q] (normalized) calibrated by `method` (default the fit's): none (only put
    in order), cqr (the static offsets of the instrument, or the pooled ones) or aci (adapted
    to each realized outcome in `actual` [n, H], NaN where unknown, by `origin_ns` [n] and
    `target_ns` [n, H]). `cal`: the calibration's dict (None: only in order)."""
    method = method or (cal or {}).get("method")
    if not cal or method == "none" or not cal["offsets"]:
        return in_order(pred, quantiles)
    names = np.asarray([str(x) for x in instrument], dtype=object)
    key = {n: n if n in cal["offsets"] else POOLED for n in dict.fromkeys(names)}
    if method == "cqr" or actual is None:
        off = np.stack([cal["offsets"][key[n]] for n in names]) if len(pred) else 0
        return _widen(pred, off, cal["pairs"], quantiles)
    if method != "aci":
        raise ValueError(f"calibration method {method!r} is none, cqr or aci")
    return _widen(
        pred, aci(pred, actual, names, origin_ns, target_ns, cal, key), cal["pairs"], quantiles
    )


def _widen(pred: np.ndarray, off: Any, pairs: list, quantiles: list[float]) -> np.ndarray:
    """Each pair's interval [lo - offset, hi + offset], then in order."""
    out = np.array(pred, dtype=np.float64)
    out[..., [i for i, _ in pairs]] -= off
    out[..., [j for _, j in pairs]] += off
    return in_order(out, quantiles)


def aci(
    pred: np.ndarray,
    y: np.ndarray,
    names: np.ndarray,
    origin: np.ndarray,
    target: np.ndarray,
    cal: dict,
    key: dict[str, str],
) -> np.ndarray:
    """[n, H, P] adaptive conformal inference's offsets (Gibbs and Candes 2021) along each
    instrument's windows in time order: alpha_t+1 = alpha_t + gamma (alpha - miss_t), counting
    only the outcomes known at the forecast's origin; the offset is the score quantile at
    (1 - alpha_t)(n + 1) / n, read off the fit's grid of the instrument's `key`.

    The recursion runs along time, every instrument at once (its t-th window beside the others'
    t-th): one step per window of the longest history, not one per window of the panel (#68: a
    250-name panel's windows one at a time took minutes)."""
    q, pairs, levels = cal["quantiles"], cal["pairs"], cal["grid_levels"]
    if not len(names):
        return np.zeros((*pred.shape[:2], len(pairs)))
    alpha = np.array([1 - (q[j] - q[i]) for i, j in pairs])  # each pair's miscoverage
    order, code = np.unique(names.astype(str), return_inverse=True)
    by = np.lexsort((origin, code.ravel()))  # by instrument, then in time
    rows = np.split(by, np.flatnonzero(np.diff(code.ravel()[by])) + 1)
    k, n, (h, p) = len(order), max(len(r) for r in rows), (y.shape[1], len(pairs))
    at = np.full((k, n), -1)  # each instrument's t-th window (-1: none, past its last)
    known = np.zeros((k, n, h), np.int64)  # its windows whose step's outcome the origin knows
    for g, r in enumerate(rows):
        at[g, : len(r)] = r
        for s in range(h):
            seen = np.searchsorted(target[r, s], origin[r], side="right")
            known[g, : len(r), s] = np.minimum(seen, np.arange(len(r)))  # already forecast
    grid = np.stack([np.asarray(cal["grids"][key[m]]) for m in order])  # [k, levels, H, P]
    n_cal = np.array([max(cal["windows"][key[m]], 1) for m in order], np.float64)[:, None, None]
    pad = np.r_[pred, np.full((1, *pred.shape[1:]), np.nan)]  # row -1: a window that is none
    lo, hi = pad[..., [i for i, _ in pairs]][at], pad[..., [j for _, j in pairs]][at]
    y = np.r_[y, np.full((1, h), np.nan)][at]  # [k, n, H]
    g_, s_, p_ = np.arange(k)[:, None, None], np.arange(h)[None, :, None], np.arange(p)
    gained = np.zeros((k, n + 1, h, p))  # prefix sums of alpha - miss
    off = np.zeros((k, n, h, p))
    for t in range(n):
        level = 1 - (alpha + cal["gamma"] * gained[g_, known[:, t, :, None], s_, p_])
        x = np.clip(level * (n_cal + 1) / n_cal, 0, 1) * (levels - 1)
        i = np.minimum(x.astype(np.int64), levels - 2)
        frac = x - i
        off[:, t] = grid[g_, i, s_, p_] * (1 - frac) + grid[g_, i + 1, s_, p_] * frac
        yt = y[:, t, :, None]
        miss = (yt < lo[:, t] - off[:, t]) | (yt > hi[:, t] + off[:, t])
        gained[:, t + 1] = gained[:, t] + np.where(np.isfinite(yt), alpha - miss, 0)
    out = np.zeros((*pred.shape[:2], p))
    out[at[at >= 0]] = off[at >= 0]
    return out
