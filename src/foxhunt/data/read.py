"""The eager read: the projected Parquet columns converted to common types (int64 nanosecond
times, instrument names as text, float64 values), then checked and shaped into one contiguous
block of rows per instrument, with the features in their TFT roles.

`read_data` reads the whole projected table at once; `foxhunt.data.stream` reads the same series one
instrument at a time with the same per-instrument checks (`make_series`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from foxhunt_serve import Clock, Roll, as_float, as_text, group_codes, read_time_ns
from foxhunt_serve import make_series as serve_series

from foxhunt.config import parse_time
from foxhunt.data import panel_inputs
from foxhunt.data.columns import (
    ColumnPlan,
    check_files,
    column_plan,
)
from foxhunt.data.futures import continuous_table
from foxhunt.data.section import DataSection, futures_enabled
from foxhunt.data.source import one_line, open_dataset
from foxhunt.errors import DataError


@dataclass
class Series:
    """One instrument's rows, in time order, after NaN handling and feature derivation."""

    name: str
    time_ns: np.ndarray  # int64
    observed: np.ndarray  # float64 [rows, n_observed]
    known: np.ndarray  # float64 [rows, n_known]
    static: np.ndarray  # float64 [n_static_real]
    target: np.ndarray  # float64 [rows]: the model's (after data.target_transform)
    raw_target: np.ndarray | None = None  # float64 [rows]: before it (None: no transform)


@dataclass
class Loaded:
    """Everything read from the data: the role of each column and the series."""

    observed: list[str]
    known: list[str]
    static: list[str]
    target: str
    target_kind: str
    series: Iterable[Series]  # a list from `read_data`, an iterator from `stream`
    skipped: dict[str, str]  # column -> its type: not numeric, so left out by features=all
    rolls: list[Roll] = field(default_factory=list)  # data.futures: every root's rolls
    target_transform: str = "none"  # as applied (`foxhunt.data.panel_inputs`)

    @classmethod
    def of(cls, plan: ColumnPlan, series: Iterable[Series], rolls: list[Roll] = ()) -> Loaded:
        """The plan's column roles with `series`."""
        return cls(
            plan.observed,
            plan.known,
            plan.static,
            plan.target,
            plan.target_kind,
            series,
            plan.skipped,
            list(rolls),
        )


def make_series(
    plan: ColumnPlan,
    name: str,
    t: np.ndarray,
    values: dict[str, np.ndarray],
    locate: Callable[[int], str] = lambda row: "",
) -> Series:
    """Check one instrument's rows and derive its features, as predict and the consumer do
    (`foxhunt_serve.make_series` of the plan's `meta`), in the plan's column order.
    `locate(row)` names the file of a row (" in <path>"), or is empty."""
    made = serve_series(plan.meta, name, t, values, locate)
    rows = len(made.target)
    return Series(
        name,
        made.time_ns,
        stack_columns([made.features[c] for c in plan.observed], rows),
        stack_columns([made.features[k] for k in plan.known], rows),
        np.array([made.static[s] for s in plan.static], dtype=np.float64),
        made.target,
    )


def read_data(cfg: Any, section: DataSection | None = None) -> Loaded:
    """Read, check and shape the configured data; every user-fixable problem is a DataError.
    `section`: the run's (none: the config's)."""
    dataset = open_dataset(cfg.path)
    plan = column_plan(dataset, cfg, section)
    check_files(dataset, cfg, plan.values)
    # file by file in its own types, as `stream` reads them, then in the common ones: a scan of
    # the dataset would cast every file to the first one's types (a float to its int8, say)
    tables = [
        common_types(plan, read_file(dataset, fragment, projection(plan)))
        for fragment in dataset.get_fragments()
    ]
    return from_table(plan, pa.concat_tables(tables))


def projection(plan: ColumnPlan) -> list[str]:
    """The columns `read_data` reads: time, group, the numeric values, data.futures' own."""
    cfg = plan.cfg
    columns = [cfg.time_column] + ([cfg.group_column] if cfg.group_column else []) + plan.values
    return columns + [c for c in (expiry_column(cfg), root_column(cfg)) if c]


def read_file(dataset: pads.Dataset, fragment: pads.Fragment, columns: list[str]) -> pa.Table:
    """`columns` of one file in the types it has, hive partition keys included."""
    try:
        schema = fragment.physical_schema
        partition = [f for f in dataset.schema if f.name not in schema.names]
        return fragment.to_table(schema=pa.schema([*schema, *partition]), columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {fragment.path}: {one_line(exc)}") from None


def common_types(plan: ColumnPlan, table: pa.Table) -> pa.Table:
    """The columns to read in the types every file is converted to: times in nanoseconds,
    instrument names as text, values in float64."""
    cfg = plan.cfg
    utc = pa.timestamp("ns", tz="UTC")  # read as UTC again, whatever data.calendar says
    columns = {cfg.time_column: pa.array(plan.section.time_ns(table), utc)}
    if cfg.group_column:
        columns[cfg.group_column] = as_text(table.column(cfg.group_column), cfg.group_column)
    columns |= {c: pa.array(as_float(table, c)) for c in plan.values}
    if expiry_column(cfg):  # a date or time, read by data.futures as it is
        columns[expiry_column(cfg)] = table.column(expiry_column(cfg))
    if root_column(cfg):
        columns[root_column(cfg)] = as_text(table.column(root_column(cfg)), root_column(cfg))
    return pa.table(columns)


def load_table(table: pa.Table, cfg: Any, section: DataSection | None = None) -> Loaded:
    """`read_data` for a table already in memory (`cfg.path` only names it in messages)."""
    return from_table(column_plan(pads.dataset(table), cfg, section), table)


def from_table(plan: ColumnPlan, table: pa.Table, problems: list[str] | None = None) -> Loaded:
    """The series of a table in the common types (with data.futures: one per root).
    `problems`: each instrument's DataError appended there, its series left out, instead of
    raising the first (foxhunt inspect lists them all)."""
    cfg = plan.cfg
    if (end := read_end(cfg)) is not None:
        table = table.filter(pa.array(plan.section.time_ns(table) < end))
    if table.num_rows == 0:
        raise DataError(f"{cfg.path} has no rows")

    rolls = []
    if plan.section.futures is not None:  # one continuous series per root (data.futures)
        table, rolls = continuous_table(table, plan.section)
    time_ns = plan.section.time_ns(table)
    codes, names = group_codes(table, cfg.group_column)
    values = {c: as_float(table, c) for c in plan.values}
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    series = []
    for g, name in enumerate(names):
        rows = order[bounds[g] : bounds[g + 1]]
        try:
            series.append(
                make_series(plan, name, time_ns[rows], {c: v[rows] for c, v in values.items()})
            )
        except DataError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
    return panel_inputs.apply(Loaded.of(plan, series, rolls), cfg)


def read_end(cfg: Any) -> int | None:
    """Where a run without a test period (data.split.test_start = test_end: a tuning study's
    fold, `foxhunt.app.tune.search`) stops reading (int64 ns): the rows from there on are dropped as
    they are read, before any check of their values, so no later target is ever seen."""
    split = getattr(cfg, "split", None)
    if split is None or split.test_end is None or split.test_end != split.test_start:
        return None
    return parse_time("data.split.test_end", split.test_end)


def expiry_column(cfg: Any) -> str | None:
    return getattr(cfg.futures.roll, "expiry_column", None) if futures_enabled(cfg) else None


def root_column(cfg: Any) -> str | None:
    return getattr(cfg.futures, "root_column", None) if futures_enabled(cfg) else None


def timeline(cfg: Any, section: DataSection | None = None) -> np.ndarray:
    """Every distinct time of the data, all instruments together (sorted int64 ns), reading
    only the time column a file at a time: the calendar the splits cut (`data.splits`)."""
    dataset, section = open_dataset(cfg.path), section or DataSection.of(cfg)
    times = [
        np.unique(section.time_ns(read_file(dataset, fragment, [cfg.time_column])))
        for fragment in dataset.get_fragments()
    ]
    return np.unique(np.concatenate(times)) if times else np.zeros(0, np.int64)


def bar_step(cfg: Any, clock: Clock) -> float | None:
    """The median step between the distinct times of the data's first file (int64 ns): the
    bar frequency, from one file's time column (not the whole timeline); None under 2 times."""
    dataset = open_dataset(cfg.path)
    fragment = next(iter(dataset.get_fragments()), None)
    if fragment is None:
        return None
    table = read_file(dataset, fragment, [cfg.time_column])
    times = np.unique(read_time_ns(table, cfg.time_column, cfg.time_unit, clock.time_zone))
    return float(np.median(np.diff(times))) if len(times) > 1 else None


def group_names(dataset: pads.Dataset, column: str | None) -> list[str]:
    """The instrument vocabulary, reading only the group column, a file at a time."""
    if column is None:
        return []
    seen: set[str] = set()
    for fragment in dataset.get_fragments():
        names = read_file(dataset, fragment, [column]).column(0)
        seen.update(pc.unique(as_text(names, column)).to_pylist())
    seen.discard(None)  # a missing name: the read says so in one line (this only counts them)
    return sorted(seen)


def instrument_names(dataset: pads.Dataset, cfg: Any) -> list[str]:
    """The instrument vocabulary: the group column's names, or with data.futures their roots."""
    if root_column(cfg):
        return group_names(dataset, root_column(cfg))
    names = group_names(dataset, cfg.group_column)
    if not futures_enabled(cfg):
        return names
    return sorted({root_of(n, cfg.futures.root_pattern) for n in names})


def root_of(contract_id: str, pattern: str) -> str:
    """A contract id's root by data.futures.root_pattern (the id itself where it does not
    match: `foxhunt.data.futures` names the ids that do not parse)."""
    found = re.match(pattern, contract_id)
    return found["root"] if found else contract_id


def stack_columns(columns: list[np.ndarray], rows: int) -> np.ndarray:
    """Columns side by side as a float64 [rows, columns] (no columns: [rows, 0])."""
    if not columns:
        return np.zeros((rows, 0))
    return np.stack(columns, axis=1).astype(np.float64, copy=False)
