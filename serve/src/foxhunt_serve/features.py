"""The features foxhunt derives from OHLCV bars and from the time."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from foxhunt_serve.errors import InputError
from foxhunt_serve.read import DAY_NS


def _prefix(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x) + 1)
    out[0] = 0.0
    np.cumsum(x, out=out[1:])
    return out


def _window_sum(prefix: np.ndarray, w: int) -> np.ndarray:
    """Sum of rows t-w+1..t from a prefix sum; NaN for t < w - 1."""
    n = len(prefix) - 1
    out = np.full(n, np.nan)
    if w <= n:
        out[w - 1 :] = prefix[w:] - prefix[: n - w + 1]
    return out


def _rolling(x: np.ndarray, w: int, op: Any) -> np.ndarray:
    """`op` (np.max, np.min) of rows t-w+1..t; NaN for t < w - 1."""
    out = np.full(len(x), np.nan)
    if w <= len(x):
        out[w - 1 :] = op(np.lib.stride_tricks.sliding_window_view(x, w), axis=1)
    return out


class Ohlcv:
    """The features of one instrument's bars, by family and window (model.json's
    `derivations`), each rounded to float32 as foxhunt computes them."""

    def __init__(self, t: np.ndarray, cols: dict[str, np.ndarray], ohlcv: dict[str, Any]):
        self.t = t
        self.high, self.low, self.close = (cols[ohlcv[p]] for p in ("high", "low", "close"))
        if len(t) and not all(np.isfinite(a).all() and (a > 0).all() for a in self.prices()):
            raise InputError("high, low and close prices must be finite and positive")
        self.volume = cols[ohlcv["volume"]]
        self.logc = np.log(self.close)
        ret = np.full(len(t), np.nan)
        ret[1:] = np.diff(self.logc)
        self.ret = ret
        ret0 = np.nan_to_num(ret, nan=0.0)
        self.p_ret, self.p_ret2 = _prefix(ret0), _prefix(ret0 * ret0)

    def prices(self) -> tuple[np.ndarray, ...]:
        return self.high, self.low, self.close

    def rvol(self, w: int) -> np.ndarray:
        s2 = _window_sum(self.p_ret2, w)
        if w <= len(self.t):
            s2[w - 1] = np.nan  # its window would hold r_0, which does not exist
        return np.sqrt(np.maximum(s2, 0.0) / w)

    def feature(self, family: str, w: int) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            if family == "log_return":
                val = self.ret
            elif family == "logret":
                val = np.full(len(self.t), np.nan)
                if w < len(self.t):
                    val[w:] = self.logc[w:] - self.logc[:-w]
            elif family == "rvol":
                val = self.rvol(w)
            elif family == "mom":
                s, vol = _window_sum(self.p_ret, w), self.rvol(w)
                den = math.sqrt(w) * vol
                val = np.where(den > 1e-12, s / np.where(den > 1e-12, den, 1.0), 0.0)
                val[np.isnan(vol)] = np.nan
            elif family == "volz":
                x = np.log1p(np.maximum(self.volume, 0.0))
                mean = _window_sum(_prefix(x), w) / w
                var = _window_sum(_prefix(x * x), w) / w - mean * mean
                ok = var > 1e-10 * np.maximum(1.0, mean * mean)
                val = np.where(ok, (x - mean) / np.sqrt(np.where(ok, var, 1.0)), 0.0)
                val[np.isnan(mean)] = np.nan
            elif family in ("range", "clv"):
                mx, mn = _rolling(self.high, w, np.max), _rolling(self.low, w, np.min)
                if family == "range":
                    val = np.log(mx / mn)
                else:
                    rng = mx - mn
                    val = np.where(rng > 0, (self.close - mn) / np.where(rng > 0, rng, 1.0), 0.5)
                    val = np.clip(val, 0.0, 1.0)
                    val[np.isnan(mx)] = np.nan
            else:
                raise InputError(f"model.json names a feature family this script lacks: {family}")
        return val.astype(np.float32).astype(np.float64)


def calendar(t: np.ndarray, name: str) -> np.ndarray:
    """A calendar encoding of int64 ns UTC times (model.json's `derivations`), float32."""
    day = np.floor_divide(t, DAY_NS)
    sec = (t - day * DAY_NS) / 1e9
    if name in ("tod_sin", "tod_cos"):
        tod = 2.0 * np.pi * sec / 86_400.0
        val = np.sin(tod) if name == "tod_sin" else np.cos(tod)
    elif name in ("dow_sin", "dow_cos"):
        dow = 2.0 * np.pi * ((day + 3) % 7) / 7.0  # 1970-01-01 was a Thursday
        val = np.sin(dow) if name == "dow_sin" else np.cos(dow)
    elif name == "to_cash_close":
        val = (np.mod(20 * 60 - sec / 60.0 + 720.0, 1440.0) - 720.0) / 720.0
    else:
        raise InputError(f"model.json names a calendar feature this script lacks: {name}")
    return val.astype(np.float32).astype(np.float64)
