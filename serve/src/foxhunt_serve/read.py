"""The columns of a Parquet table as numpy arrays: times, numbers, instruments."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_serve.clock import DAY_NS, Clock, utc_of_rows
from foxhunt_serve.errors import DataError

TIME_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def iso_time(ns: int) -> str:
    """A time (int64 ns, UTC) as an ISO string, for a message."""
    return f"{np.datetime64(int(ns), 'ns').astype('datetime64[s]')}Z"


def one_line(exc: Exception) -> str:
    """An exception's message on one line, for an error that quotes it."""
    return " ".join(str(exc).split())


def time_ns(table: pa.Table, column: str, unit: str | None, time_zone: str = "UTC") -> np.ndarray:
    """A time column as int64 nanoseconds since 1970 UTC: a timestamp or date column by its own
    unit, an integer column by `unit` (data.time_unit; required: nothing in the file says it).
    A timestamp column without a time zone (naive) holds local times in `time_zone`
    (data.calendar's clock), unless every one is a midnight: dates, read as a date column is.
    A naive time the zone skips or repeats (a daylight-saving change) is an error."""
    col = table.column(column)
    if col.null_count:
        raise DataError(f"time column '{column}' has {col.null_count} null values")
    naive = pa.types.is_timestamp(col.type) and col.type.tz is None
    try:
        if pa.types.is_integer(col.type):
            if unit is None:
                raise DataError(_no_unit(column, col))
            col = pc.cast(pc.cast(col, pa.int64()), pa.timestamp(unit))
        elif pa.types.is_date(col.type):
            col = pc.cast(col, pa.timestamp("ms"))
        elif not pa.types.is_timestamp(col.type):
            raise DataError(
                f"time column '{column}' is {col.type}, expected a timestamp or integer"
            )
        col = pc.cast(col, pa.timestamp("ns", tz=col.type.tz))
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise DataError(
            f"time column '{column}' has values out of range (nanoseconds since 1970 span the "
            f"years 1677-2262): {one_line(exc)}"
        ) from None
    t = pc.cast(col, pa.int64()).to_numpy()
    if naive and time_zone != "UTC" and (t % DAY_NS).any():
        return _from_local(t, column, time_zone)
    return t


def zone_of(data: dict[str, Any]) -> str:
    """The time zone naive times are local times in: data.calendar's clock's."""
    return Clock.of(data.get("calendar")).time_zone


def _from_local(local: np.ndarray, column: str, time_zone: str) -> np.ndarray:
    """UTC of naive local times in `time_zone`; an error naming the first the zone skips or
    repeats (a naive time cannot say which instant it was)."""
    utc, skipped, repeated = utc_of_rows(local, time_zone)
    if skipped.any() or repeated.any():
        i = int(np.argmax(skipped | repeated))
        when = "goes forward over" if skipped[i] else "goes back over"
        at = np.datetime64(int(local[i]), "ns").astype("datetime64[s]")
        raise DataError(
            f"time column '{column}' holds {at} without a time zone: a local time in "
            f"{time_zone} (data.calendar.time_zone), whose clock {when} it; store the column "
            f"with its zone (timestamp[ns, tz={time_zone}]) or in UTC (tz=UTC)"
        )
    return utc


def _no_unit(column: str, col: pa.ChunkedArray) -> str:
    """The unit integer times of this magnitude are most likely in: a date of this century
    has 10 digits in seconds, 13 in milliseconds, 16 in microseconds, 19 in nanoseconds."""
    guess, like = "s", ""
    if len(col):
        typical = np.median(np.abs(pc.cast(col, pa.float64(), safe=False).to_numpy()))
        digits = np.log10(max(typical, 1.0))
        guess = "s" if digits < 10.5 else "ms" if digits < 13.5 else "us" if digits < 16.5 else "ns"
        like = f": values like {col[0].as_py()} look like {TIME_UNITS[guess]}"
    return (
        f"time column '{column}' holds integers ({col.type}) of no stated unit{like}; set "
        f"data.time_unit={guess} (one of s, ms, us, ns)"
    )


def is_numeric(t: pa.DataType) -> bool:
    """Whether a column of type `t` can be read as float64 values (integers and booleans too)."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def as_float(table: pa.Table, column: str) -> np.ndarray:
    """A numeric column as float64 values (nulls as NaN); an error for any other type."""
    col = table.column(column)
    if not is_numeric(col.type):
        raise DataError(f"column '{column}' is {col.type}, expected a numeric column")
    # unsafe: an integer beyond 2**53 rounds to the nearest float64 instead of failing
    return pc.cast(col, pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def as_text(col: pa.ChunkedArray | pa.Array, column: str) -> pa.ChunkedArray | pa.Array:
    """Instrument names as text, the one way every reader (and the report) spells them."""
    try:
        return pc.cast(col, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise DataError(
            f"group column '{column}' is {col.type}, which cannot name instruments: use text "
            "or integers"
        ) from None


def group_codes(table: pa.Table, column: str | None) -> tuple[np.ndarray, list[str]]:
    """Each row's instrument as an index into the sorted instrument names, and those names."""
    if column is None:
        return np.zeros(table.num_rows, dtype=np.int64), ["series"]
    col = table.column(column)
    if col.null_count:
        raise DataError(f"group column '{column}' has {col.null_count} null values")
    text = as_text(col, column)
    names = sorted(pc.unique(text).to_pylist())
    codes = pc.index_in(text, value_set=pa.array(names, pa.string())).to_numpy()
    return codes.astype(np.int64), names


@dataclass
class Future:
    """One instrument's rows after its last target value: their times and known inputs."""

    time_ns: np.ndarray
    known: dict[str, np.ndarray]


def split_future(table: pa.Table, data: dict[str, Any]) -> tuple[pa.Table, dict[str, Future]]:
    """The table without each instrument's rows after its last target value (the target, or
    the close when the target is derived, empty), and those rows by instrument."""
    source = data["target_column"] or data["ohlcv"]["close"]
    if source not in table.column_names or data["time_column"] not in table.column_names:
        return table, {}  # reading the series names what is missing
    empty = pc.is_null(table.column(source), nan_is_null=True).to_numpy(zero_copy_only=False)
    if not empty.any():
        return table, {}
    codes, names = group_codes(table, data["group_column"])
    future = np.zeros(table.num_rows, dtype=bool)
    for g in np.unique(codes[empty]):
        rows = np.flatnonzero(codes == g)
        filled = np.flatnonzero(~empty[rows])
        future[rows[filled[-1] + 1 if len(filled) else 0 :]] = True
    if not future.any():
        return table, {}
    after = table.filter(pa.array(future))
    # the whole column's times: whether naive ones are dates is decided on all of them
    t = time_ns(table, data["time_column"], data["time_unit"], zone_of(data))[future]
    known = {k: as_float(after, k) for k in data["known_columns"] if k in after.column_names}
    after_codes = codes[future]
    by_name = {}
    for g in np.unique(after_codes):
        rows = after_codes == g
        by_name[names[g]] = Future(t[rows], {k: v[rows] for k, v in known.items()})
    if data["futures"] is not None:  # under the root of their contract, from one contract
        by_name = by_root(by_name, after, after_codes, names, data["futures"])
    return table.filter(pa.array(~future)), by_name


def by_root(
    by_contract: dict[str, Future], after: pa.Table, codes: np.ndarray, names: list, futures: dict
) -> dict[str, Future]:
    """The rows to forecast under their contract's root (the instrument the model knows), from
    one contract of each root."""
    roots: dict[str, list[str]] = {}
    for g in np.unique(codes):
        roots.setdefault(root_of(after, codes == g, names[g], futures), []).append(names[g])
    for root, contracts in roots.items():
        if len(contracts) > 1:  # the first root (in file order) with several
            raise DataError(
                f"rows to forecast (an empty close) follow the bars of {len(contracts)} "
                f"contracts of {root}: {', '.join(map(str, contracts))}; give them for one "
                "contract of a root"
            )
    return {root: by_contract[contracts[0]] for root, contracts in roots.items()}


def root_of(table: pa.Table, rows: np.ndarray, contract: str, futures: dict) -> str:
    """The root of `contract`, whose rows of `table` are `rows` (a mask): its root column's,
    else its id's by data.futures.root_pattern, else the id itself."""
    if futures["root_column"]:
        return str(table[futures["root_column"]].filter(pa.array(rows))[0].as_py())
    found = re.match(futures["root_pattern"], str(contract))
    return found["root"] if found else str(contract)
