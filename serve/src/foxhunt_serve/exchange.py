"""An exchange's sessions, holidays and early closes (`data.calendar.exchange`), from the
exchange_calendars library (an optional extra: `pip install 'foxhunt-serve[calendars]'`),
which keeps them; foxhunt keeps no holiday list of its own.

Rules
    A bar is named by its start: an intraday step at time ``t`` is kept when the exchange is
    open at ``t`` (a session's open <= t < its close, outside its break). The steps continue
    at the bar interval in UTC from the last known time, so bars on the hour stay on the hour
    through a daylight-saving change. Daily bars and longer (an interval of a day or more)
    step from session to session: the next sessions' dates, at the last bar's time of day.
    The library is imported when an exchange is named, never before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import numpy as np

from foxhunt_serve.errors import InputError

DAY_NS = 86_400 * 10**9
# ISO 10383 codes exchange_calendars knows by another name: CME's equity sessions (ES, NQ)
ALIASES = {"XCME": "CMES"}
LOOKAHEAD_DAYS = 430  # the sessions looked up after the last bar (the library's own default)


def _library() -> Any:
    try:
        import exchange_calendars
    except ImportError:
        raise InputError(
            "data.calendar.exchange needs the exchange_calendars library: "
            "pip install 'foxhunt[calendars]' (or 'foxhunt-serve[calendars]')"
        ) from None
    return exchange_calendars


def canonical(name: str) -> str:
    """Exchange `name` as exchange_calendars names it; an InputError if it has none."""
    known = _library().get_calendar_names(include_aliases=True)
    found = ALIASES.get(name, name)
    if found not in known:
        close = [k for k in known if k[:2] == name[:2]][:8]
        raise InputError(
            f"no exchange {name!r} in exchange_calendars (an ISO code: XNYS, XLON, CMES for "
            f"CME's equity futures{'; ' + ', '.join(close) if close else ''})"
        )
    return found


def zone_of(name: str) -> str:
    """The exchange's IANA time zone."""
    return str(_calendar(name, date.today().isoformat()).tz)


@functools.lru_cache(maxsize=16)
def _calendar(name: str, start: str) -> Any:
    """The exchange's calendar from `start` for LOOKAHEAD_DAYS days, as far as it reaches."""
    xcals = _library()
    first = date.fromisoformat(start)
    end = first + timedelta(days=LOOKAHEAD_DAYS)
    try:
        return xcals.get_calendar(name, start=first.isoformat(), end=end.isoformat())
    except Exception as exc:  # noqa: BLE001 - the library's own errors name the bounds
        raise InputError(f"exchange {name}: {' '.join(str(exc).split())}") from None


def _schedule(name: str, last: int) -> dict[str, np.ndarray]:
    """The sessions from the week before `last`: their dates, opens, closes and breaks (int64
    ns; no break: the int64 minimum)."""
    day = date(1970, 1, 1) + timedelta(days=int(last // DAY_NS) - 7)
    table = _calendar(name, day.isoformat()).schedule
    out = {"session": table.index.to_numpy(dtype="datetime64[ns]").view(np.int64)}
    for column in ("open", "close", "break_start", "break_end"):
        out[column] = np.full(len(table), np.iinfo(np.int64).min)
        if column in table:  # NaT reads as the int64 minimum
            out[column] = table[column].to_numpy(dtype="datetime64[ns]").view(np.int64)
    return out


def steps(
    name: str, last: int, step_ns: int, n: int, keep: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """The `n` times after `last` at the interval `step_ns` when exchange `name` is open (the
    module docstring) that `keep` (a mask of times) keeps."""
    s = _schedule(name, last)
    if step_ns >= DAY_NS:
        times = s["session"] + last % DAY_NS
        found = [times[(times > last) & keep(times)]]
    else:
        found, got = [], 0
        for at in np.flatnonzero(s["close"] > last):
            k0 = max(1, -(-(int(s["open"][at]) - last) // step_ns))
            k1 = -(-(int(s["close"][at]) - last) // step_ns)  # the first at or after the close
            t = last + step_ns * np.arange(k0, k1, dtype=np.int64)
            t = t[~((t >= s["break_start"][at]) & (t < s["break_end"][at]))]
            found.append(t[keep(t)])
            got += len(found[-1])
            if got >= n:
                break
    times = np.concatenate(found) if found else np.zeros(0, np.int64)
    if len(times) < n:
        raise InputError(
            f"exchange {name} has {len(times)} session times after the last bar in "
            f"exchange_calendars' next {LOOKAHEAD_DAYS} days, not the {n} steps to forecast"
        )
    return times[:n]
