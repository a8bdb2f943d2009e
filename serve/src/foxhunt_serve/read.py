"""The columns of a Parquet table as numpy arrays: times, numbers, instruments."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_serve.errors import InputError

DAY_NS = 86_400 * 10**9


def time_ns(table: pa.Table, column: str, unit: str | None) -> np.ndarray:
    """A time column as int64 nanoseconds since 1970 UTC (an integer column in `unit`)."""
    col = table.column(column)
    if col.null_count:
        raise InputError(f"time column '{column}' has {col.null_count} null values")
    if pa.types.is_integer(col.type):
        if unit is None:
            raise InputError(f"time column '{column}' holds integers, and model.json no unit")
        col = pc.cast(pc.cast(col, pa.int64()), pa.timestamp(unit))
    elif pa.types.is_date(col.type):
        col = pc.cast(col, pa.timestamp("ms"))
    elif not pa.types.is_timestamp(col.type):
        raise InputError(f"time column '{column}' is {col.type}, expected a timestamp or integer")
    col = pc.cast(col, pa.timestamp("ns", tz=col.type.tz))
    return pc.cast(col, pa.int64()).to_numpy()


def as_float(table: pa.Table, column: str) -> np.ndarray:
    """A numeric column as float64 (nulls as NaN)."""
    col = table.column(column)
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise InputError(f"column '{column}' is {t}, expected a numeric column")
    return pc.cast(col, pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def as_text(table: pa.Table, column: str) -> pa.ChunkedArray:
    return pc.cast(table.column(column), pa.string())


def group_codes(table: pa.Table, column: str | None) -> tuple[np.ndarray, list[str]]:
    """Each row's instrument as an index into the sorted instrument names, and those names."""
    if column is None:
        return np.zeros(table.num_rows, dtype=np.int64), ["series"]
    if table.column(column).null_count:
        raise InputError(f"group column '{column}' has null values")
    text = as_text(table, column)
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
    t = time_ns(after, data["time_column"], data["time_unit"])
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
    roots: dict[str, list[str]] = {}
    for g in np.unique(codes):
        contract = names[g]
        if futures["root_column"]:
            root = str(after[futures["root_column"]].filter(pa.array(codes == g))[0].as_py())
        else:
            found = re.match(futures["root_pattern"], str(contract))
            root = found["root"] if found else str(contract)
        roots.setdefault(root, []).append(contract)
    for root, contracts in roots.items():
        if len(contracts) > 1:
            raise InputError(
                f"rows to forecast (an empty close) follow the bars of {len(contracts)} "
                f"contracts of {root}: {', '.join(map(str, contracts))}; give them for one "
                "contract of a root"
            )
    return {root: by_contract[contracts[0]] for root, contracts in roots.items()}
