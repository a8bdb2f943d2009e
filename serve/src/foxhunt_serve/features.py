"""The features derived from OHLCV bars and from the time: this module is their definition,
for training (`foxhunt.data.features` plans which to make) and serving alike.

Everything works on ONE instrument's time-ordered arrays and is **causal**: the value at row
``t`` uses rows ``<= t`` only. Rolling statistics come from cumulative sums (means, variances)
and a doubling table (rolling max/min), so a few hundred features over tens of thousands of
rows take milliseconds. Every value is rounded to float32.

Notation: ``o_t`` open, ``c_t`` close, ``h_t`` high, ``l_t`` low, ``v_t`` volume,
``r_t = log(c_t / c_{t-1})`` the 1-bar log return, ``x_t = log1p(max(v_t, 0))``. A window
``w`` covers rows ``t-w+1 .. t``.

Target (family ``log_return``)
    ``r_t`` (NaN at ``t = 0``). The model sees it as target history, not as an observed input.

Observed families (a feature is named ``<family>_<w>``)
    ``logret``  ``log(c_t / c_{t-w})``; NaN for ``t < w``.
    ``rvol``    realized volatility ``sqrt(max(sum r^2, 0) / w)`` over the window, ``r_0`` taken
                as 0; NaN for ``t < w``.
    ``volz``    volume z-score ``(x_t - mean(x)) / std(x)`` over the window (population std; 0
                where ``var <= 1e-10 * max(1, mean^2)``); NaN for ``t < w - 1``.
    ``range``   ``log(max h / min l)`` over the window; NaN for ``t < w - 1``.
    ``clv``     close location ``(c_t - min l) / (max h - min l)`` over the window, clipped to
                ``[0, 1]``; 0.5 where the range is 0; NaN for ``t < w - 1``.
    ``gap``     the overnight return ``sum log(o_s / c_{s-1})`` over the window: the move between
                one bar's close and the next one's open, which no other family sees (the open is
                in none of them); NaN for ``t < w``.
    ``mom``     normalized momentum ``sum(r) / (sqrt(w) * rvol_w)``, ``r_0`` taken as 0: the mean
                return in units of its standard error; 0 where ``sqrt(w) * rvol_w <= 1e-12``;
                NaN for ``t < w``.

Calendar features (known in advance), from the bar's local time in the exchange's time zone
(`foxhunt_serve.clock.Clock`, model.json's ``data.calendar``; UTC without one), never NaN; bars
all stamped at midnight UTC are dates, read in UTC (`Clock.dated`: a daily bar's weekday is its
date's in every zone)
    ``tod_sin``, ``tod_cos``   ``sin``/``cos`` of ``2 pi s / 86400``, ``s`` the seconds since
                               local midnight.
    ``dow_sin``, ``dow_cos``   ``sin``/``cos`` of ``2 pi d / 7``, ``d`` the local weekday
                               (Monday 0).
    ``to_cash_close``          signed minutes to the cash close at local minute ``C`` (``close``;
                               20:00 = 1200 in UTC), ``((C - s / 60 + 720) mod 1440 - 720) / 720``:
                               0 at the close, positive before it, jumping from -1 to +1 twelve
                               hours after it.
"""

from __future__ import annotations

import math

import numpy as np

from foxhunt_serve.clock import DAY_NS, Clock
from foxhunt_serve.errors import DataError, InputError

FAMILIES = ("logret", "rvol", "volz", "range", "clv", "mom", "gap")  # the observed ones, in order
CALENDAR = ("tod_sin", "tod_cos", "dow_sin", "dow_cos", "to_cash_close")
CASH_CLOSE_MIN = 20 * 60  # 20:00: the close in UTC (data.calendar.close's default there)


def warmup(family: str, w: int) -> int:
    """The leading rows of a feature that are NaN."""
    return w if family in ("logret", "rvol", "mom", "gap") else w - 1


def _prefix(x: np.ndarray) -> np.ndarray:
    """Cumulative sum with a leading zero: ``S[t+1] = sum(x[:t+1])``."""
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


class _RollingExtreme:
    """Rolling max (or min) for many windows via a doubling table: ``O(n log w)`` to build
    (a sliding window's max is ``O(n w)``: minutes for windows of 512 bars)."""

    def __init__(self, x: np.ndarray, op: np.ufunc) -> None:
        self._op = op
        self._levels = [np.asarray(x, dtype=np.float64)]  # level j: window 2**j, valid t >= 2**j-1

    def _level(self, j: int) -> np.ndarray:
        while len(self._levels) <= j:
            k = len(self._levels) - 1
            prev, step = self._levels[k], 1 << k
            nxt = np.full(len(prev), np.nan)
            if step < len(prev):
                nxt[step:] = self._op(prev[step:], prev[:-step])
            self._levels.append(nxt)
        return self._levels[j]

    def __call__(self, w: int) -> np.ndarray:
        j = w.bit_length() - 1  # 2**j <= w < 2**(j+1)
        lvl = self._level(j)
        shift = w - (1 << j)
        if shift == 0:
            return lvl
        out = np.full(len(lvl), np.nan)
        if shift < len(lvl):
            out[shift:] = self._op(lvl[shift:], lvl[:-shift])
        return out


class Ohlcv:
    """The features of one instrument's bars, by family and window (float32)."""

    def __init__(
        self,
        high: np.ndarray,
        low: np.ndarray,
        close: np.ndarray,
        volume: np.ndarray,
        open: np.ndarray | None = None,  # only the gap family needs it
    ) -> None:
        prices = (("high", high), ("low", low), ("close", close), ("open", open))
        for name, a in prices:
            if a is not None and len(a) and not (np.isfinite(a).all() and (a > 0).all()):
                raise DataError(f"{name} prices must be finite and positive")
        self.close, self.volume, self.open = close, volume, open
        self.logc = np.log(close)
        self.ret = np.full(len(close), np.nan)
        self.ret[1:] = np.diff(self.logc)
        ret0 = np.nan_to_num(self.ret, nan=0.0)
        self.p_ret, self.p_ret2 = _prefix(ret0), _prefix(ret0 * ret0)
        self.p_x = self.p_x2 = None
        self.high_max = _RollingExtreme(high, np.maximum)
        self.low_min = _RollingExtreme(low, np.minimum)
        self._rvol: dict[int, np.ndarray] = {}

    def rvol(self, w: int) -> np.ndarray:
        if w not in self._rvol:
            s2 = _window_sum(self.p_ret2, w)
            if w <= len(self.close):
                s2[w - 1] = np.nan  # its window would hold r_0, which does not exist
            self._rvol[w] = np.sqrt(np.maximum(s2, 0.0) / w)
        return self._rvol[w]

    def feature(self, family: str, w: int = 1) -> np.ndarray:
        """One feature (the module docstring defines each family), as float32."""
        with np.errstate(invalid="ignore", divide="ignore"):
            if family == "log_return":
                val = self.ret
            elif family == "logret":
                val = np.full(len(self.close), np.nan)
                if w < len(self.close):
                    val[w:] = self.logc[w:] - self.logc[:-w]
            elif family == "rvol":
                val = self.rvol(w)
            elif family == "mom":
                s, vol = _window_sum(self.p_ret, w), self.rvol(w)
                den = math.sqrt(w) * vol
                val = np.where(den > 1e-12, s / np.where(den > 1e-12, den, 1.0), 0.0)
                val[np.isnan(vol)] = np.nan
            elif family == "volz":
                val = self._volz(w)
            elif family == "gap":
                val = self._gap(w)
            elif family in ("range", "clv"):
                mx, mn = self.high_max(w), self.low_min(w)
                if family == "range":
                    val = np.log(mx / mn)
                else:
                    rng = mx - mn
                    val = np.where(rng > 0, (self.close - mn) / np.where(rng > 0, rng, 1.0), 0.5)
                    val = np.clip(val, 0.0, 1.0)
                    val[np.isnan(mx)] = np.nan
            else:
                raise InputError(f"no feature family {family} in foxhunt_serve.features")
        return val.astype(np.float32)

    def _gap(self, w: int) -> np.ndarray:
        if self.open is None:
            raise InputError("the gap features need the bars' open prices")
        gap = np.zeros(len(self.close))
        gap[1:] = np.log(self.open[1:]) - self.logc[:-1]
        val = _window_sum(_prefix(gap), w)
        val[:w] = np.nan  # its first window would hold the first bar's, which has no close before
        return val

    def _volz(self, w: int) -> np.ndarray:
        x = np.log1p(np.maximum(self.volume, 0.0))
        if self.p_x is None:
            self.p_x, self.p_x2 = _prefix(x), _prefix(x * x)
        mean = _window_sum(self.p_x, w) / w
        var = _window_sum(self.p_x2, w) / w - mean * mean
        ok = var > 1e-10 * np.maximum(1.0, mean * mean)
        val = np.where(ok, (x - mean) / np.sqrt(np.where(ok, var, 1.0)), 0.0)
        val[np.isnan(mean)] = np.nan
        return val


def calendar(t: np.ndarray, name: str, clock: Clock | None = None) -> np.ndarray:
    """A calendar feature of int64 ns UTC times (the module docstring) on `clock` (None: UTC,
    the close at 20:00), as float32."""
    close_min = CASH_CLOSE_MIN if clock is None else clock.close_min
    t = t if clock is None else clock.dated(t).local(t)  # dates: their own day in every zone
    day = np.floor_divide(t, DAY_NS)
    sec = (t - day * DAY_NS) / 1e9
    if name in ("tod_sin", "tod_cos"):
        tod = 2.0 * np.pi * sec / 86_400.0
        val = np.sin(tod) if name == "tod_sin" else np.cos(tod)
    elif name in ("dow_sin", "dow_cos"):
        dow = 2.0 * np.pi * ((day + 3) % 7) / 7.0  # 1970-01-01 was a Thursday; Monday 0
        val = np.sin(dow) if name == "dow_sin" else np.cos(dow)
    elif name == "to_cash_close":
        val = (np.mod(close_min - sec / 60.0 + 720.0, 1440.0) - 720.0) / 720.0
    else:
        raise InputError(f"no calendar feature {name} in foxhunt_serve.features")
    return val.astype(np.float32)
