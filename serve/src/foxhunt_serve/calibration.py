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
    off = np.zeros((*pred.shape[:2], len(cal["pairs"])))
    for name in key:
        rows = np.flatnonzero(names == name)
        rows = rows[np.argsort(origin_ns[rows], kind="stable")]
        off[rows] = aci_offsets(
            pred[rows], actual[rows], origin_ns[rows], target_ns[rows], cal, key[name]
        )
    return _widen(pred, off, cal["pairs"], quantiles)


def _widen(pred: np.ndarray, off: Any, pairs: list, quantiles: list[float]) -> np.ndarray:
    """Each pair's interval [lo - offset, hi + offset], then in order."""
    out = np.array(pred, dtype=np.float64)
    out[..., [i for i, _ in pairs]] -= off
    out[..., [j for _, j in pairs]] += off
    return in_order(out, quantiles)


def aci_offsets(
    pred: np.ndarray, y: np.ndarray, origin: np.ndarray, target: np.ndarray, cal: dict, key: str
) -> np.ndarray:
    """[n, H, P] adaptive conformal inference's offsets (Gibbs and Candes 2021) along one
    instrument's windows in time order: alpha_t+1 = alpha_t + gamma (alpha - miss_t), counting
    only the outcomes known at the forecast's origin; the offset is the score quantile at
    (1 - alpha_t)(n + 1) / n, read off the fit's grid."""
    q, pairs = cal["quantiles"], cal["pairs"]
    alpha = np.array([1 - (q[j] - q[i]) for i, j in pairs])  # each pair's miscoverage
    grid, n_cal, levels = (
        np.asarray(cal["grids"][key]),
        max(cal["windows"][key], 1),
        cal["grid_levels"],
    )
    lo, hi = pred[..., [i for i, _ in pairs]], pred[..., [j for _, j in pairs]]
    n, h = y.shape
    known = np.stack([np.searchsorted(target[:, k], origin, side="right") for k in range(h)], 1)
    known = np.minimum(known, np.arange(n)[:, None])  # only windows already forecast
    steps, p = np.arange(h)[:, None], np.arange(len(pairs))[None, :]
    gained = np.zeros((n + 1, h, len(pairs)))  # prefix sums of alpha - miss
    off = np.empty((n, h, len(pairs)))
    realized = np.isfinite(y)
    for t in range(n):
        level = 1 - (alpha + cal["gamma"] * gained[known[t], np.arange(h)])
        x = np.clip(level * (n_cal + 1) / n_cal, 0, 1) * (levels - 1)
        i = np.minimum(x.astype(np.int64), levels - 2)
        frac = x - i
        off[t] = grid[i, steps, p] * (1 - frac) + grid[i + 1, steps, p] * frac
        miss = (y[t, :, None] < lo[t] - off[t]) | (y[t, :, None] > hi[t] + off[t])
        gained[t + 1] = gained[t] + np.where(realized[t, :, None], alpha - miss, 0)
    return off
