"""The conformal calibration of the forecast (`foxhunt.evaluation.calibration`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from foxhunt_serve.windows import Windows


def in_order(pred: np.ndarray, quantiles: list[float]) -> np.ndarray:
    """Lower levels capped at the median, upper ones floored at it, then each step sorted."""
    out = pred.copy()
    m = next((i for i, q in enumerate(quantiles) if abs(q - 0.5) < 1e-6), None)
    if m is not None:
        out[..., :m] = np.minimum(out[..., :m], out[..., m : m + 1])
        out[..., m + 1 :] = np.maximum(out[..., m + 1 :], out[..., m : m + 1])
    return np.sort(out, axis=-1)


def calibrate(pred: np.ndarray, w: Windows, meta: dict[str, Any]) -> np.ndarray:
    """pred [n, H, Q] (normalized) with model.json's calibration: cqr's offsets (the
    instrument's, or the pooled "*"), or aci's, walking each instrument's windows in time
    order and moving each interval's level after every realized target (known at or before
    the forecast's origin); the interval [lo - offset, hi + offset]."""
    cal, quantiles = meta.get("calibration"), meta["quantiles"]
    if not cal or not cal["offsets"]:
        return in_order(pred, quantiles)
    lo, hi = [p[0] for p in cal["pairs"]], [p[1] for p in cal["pairs"]]
    names = np.array([str(x) for x in w.instrument], dtype=object)
    key = {n: n if n in cal["offsets"] else "*" for n in set(names)}
    off = np.stack([np.asarray(cal["offsets"][key[n]]) for n in names]) if len(names) else 0.0
    if cal["method"] == "aci":
        actual = (w.actual - meta["target"]["mean"]) / meta["target"]["std"]
        off = np.zeros((*pred.shape[:2], len(lo)))
        for name in set(names):
            rows = np.flatnonzero(names == name)
            rows = rows[np.argsort(w.origin_ns[rows], kind="stable")]
            off[rows] = aci_offsets(pred[rows], actual[rows], w, rows, cal, key[name])
    out = pred.copy()
    out[..., lo] -= off
    out[..., hi] += off
    return in_order(out, quantiles)


def aci_offsets(
    pred: np.ndarray, y: np.ndarray, w: Windows, rows: np.ndarray, cal: dict, key: str
) -> np.ndarray:
    """[n, H, P] adaptive conformal inference's offsets (Gibbs and Candes 2021) along one
    instrument's windows: alpha_t+1 = alpha_t + gamma (alpha - miss_t), the offset the score
    quantile at (1 - alpha_t)(n + 1) / n."""
    q, lo, hi = cal["quantiles"], [p[0] for p in cal["pairs"]], [p[1] for p in cal["pairs"]]
    alpha = np.array([1 - (q[j] - q[i]) for i, j in cal["pairs"]])
    grid, n_cal = np.asarray(cal["grids"][key]), max(cal["windows"][key], 1)
    levels = cal["grid_levels"]
    origin, target = w.origin_ns[rows], w.target_ns[rows]
    n, h = y.shape
    known = np.stack([np.searchsorted(target[:, k], origin, side="right") for k in range(h)], 1)
    known = np.minimum(known, np.arange(n)[:, None])
    steps, pairs = np.arange(h)[:, None], np.arange(len(lo))[None, :]
    gained = np.zeros((n + 1, h, len(lo)))
    off = np.empty((n, h, len(lo)))
    for t in range(n):
        level = 1 - (alpha + cal["gamma"] * gained[known[t], np.arange(h)])
        x = np.clip(level * (n_cal + 1) / n_cal, 0, 1) * (levels - 1)
        i = np.minimum(x.astype(np.int64), levels - 2)
        off[t] = grid[i, steps, pairs] * (1 - (x - i)) + grid[i + 1, steps, pairs] * (x - i)
        miss = (y[t, :, None] < pred[t][:, lo] - off[t]) | (y[t, :, None] > pred[t][:, hi] + off[t])
        gained[t + 1] = gained[t] + np.where(np.isfinite(y[t])[:, None], alpha - miss, 0)
    return off
