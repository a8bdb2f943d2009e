"""Which zone's clock a file's intraday bars keep, from their daylight-saving shifts: bars that
keep an exchange's local hours move by an hour in UTC on that zone's change dates. Read on the
wrong clock (`data.calendar.time_zone`, UTC by default), the time-of-day features and the
sessions are an hour off for half the year; `foxhunt inspect` and training say so, once.

Rule
    For each daylight-saving change of the configured zone or of a candidate zone (`ZONES`, and
    UTC) within the data, the times of day that have bars in the week before the change are
    compared with those in the week after (`WEEK_NS`), both on a clock: their mismatch is the
    share of times of day with bars on one side only. A candidate keeps the bars' clock where
    its mismatch, summed over those changes, is under a third of the configured zone's and
    that zone's is over `MIN_MISMATCH`; of several, the one with the least (UTC first). Bars
    round the clock, daily bars (a step of `MAX_STEP_NS` or more) and changes without
    `MIN_SIDE_NS` of data either side say nothing.
"""

from __future__ import annotations

import numpy as np
from foxhunt_serve import Clock, changes

DAY_NS = 86_400 * 10**9
WEEK_NS = 7 * DAY_NS
MINUTE_NS = 60 * 10**9
MAX_STEP_NS = 6 * 3600 * 10**9
MIN_MISMATCH = 0.02
MIN_SIDE_NS = 3 * DAY_NS  # of bars before and after a change (a weekend falls in a week)
# zones by their change dates: a file that keeps one of them keeps all of its group's
ZONES = {
    "UTC": ("UTC",),
    "America/New_York": ("America/New_York", "America/Chicago"),
    "Europe/London": ("Europe/London", "Europe/Berlin"),
    "Australia/Sydney": ("Australia/Sydney",),
}


def likely_zone(time_ns: np.ndarray, clock: Clock) -> tuple[str, ...] | None:
    """The zones whose clock the bars `time_ns` (int64 ns UTC, any instruments) keep where the
    configured `clock` does not (the module docstring); None: no sign of another."""
    t = np.unique(np.asarray(time_ns, dtype=np.int64))
    if len(t) < 3 or np.median(np.diff(t)) >= MAX_STEP_NS:
        return None
    mine, found = _changes(clock.time_zone, t), []
    for lead, group in ZONES.items():
        if clock.time_zone in group:
            continue
        changes = np.union1d(mine, _changes(lead, t))
        theirs = _mismatch(t, changes, Clock.of({"time_zone": lead}))
        ours = _mismatch(t, changes, clock)
        if ours > MIN_MISMATCH * max(len(changes), 1) and theirs < ours / 3:
            found.append((theirs / ours, len(found), group))
    return min(found)[2] if found else None


def warning(time_ns: np.ndarray, clock: Clock) -> str | None:
    """One line naming the likely zone and the key to set, or None."""
    found = likely_zone(time_ns, clock)
    if found is None:
        return None
    zones = " or ".join(found)
    return (
        f"the bars' times of day shift by an hour on the daylight-saving dates of {zones}, "
        f"not on data.calendar.time_zone={clock.time_zone}'s: set "
        f"data.calendar.time_zone={found[0]} (and data.calendar.close, the local cash close), "
        "or the calendar features and sessions are an hour off for half the year"
    )


def _changes(name: str, t: np.ndarray) -> np.ndarray:
    """The zone's changes (int64 ns UTC) with `MIN_SIDE_NS` of the bars' span either side."""
    at = changes(name, t)
    return at[(at - MIN_SIDE_NS >= t[0]) & (at + MIN_SIDE_NS <= t[-1])]


def _times_of_day(t: np.ndarray, clock: Clock) -> np.ndarray:
    """The distinct local minutes of the day of times `t` on `clock`."""
    return np.unique((clock.local(t) % DAY_NS) // MINUTE_NS)


def _mismatch(t: np.ndarray, changes: np.ndarray, clock: Clock) -> float:
    """The summed share of times of day with bars in the week on one side of each change only,
    on `clock`."""
    total = 0.0
    for at in changes:
        before = _times_of_day(t[(t >= at - WEEK_NS) & (t < at)], clock)
        after = _times_of_day(t[(t >= at) & (t < at + WEEK_NS)], clock)
        either = np.union1d(before, after)
        if len(either):
            total += len(np.setxor1d(before, after)) / len(either)
    return total
