"""Features derived from raw OHLCV bars, one instrument at a time.

Everything here works on ONE instrument's contiguous, time-ordered arrays and is **causal**:
the value at row ``t`` uses rows ``<= t`` only. Rolling statistics are computed with cumulative
sums (means, variances) and a doubling table (rolling max/min), so a few hundred features over
tens of thousands of rows take milliseconds.

Notation: ``c_t`` close, ``h_t`` high, ``l_t`` low, ``v_t`` volume, ``r_t = log(c_t / c_{t-1})``
the 1-bar log return, ``x_t = log1p(v_t)``. A window ``w`` covers rows ``t-w+1 .. t``.

Target
    ``r_t`` (NaN at ``t = 0``). It is not an observed feature: the model sees it as target
    history. This is why lag 1 is not among the default return lags.

Observed feature families (name ``<family>_<k>``)
    ``logret_k``  ``log(c_t / c_{t-k})``; needs ``k`` previous rows.
    ``rvol_w``    realized volatility ``sqrt(mean(r^2))`` over the window; needs ``w`` rows of
                  returns, i.e. ``w`` previous rows.
    ``volz_w``    volume z-score ``(x_t - mean(x)) / std(x)`` over the window (population std;
                  0 where the std is (numerically) zero); ``w >= 2``.
    ``range_w``   ``log(max h / min l)`` over the window (``w = 1``: this bar's range).
    ``clv_w``     close location ``(c_t - min l) / (max h - min l)`` in ``[0, 1]`` over the
                  window; 0.5 where the range is zero.
    ``mom_w``     normalised momentum ``sum(r) / (sqrt(w) * rvol_w)`` over the window: the mean
                  return in units of its standard error, a t-statistic of drift, bounded by
                  ``sqrt(w)``; 0 where ``rvol_w`` is zero. (The plain rolling mean of returns
                  would be ``logret_w / w``, a duplicate.)

Known (calendar) features, deterministic from the bar timestamp (UTC), never NaN
    ``tod_sin``, ``tod_cos``   time of day: ``2*pi*seconds_since_midnight/86400``.
    ``dow_sin``, ``dow_cos``   day of week: ``2*pi*weekday/7`` (Monday = 0).
    ``to_cash_close``          signed minutes to the next/last US cash close at 20:00 UTC,
                               wrapped to ``[-720, 720)`` and divided by 720: 0 at the close,
                               positive before it (about 0.9 at the 13:30 UTC open), negative
                               after it, jumping from -1 to +1 at 08:00 UTC.

Warm-up
    The number of leading rows with a NaN in any output (target included):
    ``max(1, lags k, rvol/mom windows w, volz/range/clv windows w - 1)``.

Extension to ``num_features``
    With ``OhlcvSpec.num_features = N`` the observed list is the base list (the spec's
    families, in the order above) followed by extension features, cut to ``N - known`` names.
    Extension features come round-robin over the families ``logret, rvol, volz, range, clv,
    mom``: each turn a family takes the smallest window of the grid ``G`` it does not have yet
    (and that is at least its minimum: 2 for ``logret``, ``rvol``, ``mom``; 4 for ``volz``; 1
    for ``range`` and ``clv``); a family whose grid is used up drops out.
    ``G = {1} U unique(round(2 ** (i / 6))) for i = 6 .. 54`` (geometric, ratio 2^(1/6), from 2
    to 512): windows are never longer than 512 bars. ``N`` below the known count, or above
    what the grid allows (about 260), is a :class:`~foxhunt.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from foxhunt.errors import ConfigError, DataError

__all__ = [
    "OhlcvSpec",
    "DerivedFeatures",
    "KNOWN_CALENDAR",
    "INTRADAY_CALENDAR",
    "EXTENSION_GRID",
    "ohlcv_spec",
    "feature_names",
    "feature_plan",
    "warmup_of",
    "derive_features",
]

KNOWN_CALENDAR: tuple[str, ...] = ("tod_sin", "tod_cos", "dow_sin", "dow_cos", "to_cash_close")
"""Names of the calendar (known-future) features, in order."""
INTRADAY_CALENDAR: tuple[str, ...] = ("tod_sin", "tod_cos", "to_cash_close")
"""The calendar features of intraday bars only (`OhlcvSpec.intraday`)."""

MAX_EXTENSION_WINDOW = 512
EXTENSION_GRID: tuple[int, ...] = tuple(
    sorted({1} | {int(round(2 ** (i / 6))) for i in range(6, 55)})
)
"""Windows the ``num_features`` extension draws from (geometric, 1 .. 512)."""

# Family order: base list order and round-robin order of the extension.
_FAMILIES: tuple[str, ...] = ("logret", "rvol", "volz", "range", "clv", "mom")
_SPEC_FIELD = {
    "logret": "return_lags",
    "rvol": "volatility_windows",
    "volz": "volume_windows",
    "range": "range_windows",
    "clv": "location_windows",
    "mom": "momentum_windows",
}
_MIN_WINDOW = {"logret": 1, "rvol": 1, "volz": 2, "range": 1, "clv": 1, "mom": 1}
_MIN_EXTENSION = {"logret": 2, "rvol": 2, "volz": 4, "range": 1, "clv": 1, "mom": 2}

_NS_PER_DAY = 86_400 * 1_000_000_000
_CASH_CLOSE_MIN = 20 * 60  # 20:00 UTC


def _as_windows(name: str, value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int | np.integer):
        value = (value,)
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"features.{name} must be a list of integers, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise ConfigError(f"features.{name} must hold integers, got {v!r}")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise ConfigError(f"features.{name} has duplicates: {out}")
    return tuple(out)


@dataclass(frozen=True)
class OhlcvSpec:
    """Which OHLCV features to derive (see the module docstring for the definitions)."""

    return_lags: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    volatility_windows: tuple[int, ...] = (6, 12, 24, 48, 96)
    volume_windows: tuple[int, ...] = (12, 48, 96)
    range_windows: tuple[int, ...] = (1, 12)
    location_windows: tuple[int, ...] = (1, 12)
    momentum_windows: tuple[int, ...] = ()
    calendar: bool = True
    # the time-of-day and cash-session encodings (INTRADAY_CALENDAR): a daily bar has none
    intraday: bool = True
    num_features: int | None = None

    def __post_init__(self) -> None:
        for fam, fname in _SPEC_FIELD.items():
            wins = _as_windows(fname, getattr(self, fname))
            low = _MIN_WINDOW[fam]
            bad = [w for w in wins if w < low]
            if bad:
                raise ConfigError(f"features.{fname} must be >= {low}, got {bad}")
            object.__setattr__(self, fname, wins)
        object.__setattr__(self, "calendar", bool(self.calendar))
        object.__setattr__(self, "intraday", bool(self.intraday))
        nf = self.num_features
        if nf is not None:
            if isinstance(nf, bool) or not isinstance(nf, int | np.integer):
                raise ConfigError(f"features.num_features must be an integer, got {nf!r}")
            object.__setattr__(self, "num_features", int(nf))
        _plan(self)  # validate num_features now rather than at first use


def ohlcv_spec(**overrides: Any) -> OhlcvSpec:
    """Build an :class:`OhlcvSpec` from keyword overrides (lists accepted, unknown keys refused)."""
    known = {f.name for f in dataclasses.fields(OhlcvSpec)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown feature option(s) {unknown}; known: {sorted(known)}")
    return OhlcvSpec(**overrides)


def _plan(spec: OhlcvSpec) -> tuple[list[tuple[str, int]], list[str]]:
    known = [k for k in KNOWN_CALENDAR if spec.intraday or k not in INTRADAY_CALENDAR]
    known = known if spec.calendar else []
    base = [(fam, w) for fam in _FAMILIES for w in getattr(spec, _SPEC_FIELD[fam])]
    if spec.num_features is None:
        return base, known
    n_obs = spec.num_features - len(known)
    if n_obs < 0:
        raise ConfigError(
            f"features.num_features={spec.num_features} is smaller than the "
            f"{len(known)} calendar features"
        )
    if n_obs <= len(base):
        return base[:n_obs], known
    have = {fam: set(getattr(spec, _SPEC_FIELD[fam])) for fam in _FAMILIES}
    queues = {
        fam: [w for w in EXTENSION_GRID if w >= _MIN_EXTENSION[fam] and w not in have[fam]]
        for fam in _FAMILIES
    }
    pos = dict.fromkeys(_FAMILIES, 0)
    obs = list(base)
    while len(obs) < n_obs:
        progressed = False
        for fam in _FAMILIES:
            if len(obs) >= n_obs:
                break
            if pos[fam] < len(queues[fam]):
                obs.append((fam, queues[fam][pos[fam]]))
                pos[fam] += 1
                progressed = True
        if not progressed:
            raise ConfigError(
                f"features.num_features={spec.num_features} is more than the "
                f"{len(obs) + len(known)} features the extension grid allows"
            )
    return obs, known


def feature_plan(spec: OhlcvSpec) -> tuple[list[tuple[str, int]], list[str]]:
    """``([(family, window), ...], known names)`` that :func:`derive_features` will compute."""
    obs, known = _plan(spec)
    return list(obs), list(known)


def feature_names(spec: OhlcvSpec) -> tuple[list[str], list[str]]:
    """``(observed names, known names)`` in output order, without computing anything."""
    obs, known = _plan(spec)
    return [f"{fam}_{w}" for fam, w in obs], known


def _needs(fam: str, w: int) -> int:
    """Leading NaN rows of one feature."""
    if fam in ("logret", "rvol", "mom"):
        return w
    return w - 1


def warmup_of(spec: OhlcvSpec) -> int:
    """Leading rows with NaN in any output of :func:`derive_features` (at least 1: the target)."""
    obs, _ = _plan(spec)
    return max([1] + [_needs(fam, w) for fam, w in obs])


@dataclass
class DerivedFeatures:
    """Output of :func:`derive_features`; every array has the input's length (float32)."""

    observed: dict[str, np.ndarray] = field(default_factory=dict)
    known: dict[str, np.ndarray] = field(default_factory=dict)
    target: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    warmup: int = 1


# --- rolling helpers (causal; NaN where the window is incomplete) ------------------------------


def _lagged_diff(cs: np.ndarray, w: int) -> np.ndarray:
    """``cs[t] - cs[t-w]`` with NaN for ``t < w``."""
    out = np.full(cs.shape[0], np.nan)
    if w < cs.shape[0]:
        out[w:] = cs[w:] - cs[:-w]
    return out


def _prefix(x: np.ndarray) -> np.ndarray:
    """Cumulative sum with a leading zero: ``S[t+1] = sum(x[:t+1])``."""
    out = np.empty(x.shape[0] + 1)
    out[0] = 0.0
    np.cumsum(x, out=out[1:])
    return out


def _window_sum(prefix: np.ndarray, w: int) -> np.ndarray:
    """Sum of the last ``w`` values (rows ``t-w+1..t``), NaN for ``t < w-1``."""
    n = prefix.shape[0] - 1
    out = np.full(n, np.nan)
    if w <= n:
        out[w - 1 :] = prefix[w:] - prefix[: n - w + 1]
    return out


class _RollingExtreme:
    """Rolling max (or min) for many windows via a doubling table: ``O(n log w)`` to build."""

    def __init__(self, x: np.ndarray, op: np.ufunc) -> None:
        self._op = op
        self._levels = [np.asarray(x, dtype=np.float64)]  # level j: window 2**j, valid t >= 2**j-1

    def _level(self, j: int) -> np.ndarray:
        while len(self._levels) <= j:
            k = len(self._levels) - 1
            prev = self._levels[k]
            step = 1 << k
            nxt = np.full(prev.shape[0], np.nan)
            if step < prev.shape[0]:
                nxt[step:] = self._op(prev[step:], prev[:-step])
            self._levels.append(nxt)
        return self._levels[j]

    def __call__(self, w: int) -> np.ndarray:
        j = w.bit_length() - 1  # 2**j <= w < 2**(j+1)
        lvl = self._level(j)
        shift = w - (1 << j)
        if shift == 0:
            return lvl
        out = np.full(lvl.shape[0], np.nan)
        if shift < lvl.shape[0]:
            out[shift:] = self._op(lvl[shift:], lvl[:-shift])
        return out


def _time_ns(time_ns: np.ndarray) -> np.ndarray:
    t = np.asarray(time_ns)
    if t.dtype.kind == "M":
        return t.astype("datetime64[ns]").view(np.int64)
    if t.dtype.kind not in "iu":
        raise DataError(f"time must be int64 nanoseconds or datetime64, got dtype {t.dtype}")
    return t.astype(np.int64, copy=False)


def derive_features(
    time_ns: np.ndarray,
    open: np.ndarray,
    high: np.ndarray,
    low: np.ndarray,
    close: np.ndarray,
    volume: np.ndarray,
    spec: OhlcvSpec | Mapping[str, Any] | None = None,
) -> DerivedFeatures:
    """Derive the features of ``spec`` from one instrument's contiguous OHLCV arrays.

    ``time_ns`` are int64 UTC nanoseconds (or datetime64). Every output row ``t`` depends on
    input rows ``<= t`` only. Rows ``[:warmup]`` contain NaN and are meant to be dropped.
    """
    if spec is None:
        spec = OhlcvSpec()
    elif isinstance(spec, Mapping):
        spec = ohlcv_spec(**spec)
    t = _time_ns(time_ns)
    arrays = {
        "open": np.asarray(open, dtype=np.float64),
        "high": np.asarray(high, dtype=np.float64),
        "low": np.asarray(low, dtype=np.float64),
        "close": np.asarray(close, dtype=np.float64),
        "volume": np.asarray(volume, dtype=np.float64),
    }
    n = t.shape[0]
    for name, a in arrays.items():
        if a.ndim != 1 or a.shape[0] != n:
            raise DataError(f"{name} has shape {a.shape}, expected ({n},) like the time column")
    hi, lo, c = arrays["high"], arrays["low"], arrays["close"]
    for name in ("high", "low", "close"):
        a = arrays[name]
        if n and not (np.all(np.isfinite(a)) and np.all(a > 0)):
            raise DataError(f"{name} prices must be finite and positive")

    obs_plan, known_names = _plan(spec)
    logc = np.log(c)
    ret = np.full(n, np.nan)
    if n > 1:
        ret[1:] = np.diff(logc)
    ret0 = np.nan_to_num(ret, nan=0.0)
    p_ret = _prefix(ret0)
    p_ret2 = _prefix(ret0 * ret0)

    x = np.log1p(np.maximum(arrays["volume"], 0.0))
    p_x = p_x2 = None
    hmax = _RollingExtreme(hi, np.maximum)
    lmin = _RollingExtreme(lo, np.minimum)
    rvol_cache: dict[int, np.ndarray] = {}

    def rvol(w: int) -> np.ndarray:
        if w not in rvol_cache:
            s2 = _window_sum(p_ret2, w)
            if w <= n:
                s2[w - 1] = np.nan  # window would include r_0, which does not exist
            rvol_cache[w] = np.sqrt(np.maximum(s2, 0.0) / w)
        return rvol_cache[w]

    observed: dict[str, np.ndarray] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for fam, w in obs_plan:
            if fam == "logret":
                val = _lagged_diff(logc, w)
            elif fam == "rvol":
                val = rvol(w)
            elif fam == "mom":
                s = _window_sum(p_ret, w)
                vol = rvol(w)
                den = math.sqrt(w) * vol
                val = np.where(den > 1e-12, s / np.where(den > 1e-12, den, 1.0), 0.0)
                val[np.isnan(vol)] = np.nan
            elif fam == "volz":
                if p_x is None:
                    p_x, p_x2 = _prefix(x), _prefix(x * x)
                mean = _window_sum(p_x, w) / w
                var = _window_sum(p_x2, w) / w - mean * mean
                ok = var > 1e-10 * np.maximum(1.0, mean * mean)
                std = np.sqrt(np.where(ok, var, 1.0))
                val = np.where(ok, (x - mean) / std, 0.0)
                val[np.isnan(mean)] = np.nan
            elif fam in ("range", "clv"):
                mx, mn = hmax(w), lmin(w)
                if fam == "range":
                    val = np.log(mx / mn)
                else:
                    rng = mx - mn
                    val = np.where(rng > 0, (c - mn) / np.where(rng > 0, rng, 1.0), 0.5)
                    val = np.clip(val, 0.0, 1.0)
                    val[np.isnan(mx)] = np.nan
            else:  # pragma: no cover - _plan only yields known families
                raise AssertionError(fam)
            observed[f"{fam}_{w}"] = val.astype(np.float32)

    known: dict[str, np.ndarray] = {}
    if known_names:
        known = {k: v for k, v in _calendar(t).items() if k in known_names}

    return DerivedFeatures(
        observed=observed,
        known=known,
        target=ret.astype(np.float32),
        warmup=min(warmup_of(spec), n),
    )


def _calendar(t: np.ndarray) -> dict[str, np.ndarray]:
    day = np.floor_divide(t, _NS_PER_DAY)
    sec = (t - day * _NS_PER_DAY) / 1e9
    tod = 2.0 * np.pi * sec / 86_400.0
    weekday = (day + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    dow = 2.0 * np.pi * weekday / 7.0
    minutes = sec / 60.0
    to_close = np.mod(_CASH_CLOSE_MIN - minutes + 720.0, 1440.0) - 720.0
    return {
        "tod_sin": np.sin(tod).astype(np.float32),
        "tod_cos": np.cos(tod).astype(np.float32),
        "dow_sin": np.sin(dow).astype(np.float32),
        "dow_cos": np.cos(dow).astype(np.float32),
        "to_cash_close": (to_close / 720.0).astype(np.float32),
    }
