"""The conformal calibration applied to a forecast: the quantiles put in order, widened by
CQR's offsets or by adaptive conformal inference's (fitted by `foxhunt.evaluation.calibration`,
stored in a checkpoint and model.json as `calibration`)."""

from __future__ import annotations

from typing import Any

import numpy as np

POOLED = "*"  # the key of the offsets fitted on every instrument's windows
# the windows before each name's latest that predict replays after ACI's stored state, at most,
# in units of 1 / gamma: an error in the start shrinks about e-fold each 1 / gamma windows, so
# older ones change nothing measurable (docs/export.md)
REPLAY_GAMMAS = 5


def replay_plan(cal: dict[str, Any] | None) -> tuple[dict[str, int], int] | None:
    """For a calibration with ACI's stored state: each name's time up to which its outcomes are
    in the state (its windows with a step after it are replayed), under POOLED the latest of
    them (a name without a state of its own starts from the names' mean, which holds the
    outcomes up to there: its windows with a step after it are replayed), and the most windows
    replayed; None without one (every window replayed from the start)."""
    if not cal or cal.get("method") != "aci" or not cal.get("state"):
        return None
    seen = {n: min(v["seen_ns"]) for n, v in cal["state"].items() if n != POOLED}
    return seen | {POOLED: max(seen.values())}, int(np.ceil(REPLAY_GAMMAS / cal["gamma"]))


def stored_outputs(
    cal: dict[str, Any] | None, instrument: np.ndarray, origin_ns: np.ndarray, shape: tuple
) -> tuple[np.ndarray, np.ndarray]:
    """Which of the windows (by name and origin, in order by name then time) ACI's stored state
    holds the model's outputs of (its `bounds`: the test windows pending at the state's time,
    which the run forecast already), and those outputs `shape` [n, H, Q], normalized: the
    calibrated pairs' levels, NaN at the others (ACI reads no other of a window it replays).
    A name's latest window is never held: it is delivered whole."""
    held, out = np.zeros(len(origin_ns), bool), np.full(shape, np.nan, np.float32)
    state, pairs = (cal or {}).get("state") or {}, (cal or {}).get("pairs") or []
    lo, hi = [i for i, _ in pairs], [j for _, j in pairs]
    for i, (name, origin) in enumerate(zip(instrument, origin_ns, strict=True)):
        ends = state.get(str(name), {}).get("bounds", {}).get(str(int(origin)))
        if ends is not None:
            held[i] = True
            out[i][:, lo], out[i][:, hi] = ends
    if len(held):
        held[np.r_[instrument[1:] != instrument[:-1], True]] = False
    return held, out


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
    resume: bool = False,
) -> np.ndarray:
    """pred [n, H, Q] (normalized) calibrated by `method` (default the fit's): none (only put
    in order), cqr (the static offsets of the instrument, or the pooled ones) or aci (adapted
    to each realized outcome in `actual` [n, H], NaN where unknown, by `origin_ns` [n] and
    `target_ns` [n, H]; `resume`: from the calibration's stored `state`, where it has one,
    counting only the outcomes after it). `cal`: the calibration's dict (None: only in
    order)."""
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
    state = cal.get("state") if resume else None
    off, _ = aci(pred, actual, names, origin_ns, target_ns, cal, key, state)
    return _widen(pred, off, cal["pairs"], quantiles)


def adapted(
    pred: np.ndarray,
    cal: dict[str, Any],
    instrument: np.ndarray,
    actual: np.ndarray,
    origin_ns: np.ndarray,
    target_ns: np.ndarray,
) -> dict[str, Any]:
    """ACI's state at each instrument's last window (`apply`'s arguments), JSON-ready: a
    checkpoint's and model.json's `calibration.state`, where predict and the consumer resume
    (#68). By name: its adapted miscoverage [H][P] from the outcomes realised by its last
    window's origin, the target time [H] of the last one, and the offsets [H][P] of its windows
    with a step after it (by origin: their outcomes there will count by them); under POOLED the
    names' mean miscoverage, where a name with no state of its own starts. A replay of the
    windows with a step after that time, from the state, is the run straight through."""
    names = np.asarray([str(x) for x in instrument], dtype=object)
    key = {n: n if n in cal["offsets"] else POOLED for n in dict.fromkeys(names)}
    last = {n: origin_ns[names == n].max() for n in key}
    by_then = target_ns <= np.array([last[n] for n in names])[:, None]
    return aci(pred, np.where(by_then, actual, np.nan), names, origin_ns, target_ns, cal, key)[1]


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
    state: dict[str, Any] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """[n, H, P] adaptive conformal inference's offsets (Gibbs and Candes 2021) along each
    instrument's windows in time order: alpha_t+1 = alpha_t + gamma (alpha - miss_t), counting
    only the outcomes known at the forecast's origin; the offset is the score quantile at
    (1 - alpha_t)(n + 1) / n, read off the fit's grid of the instrument's `key`. From `state`
    (`adapted`'s), each name starts at its stored miscoverage (POOLED's without one) and
    counts only the outcomes after its stored time. Also the state after the windows.

    The recursion runs along time, every instrument at once (its t-th window beside the others'
    t-th): one step per window of the longest history, not one per window of the panel (#68: a
    250-name panel's windows one at a time took minutes)."""
    q, pairs, levels, gamma = cal["quantiles"], cal["pairs"], cal["grid_levels"], cal["gamma"]
    alpha = np.array([1 - (q[j] - q[i]) for i, j in pairs])  # each pair's miscoverage
    if not len(names):
        return np.zeros((*pred.shape[:2], len(pairs))), dict(state or {})
    order, at, known = _in_time(names, origin, target)
    (k, n), (h, p) = at.shape, (y.shape[1], len(pairs))
    start, seen, stored = _start(state or {}, order, alpha, (h, p))
    held = _held(stored, order, at, origin, (h, p))
    grid = np.stack([np.asarray(cal["grids"][key[m]]) for m in order])  # [k, levels, H, P]
    n_cal = np.array([max(cal["windows"][key[m]], 1) for m in order], np.float64)[:, None, None]
    pad = np.r_[pred, np.full((1, *pred.shape[1:]), np.nan)]  # row -1: a window that is none
    lo, hi = pad[..., [i for i, _ in pairs]][at], pad[..., [j for _, j in pairs]][at]
    y = np.r_[y, np.full((1, h), np.nan)][at]  # [k, n, H]
    ends = np.r_[target, np.full((1, h), np.iinfo(np.int64).min)][at]
    y[ends <= seen[:, None, :]] = np.nan  # counted in the state already
    g_, s_, p_ = np.arange(k)[:, None, None], np.arange(h)[None, :, None], np.arange(p)
    gained = np.zeros((k, n + 1, h, p))  # prefix sums of alpha - miss, from the start's
    gained[:] = ((start - alpha) / gamma)[:, None]
    off = np.zeros((k, n, h, p))
    for t in range(n):
        level = 1 - (alpha + gamma * gained[g_, known[:, t, :, None], s_, p_])
        x = np.clip(level * (n_cal + 1) / n_cal, 0, 1) * (levels - 1)
        i = np.minimum(x.astype(np.int64), levels - 2)
        frac = x - i
        off[:, t] = grid[g_, i, s_, p_] * (1 - frac) + grid[g_, i + 1, s_, p_] * frac
        off[:, t] = np.where(np.isnan(held[:, t]), off[:, t], held[:, t])
        yt = y[:, t, :, None]
        miss = (yt < lo[:, t] - off[:, t]) | (yt > hi[:, t] + off[:, t])
        gained[:, t + 1] = gained[:, t] + np.where(np.isfinite(yt), alpha - miss, 0)
    out = np.zeros((*pred.shape[:2], p))
    out[at[at >= 0]] = off[at >= 0]
    counted = np.maximum(seen, np.where(np.isfinite(y), ends, np.iinfo(np.int64).min).max(axis=1))
    later = (at >= 0) & (ends > counted[:, None, :]).any(axis=2)
    mis = alpha + gamma * gained[:, n]
    return out, _state(state or {}, order, mis, counted, *_pending(later, at, origin, off, lo, hi))


def _pending(
    later: np.ndarray, at: np.ndarray, origin: np.ndarray, *held: np.ndarray
) -> tuple[list[dict[int, list]], list[dict[int, list]]]:
    """By name, of each window with a step after the state's time (`later` [k, n]), by origin:
    its offsets (its outcomes there will count by them) and the model's interval ends (a replay
    from the state need not run the model on it again); `held`: the offsets, lo and hi [k, n,
    H, P]."""
    off, lo, hi = held
    rows = [np.flatnonzero(r) for r in later]
    pending = [{int(origin[at[g, t]]): off[g, t].tolist() for t in r} for g, r in enumerate(rows)]
    bounds = [
        {int(origin[at[g, t]]): [lo[g, t].tolist(), hi[g, t].tolist()] for t in r}
        for g, r in enumerate(rows)
    ]
    return pending, bounds


def _in_time(
    names: np.ndarray, origin: np.ndarray, target: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The instruments (sorted), each one's t-th window [k, n] in time order (-1: none, past its
    last), and [k, n, H] how many of its windows before the t-th had that step's outcome
    realised by the t-th's origin."""
    order, code = np.unique(names.astype(str), return_inverse=True)
    by = np.lexsort((origin, code.ravel()))  # by instrument, then in time
    rows = np.split(by, np.flatnonzero(np.diff(code.ravel()[by])) + 1)
    at = np.full((len(order), max(len(r) for r in rows)), -1)
    known = np.zeros((*at.shape, target.shape[1]), np.int64)
    for g, r in enumerate(rows):
        at[g, : len(r)] = r
        for s in range(target.shape[1]):
            realized = np.searchsorted(target[r, s], origin[r], side="right")
            known[g, : len(r), s] = np.minimum(realized, np.arange(len(r)))  # already forecast
    return order, at, known


def _held(
    stored: dict[str, dict[int, list]],
    order: np.ndarray,
    at: np.ndarray,
    origin: np.ndarray,
    shape: tuple[int, int],
) -> np.ndarray:
    """[k, n, H, P] the offsets the state holds for a window (by its origin), NaN elsewhere."""
    held = np.full((*at.shape, *shape), np.nan)
    for g, name in enumerate(order):
        pending, rows = stored.get(name, {}), at[g][at[g] >= 0]
        for t in np.flatnonzero(np.isin(origin[rows], list(pending))):
            held[g, t] = pending[int(origin[rows[t]])]
    return held


def _start(
    state: dict[str, Any], order: np.ndarray, alpha: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, dict[str, dict[int, list]]]:
    """Each name's starting miscoverage [k, H, P], the time [k, H] up to which its outcomes
    are counted in it (its own stored state, else POOLED's miscoverage with none counted, else
    the nominal), and its pending windows' offsets by origin."""
    none = np.iinfo(np.int64).min
    pooled = state.get(POOLED)
    start = np.broadcast_to(alpha, shape) if pooled is None else np.asarray(pooled["miscoverage"])
    mis = np.stack([np.asarray(state[m]["miscoverage"]) if m in state else start for m in order])
    seen = [state[m]["seen_ns"] if m in state else [none] * shape[0] for m in order]
    pending = {
        m: {int(o): v for o, v in state[m].get("pending", {}).items()} for m in order if m in state
    }
    return mis.astype(np.float64), np.array(seen, np.int64), pending


def _state(
    before: dict[str, Any],
    order: np.ndarray,
    miscoverage: np.ndarray,
    seen: np.ndarray,
    pending: list[dict[int, list]],
    bounds: list[dict[int, list]],
) -> dict[str, Any]:
    """The stored state (`adapted`), the names in `order` updated, others kept; POOLED their
    mean. `pending`: by name, the offsets [H][P] of each window (by its origin, a string in
    JSON) with a step after the state's time; `bounds`: the model's [lo, hi] [2][H][P] there."""
    state = {n: v for n, v in before.items() if n != POOLED}
    none = np.iinfo(np.int64).min
    for m, mis, ns, held, ends in zip(order, miscoverage, seen, pending, bounds, strict=True):
        if (ns > none).any():  # a name with an outcome counted
            state[str(m)] = {
                "miscoverage": mis.tolist(),
                "seen_ns": [int(v) for v in ns],
                "pending": {str(o): v for o, v in held.items()},
                "bounds": {str(o): v for o, v in ends.items()},
            }
    if state:
        mean = np.mean([v["miscoverage"] for v in state.values()], axis=0)
        state[POOLED] = {"miscoverage": mean.tolist(), "seen_ns": None}
    return state
