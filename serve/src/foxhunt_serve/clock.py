"""The exchange's clock: the local time of int64 ns UTC times in a time zone, and the sessions
the steps after the data follow (`data.calendar`, model.json's `data.calendar`).

Local time
    A zone's UTC offsets are a step function of UTC time: its transitions are found once per
    year (Python's `zoneinfo` at each UTC midnight, each change then bisected to the second)
    and cached, so the offset of millions of rows is one `searchsorted`. The local time of a
    bar is ``t + offset(t)``; back from local to UTC, a local time that a spring change skips
    has no instant and one that an autumn change repeats has two.

Sessions (``session``)
    ``continuous``: the steps after the data continue at the bar interval, every one (the rule
    of exports and checkpoints made before `data.calendar`).
    ``bars``: the bars seen. With a bar interval ``s`` that divides a week, the week is cut into
    ``W = week / s`` slots of local time, counted from the last known time; a bar lies in the
    slot nearest it. A slot the history spans but never had a bar in is closed (a night, a
    weekend, a lunch break); one the history does not span is open (too short a history to
    know). The steps walk the local clock ``s`` at a time from the last known time and keep the
    times in open slots, not on a `holidays` date (local), that exist in local time: a
    repeated local time gives both its instants when ``s`` is no longer than the repeat (bars
    that tick through the change), else its first. An interval that does not divide a week
    continues as ``continuous`` does.
    Carried sessions: training learns each instrument's open slots from its whole history by
    the same rule, as slots of the local week counted from Monday 00:00 (`learn_open`); the
    checkpoint and model.json carry them (`data.calendar.sessions`, `Sessions`), so a short
    input (an encoder and a warm-up: two sessions of bars) knows the nights and weekends it
    does not span. A slot the input has a bar in is open too. A model saved before carried
    sessions learns them from its input, as it did.
    ``exchange`` (`data.calendar.exchange`, `foxhunt_serve.exchange`): the steps keep the times
    the exchange is open by the exchange_calendars library (its sessions, holidays and early
    closes), and of those the slots the bars' sessions have open (a daily maintenance break
    the library does not list).

Dates (``Clock.dated``)
    Bars stamped at midnight UTC, every one, are dates (daily bars or longer): a date is the
    same calendar day in every zone, so their weekday, holidays and sessions are read in UTC.
    Monday 00:00Z is Sunday evening in New York, not Monday's bar.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np

from foxhunt_serve import exchange
from foxhunt_serve.errors import InputError

DAY_NS = 86_400 * 10**9
SECOND_NS = 10**9
WEEK_NS = 7 * DAY_NS
SESSIONS = ("bars", "continuous")
MAX_SLOTS = 1 << 22  # a week of slots at most (1/7 s bars): finer ones continue as continuous
MAX_WEEKS = 60  # the steps after the data look this far for an open slot
MONDAY_NS = 4 * DAY_NS  # 1970-01-05, a Monday: the slots of a local week count from its 00:00
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_YEARS = (1678, 2261)  # the years int64 nanoseconds hold whole


def default_close(time_zone: str) -> str:
    """The cash close where `data.calendar.close` is null: 20:00 in UTC (the US close in US
    summer time, the rule before `data.calendar`), 16:00 local in any other zone."""
    return "20:00" if time_zone == "UTC" else "16:00"


@dataclass(frozen=True)
class Clock:
    """A time zone, its cash close (minutes after local midnight), the session rule and the
    local dates with no session (days since 1970-01-01)."""

    time_zone: str = "UTC"
    close_min: int = 20 * 60
    session: str = "continuous"
    holidays: tuple[int, ...] = ()
    exchange: str | None = None  # an exchange_calendars name (`foxhunt_serve.exchange`)
    dates: bool | None = None  # read as dates (`dated`); None: not decided for these bars

    @classmethod
    def of(cls, section: dict[str, Any] | None) -> Clock:
        """model.json's `data.calendar`, or a config's (None: an export made before it: UTC,
        20:00, continuous), checked; an InputError names a bad value. With an `exchange` and
        the time zone left at UTC, the exchange's zone."""
        if section is None:
            return cls()
        get = section.get if hasattr(section, "get") else lambda k, d: getattr(section, k, d)
        name = str(get("time_zone", "UTC"))
        market = get("exchange", None)
        if market is not None:
            market = exchange.canonical(str(market))
            name = exchange.zone_of(market) if name == "UTC" else name
        if name != "UTC":  # UTC needs no zone data (a machine may have none)
            zone(name)
        close = get("close", None)
        session = str(get("session", "bars"))
        if session not in SESSIONS:
            raise InputError(f"calendar session {session!r} is none of {', '.join(SESSIONS)}")
        days = tuple(sorted({_day(d) for d in get("holidays", None) or ()}))
        return cls(name, close_minutes(close or default_close(name)), session, days, market)

    def section(self) -> dict[str, Any]:
        """As model.json's `data.calendar` holds it."""
        h, m = divmod(self.close_min, 60)
        days = [(date(1970, 1, 1) + timedelta(days=d)).isoformat() for d in self.holidays]
        return {
            "time_zone": self.time_zone,
            "close": f"{h:02d}:{m:02d}",
            "session": self.session,
            "holidays": days,
            "exchange": self.exchange,
        }

    def dated(self, t: np.ndarray) -> Clock:
        """This clock for an instrument's bars `t`, or, when every one is stamped at midnight
        UTC (dates), the same clock read in UTC: a date is its calendar day in every zone.
        Decided once: the steps after the bars are read as the bars were."""
        if self.dates is not None:
            return self
        t = np.asarray(t)
        if len(t) == 0 or (t % DAY_NS).any():
            return replace(self, dates=False)
        return replace(self, time_zone="UTC", dates=True)

    def local(self, t: np.ndarray) -> np.ndarray:
        """Local times (int64 ns, as if the zone were UTC) of int64 ns UTC times `t`."""
        if self.time_zone == "UTC":
            return t
        trans, off = _table(self.time_zone, *_years(t))
        return t + off[np.searchsorted(trans, t, side="right") - 1]


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; an InputError if this machine's zone data lacks it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(
            f"no time zone {name!r} (an IANA name: America/New_York, America/Chicago, "
            "Europe/London, UTC; without the system's zone data, pip install tzdata)"
        ) from None


def close_minutes(text: Any) -> int:
    """Minutes after midnight of an "HH:MM" time of day."""
    try:
        h, m = (int(p) for p in str(text).split(":"))
        if 0 <= h < 24 and 0 <= m < 60 and len(str(text)) == 5:
            return h * 60 + m
    except ValueError:
        pass
    raise InputError(f"calendar close {text!r} is not a time of day HH:MM (16:00)")


def _day(text: Any) -> int:
    try:
        return (date.fromisoformat(str(text)) - date(1970, 1, 1)).days
    except ValueError:
        raise InputError(f"calendar holiday {text!r} is not an ISO date (2026-12-25)") from None


def _years(t: np.ndarray) -> tuple[int, int]:
    """The calendar years of the earliest and latest of `t`, a year either side."""
    if len(t) == 0:
        return 1970, 1970
    lo, hi = (
        int(x)
        for x in np.array([t.min(), t.max()]).astype("datetime64[ns]").astype("M8[Y]").astype(int)
    )
    return max(lo + 1969, _YEARS[0]), min(hi + 1971, _YEARS[1])


def _offset_s(z: ZoneInfo, s: int) -> int:
    return int((_EPOCH + timedelta(seconds=s)).astimezone(z).utcoffset().total_seconds())


@functools.lru_cache(maxsize=4096)
def _year(name: str, year: int) -> tuple[tuple[int, int], ...]:
    """The zone's transitions in `year`: (UTC second, the offset from then on)."""
    z = zone(name)
    start = int((datetime(year, 1, 1, tzinfo=UTC) - _EPOCH).total_seconds())
    end = int((datetime(year + 1, 1, 1, tzinfo=UTC) - _EPOCH).total_seconds())
    found, a, before = [], start, _offset_s(z, start)
    for b in range(start + 86_400, end + 1, 86_400):
        after = _offset_s(z, b)
        lo, hi = a, b  # offset(lo) == before != offset(hi): bisect to the second
        while after != before and hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _offset_s(z, mid) == before else (lo, mid)
        if after != before:
            found.append((hi, _offset_s(z, hi)))
        a, before = b, after
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _table(name: str, y0: int, y1: int) -> tuple[np.ndarray, np.ndarray]:
    """(UTC ns from which each offset holds, that offset in ns) over years y0..y1; the first
    holds from long before."""
    start = int((datetime(y0, 1, 1, tzinfo=UTC) - _EPOCH).total_seconds())
    rows = [(-(2**62) // SECOND_NS, _offset_s(zone(name), start))]
    rows += [r for y in range(y0, y1 + 1) for r in _year(name, y)]
    trans, off = (np.array(c, dtype=np.int64) * SECOND_NS for c in zip(*rows, strict=True))
    trans[0] = -(2**62)
    return trans, off


def changes(name: str, t: np.ndarray) -> np.ndarray:
    """The instants (int64 ns UTC) zone `name`'s UTC offset changes at, about the times `t`."""
    if name == "UTC" or len(t) == 0:
        return np.zeros(0, np.int64)
    return _table(name, *_years(np.asarray(t, dtype=np.int64)))[0][1:]


def _spans(local: np.ndarray, name: str) -> tuple[np.ndarray, ...]:
    """Local times `local` against zone `name`'s offsets: (offsets, each offset's span in local
    time [lo, hi), the offset j whose span starts last at or before each time, the one before
    it, whether the time lies in j's span, whether in the one before's: both where a change
    repeats it, neither where a change skips it)."""
    trans, off = _table(name, *_years(local))
    lo = trans + off
    hi = np.append(trans[1:] + off[:-1], np.iinfo(np.int64).max)
    j = np.searchsorted(lo, local, side="right") - 1
    prev = np.maximum(j - 1, 0)
    return off, lo, hi, j, prev, local < hi[j], (j > 0) & (local < hi[prev])


def utc_of_rows(local: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row by row, the UTC instants (int64 ns) of local times `local` in zone `name`, and
    which of them the zone skips (no instant: a spring change) or repeats (two: an autumn
    change); those rows' instants are not meaningful."""
    if name == "UTC":
        none = np.zeros(len(local), dtype=bool)
        return local, none, none
    off, _, _, j, prev, in_j, in_prev = _spans(local, name)
    return np.where(in_j, local - off[j], local - off[prev]), ~(in_j | in_prev), in_j & in_prev


def utc_of(local: np.ndarray, name: str, step_ns: int) -> np.ndarray:
    """The UTC instants (int64 ns, in order) of local times `local` in zone `name`: none for a
    skipped local time, both for a repeated one when `step_ns` is no longer than the repeat."""
    if name == "UTC":
        return local
    off, lo, hi, j, prev, in_j, in_prev = _spans(local, name)
    first = np.where(in_prev, local - off[prev], local - off[j])[in_j | in_prev]
    both = in_prev & in_j & (step_ns <= hi[prev] - lo[j])
    return np.sort(np.concatenate([first, local[both] - off[j[both]]]))


def session_steps(
    time_ns: np.ndarray,
    last: int,
    step_ns: int,
    n: int,
    clock: Clock,
    carried: np.ndarray | None = None,
) -> np.ndarray:
    """The `n` times after `last` (the last known time) at the bar interval `step_ns` that
    follow the session of the instrument's bars `time_ns` (the module docstring), or its
    `carried` open slots (`learn_open`), or the clock's exchange."""
    slots = _slots(step_ns, clock)
    if not slots and clock.exchange is None:
        return last + step_ns * np.arange(1, n + 1)
    clock = clock.dated(time_ns)
    start = int(clock.local(np.array([last], dtype=np.int64))[0])
    bars = clock.local(np.asarray(time_ns, dtype=np.int64))
    if not slots:
        is_open = np.ones(1, dtype=bool)
    elif carried is None or len(carried) != slots:
        is_open = _open_slots(bars, start, step_ns, slots, clock)
    else:  # the week learned in training, turned to start at the last known time
        is_open = np.roll(np.asarray(carried, dtype=bool), -(_slot(start, step_ns) % slots))
        is_open[np.rint((bars - start) / step_ns).astype(np.int64) % slots] = True
    if clock.exchange is not None:  # its sessions, and of those the slots the bars have
        holidays = np.array(clock.holidays, dtype=np.int64)

        def keep(t: np.ndarray) -> np.ndarray:
            local = clock.local(t)
            slot = np.rint((local - start) / step_ns).astype(np.int64) % len(is_open)
            return is_open[slot] & ~np.isin(np.floor_divide(local, DAY_NS), holidays)

        return exchange.steps(clock.exchange, last, step_ns, n, keep)
    return _walk(start, last, step_ns, n, is_open, clock)


def learn_open(time_ns: np.ndarray, step_ns: int, clock: Clock) -> np.ndarray | None:
    """The open slots of the local week, counted from Monday 00:00, of an instrument's bars
    `time_ns` (int64 ns UTC, in order) at the interval `step_ns`, by the `bars` rule; None
    where the rule does not apply (continuous, an interval that does not divide a week)."""
    slots = _slots(step_ns, clock)
    if not slots or len(time_ns) == 0:
        return None
    clock = clock.dated(time_ns)
    bars = clock.local(np.asarray(time_ns, dtype=np.int64))
    start = int(bars[-1])
    return np.roll(_open_slots(bars, start, step_ns, slots, clock), _slot(start, step_ns) % slots)


def _slots(step_ns: int, clock: Clock) -> int:
    """The slots of a week at the interval `step_ns`; 0 where the steps continue as
    ``continuous`` does."""
    slots = WEEK_NS // step_ns if step_ns > 0 else 0
    if clock.session == "continuous" or slots == 0 or WEEK_NS % step_ns or slots > MAX_SLOTS:
        return 0
    return int(slots)


def _slot(local: int, step_ns: int) -> int:
    """The slot of the local week (counted from Monday 00:00) that local time `local` lies in."""
    return (local - MONDAY_NS + step_ns // 2) // step_ns


def _open_slots(bars: np.ndarray, start: int, step_ns: int, slots: int, clock: Clock) -> np.ndarray:
    """The open slots of the week counted from local time `start`, by the `bars` rule, of the
    bars at local times `bars`."""
    g = np.rint((bars - start) / step_ns).astype(np.int64)  # each bar's slot, 0 the last one
    is_open = np.ones(slots, dtype=bool)
    span = int(-g.min()) if len(g) else 0
    if span >= slots - 1:
        is_open[:] = False
    else:  # the slots the history spans, those of local times that exist
        spanned = start + step_ns * np.arange(-span, 1)
        real = np.isin(spanned, clock.local(utc_of(spanned, clock.time_zone, step_ns)))
        is_open[np.arange(-span, 1)[real] % slots] = False
    is_open[g % slots] = True
    return is_open


def _walk(
    start: int, last: int, step_ns: int, n: int, is_open: np.ndarray, clock: Clock
) -> np.ndarray:
    """The first `n` instants after `last` (local `start`) in the open slots `is_open`
    (counted from `start`), off the clock's holidays."""
    slots = len(is_open)
    holidays = np.array(clock.holidays, dtype=np.int64)
    # from the last known time itself: a repeated local time's second instant comes after it
    found, k, chunk = np.zeros(0, np.int64), 0, max(2 * n, slots)
    # done when n instants come before any a later local time could give (offsets < 2 days)
    while len(found) < n or found[n - 1] >= start + step_ns * k - 2 * DAY_NS:
        if k * step_ns > MAX_WEEKS * WEEK_NS:
            if len(found) >= n:
                break
            raise InputError(
                f"no session in the {MAX_WEEKS} weeks after the last bar: every slot or day "
                "after it is closed (data.calendar.holidays)"
            )
        ks = np.arange(k, k + chunk)
        local = start + step_ns * ks
        keep = is_open[ks % slots] & ~np.isin(np.floor_divide(local, DAY_NS), holidays)
        times = utc_of(local[keep], clock.time_zone, step_ns)
        found = np.sort(np.concatenate([found, times[times > last]]))
        k += chunk
    return found[:n]


class Sessions:
    """Each instrument's open slots of the local week, learned in training (`learn_open`), as
    model.json's `data.calendar.sessions` holds them: ``weeks``, each a bar interval
    ``step_ns`` and its ``open`` runs of slots ``[first, end)`` counted from Monday 00:00
    local, and ``of``, each instrument's week."""

    def __init__(self, section: dict[str, Any] | None = None) -> None:
        section = section or {}
        self.of = {str(k): int(v) for k, v in (section.get("of") or {}).items()}
        self.weeks = list(section.get("weeks") or [])

    def open(self, name: str, step_ns: int) -> np.ndarray | None:
        """Instrument `name`'s open slots at the interval `step_ns`; None: not learned."""
        if name not in self.of:
            return None
        week = self.weeks[self.of[name]]
        if int(week["step_ns"]) != step_ns:
            return None
        mask = np.zeros(WEEK_NS // step_ns, dtype=bool)
        for first, end in week["open"]:
            mask[int(first) : int(end)] = True
        return mask

    @staticmethod
    def section(learned: dict[str, tuple[int, np.ndarray]]) -> dict[str, Any]:
        """model.json's `sessions` of each instrument's (bar interval, open slots)."""
        weeks: dict[str, int] = {}
        out: dict[str, Any] = {"weeks": [], "of": {}}
        for name, (step_ns, mask) in learned.items():
            edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
            week = {"step_ns": int(step_ns), "open": edges.reshape(-1, 2).tolist()}
            key = repr(week)
            if key not in weeks:
                weeks[key] = len(out["weeks"])
                out["weeks"].append(week)
            out["of"][name] = weeks[key]
        return out
