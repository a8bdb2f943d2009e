"""Which features to derive from OHLCV bars: the spec, the plan of names and windows, the
warm-up, and `derive_features` over one instrument's arrays. What each feature is, and the code
that computes it, is the serving core's `foxhunt_serve.features` (one definition for training,
predict and the ONNX consumer).

Warm-up
    The number of leading rows with a NaN in any output (target included):
    ``max(1, lags k, rvol/mom windows w, volz/range/clv windows w - 1)``.

Extension to ``num_features``
    With ``OhlcvSpec.num_features = N`` the observed list is the base list (the spec's
    families, in the order above) followed by extension features, cut to ``N - known`` names.
    Extension features come round-robin over the families ``logret, rvol, volz, range, clv,
    mom`` (never ``gap``): each turn a family takes the smallest window of the grid ``G`` it
    does not have yet (and that is at least its minimum: 2 for ``logret``, ``rvol``, ``mom``;
    4 for ``volz``; 1 for ``range`` and ``clv``); a family whose grid is used up drops out.
    ``G = {1} U unique(round(2 ** (i / 6))) for i = 6 .. 54`` (geometric, ratio 2^(1/6), from 2
    to 512): windows are never longer than 512 bars. ``N`` below the known count, or above
    what the grid allows (about 260), is a :class:`~foxhunt.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from foxhunt_serve import (
    CALENDAR,
    FAMILIES,
    Clock,
    InputError,
    Ohlcv,
    Sessions,
    bar_interval,
    calendar,
    learn_open,
    warmup,
)

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
    "clock_of",
]

KNOWN_CALENDAR: tuple[str, ...] = CALENDAR
"""Names of the calendar (known-future) features, in order."""
INTRADAY_CALENDAR: tuple[str, ...] = ("tod_sin", "tod_cos", "to_cash_close")
"""The calendar features of intraday bars only (`OhlcvSpec.intraday`)."""

MAX_EXTENSION_WINDOW = 512
EXTENSION_GRID: tuple[int, ...] = tuple(
    sorted({1} | {int(round(2 ** (i / 6))) for i in range(6, 55)})
)
"""Windows the ``num_features`` extension draws from (geometric, 1 .. 512)."""

# Family order: base list order and round-robin order of the extension.
_FAMILIES: tuple[str, ...] = FAMILIES
_SPEC_FIELD = {
    "logret": "return_lags",
    "rvol": "volatility_windows",
    "volz": "volume_windows",
    "range": "range_windows",
    "clv": "location_windows",
    "mom": "momentum_windows",
    "gap": "gap_windows",
}
_MIN_WINDOW = {"logret": 1, "rvol": 1, "volz": 2, "range": 1, "clv": 1, "mom": 1, "gap": 1}
# the families the extension grows (the gap's multi-bar sums would add little but noise)
_MIN_EXTENSION = {"logret": 2, "rvol": 2, "volz": 4, "range": 1, "clv": 1, "mom": 2}


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
    # none by default here: a checkpoint from before the family derives what it was trained on
    # (the config's default is [1])
    gap_windows: tuple[int, ...] = ()
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
        fam: [w for w in EXTENSION_GRID if w >= low and w not in have[fam]]
        for fam, low in _MIN_EXTENSION.items()
    }
    pos = dict.fromkeys(queues, 0)
    obs = list(base)
    while len(obs) < n_obs:
        progressed = False
        for fam in queues:
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


def warmup_of(spec: OhlcvSpec) -> int:
    """Leading rows with NaN in any output of :func:`derive_features` (at least 1: the target)."""
    obs, _ = _plan(spec)
    return max([1] + [warmup(fam, w) for fam, w in obs])


@dataclass
class DerivedFeatures:
    """Output of :func:`derive_features`; every array has the input's length (float32)."""

    observed: dict[str, np.ndarray] = field(default_factory=dict)
    known: dict[str, np.ndarray] = field(default_factory=dict)
    target: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    warmup: int = 1


def clock_of(cfg: Any) -> Clock:
    """data.calendar as the serving core's clock (`foxhunt_serve.clock`): the time zone the
    calendar features are computed in, the cash close, the sessions of the steps after the
    data. A data config without one (a checkpoint's from before it): UTC, the close at 20:00,
    every bar interval continued, as such a model was trained and predicted."""
    try:
        return Clock.of(getattr(cfg, "calendar", None))
    except InputError as exc:
        raise ConfigError(f"data.calendar: {exc}") from None


def learned_sessions(
    time_ns: np.ndarray, group: np.ndarray, names: list[str], clock: Clock
) -> dict[str, Any]:
    """Each instrument's sessions, learned from all its bars (`foxhunt_serve.clock`'s
    `learn_open`), as the checkpoint's schema and model.json carry them; `group`: each row's
    index in `names` (none: one series)."""
    group = np.asarray(group)
    bounds = np.flatnonzero(np.diff(group)) + 1
    learned = {}
    for start, end in zip([0, *bounds], [*bounds, len(group)], strict=True):
        times = np.sort(np.asarray(time_ns[start:end], dtype=np.int64))
        if len(times) < 2:
            continue
        step = bar_interval("", times)
        slots = learn_open(times, step, clock)
        if slots is not None:
            learned[names[int(group[start])] if names else "series"] = (step, slots)
    return Sessions.section(learned) if learned else {}


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
    clock: Clock | None = None,
) -> DerivedFeatures:
    """Derive the features of ``spec`` from one instrument's contiguous OHLCV arrays.

    ``time_ns`` are int64 UTC nanoseconds (or datetime64); the calendar features are read on
    ``clock`` (None: in UTC, the close at 20:00). Every output row ``t`` depends on input rows
    ``<= t`` only. Rows ``[:warmup]`` contain NaN and are meant to be dropped.
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

    obs_plan, known_names = _plan(spec)
    bars = Ohlcv(hi, lo, c, arrays["volume"], arrays["open"])
    observed = {f"{fam}_{w}": bars.feature(fam, w) for fam, w in obs_plan}
    known = {k: calendar(t, k, clock) for k in known_names}
    return DerivedFeatures(
        observed=observed,
        known=known,
        target=bars.feature("log_return"),
        warmup=min(warmup_of(spec), n),
    )
