"""Rows after the data, for predict: each instrument's rows after its last target value are the
bars to forecast, and their known-future inputs the model's decoder takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt.data.columns import ohlcv_spec_of
from foxhunt.data.features import derive_features
from foxhunt.data.read import (
    as_float,
    futures_enabled,
    group_codes,
    root_column,
    root_of,
    stack_columns,
    time_ns_of,
)
from foxhunt.errors import DataError


@dataclass
class Future:
    """One instrument's rows after its last target value: times and data.known_features."""

    time_ns: np.ndarray  # int64, in file order
    known: dict[str, np.ndarray]  # data.known_features, float64 (NaN where empty)


def split_future(table: pa.Table, cfg: Any) -> tuple[pa.Table, dict[str, Future]]:
    """Take off each instrument's rows after its last target value (the target, or with
    features=ohlcv the close, empty): the bars to forecast, whose known inputs may be given.
    Returns the table without them and those rows by instrument."""
    source = cfg.target if cfg.target is not None else cfg.ohlcv.close
    if source not in table.column_names or cfg.time_column not in table.column_names:
        return table, {}  # `load_table` names what is missing
    empty = pc.is_null(table.column(source), nan_is_null=True).to_numpy(zero_copy_only=False)
    if not empty.any():
        return table, {}
    codes, names = group_codes(table, cfg.group_column)
    future = np.zeros(table.num_rows, dtype=bool)
    for g in np.unique(codes[empty]):
        rows = np.flatnonzero(codes == g)
        filled = np.flatnonzero(~empty[rows])
        future[rows[filled[-1] + 1 if len(filled) else 0 :]] = True
    if not future.any():
        return table, {}
    after = table.filter(pa.array(future))
    t = time_ns_of(after, cfg)
    known = {k: as_float(after, k) for k in cfg.known_features if k in after.column_names}
    after_codes = codes[future]
    by_name = {}
    for g in np.unique(after_codes):
        rows = after_codes == g
        by_name[names[g]] = Future(t[rows], {k: v[rows] for k, v in known.items()})
    if futures_enabled(cfg):
        by_name = _by_root(by_name, after, after_codes, names, cfg)
    return table.filter(pa.array(~future)), by_name


def _by_root(
    by_contract: dict[str, Future], after: pa.Table, codes: np.ndarray, names: list, cfg: Any
) -> dict[str, Future]:
    """data.futures: the rows to forecast under their contract's root (the instrument the
    model knows), from one contract of each root."""
    column = root_column(cfg)
    roots: dict[str, list[str]] = {}
    for g in np.unique(codes):
        contract = names[g]
        if column:
            root = str(after[column].filter(pa.array(codes == g))[0].as_py())
        else:
            root = root_of(str(contract), cfg.futures.root_pattern)
        roots.setdefault(root, []).append(contract)
    several = {r: c for r, c in roots.items() if len(c) > 1}
    if several:
        root, contracts = next(iter(several.items()))
        raise DataError(
            f"rows to forecast (an empty close) follow the bars of {len(contracts)} contracts "
            f"of {root}: {', '.join(map(str, contracts))}; give them for one contract of a root"
        )
    return {root: by_contract[contracts[0]] for root, contracts in roots.items()}


def known_at(cfg: Any, time_ns: np.ndarray, user_known: dict[str, np.ndarray]) -> np.ndarray:
    """The model's known inputs [rows, known] at `time_ns` (bars after the data): with
    features=ohlcv the calendar encodings derived from the time, then data.known_features
    from `user_known`."""
    spec = ohlcv_spec_of(cfg)
    columns = []
    if spec is not None and spec.calendar:
        ones = np.ones(len(time_ns))  # prices do not enter the calendar encodings
        columns += list(derive_features(time_ns, ones, ones, ones, ones, ones, spec).known.values())
    columns += [user_known[k] for k in cfg.known_features]
    return stack_columns(columns, len(time_ns))
