"""The lazy read: the series `foxhunt.data.read.read_data` gives, one instrument at a time, each
read from the row groups (of one or several files) that hold it, so memory holds one instrument.
Row groups holding several instruments are first sorted out by instrument into spill files, in
one pass. With data.futures the unit is a root: its contracts are read together and stitched by
`foxhunt.data.futures.continuous_table`, as `read_data` does, so memory holds one root's
contracts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.feather as feather

from foxhunt.data.columns import ColumnPlan, check_files, column_plan
from foxhunt.data.read import (
    Loaded,
    Series,
    as_float,
    as_text,
    common_types,
    from_table,
    group_codes,
    make_series,
    projection,
    read_end,
    read_file,
    root_column,
    root_of,
)
from foxhunt.data.section import DataSection
from foxhunt.data.source import one_line, open_dataset
from foxhunt.errors import DataError


@dataclass
class _Layout:
    """Where each instrument's rows are: row groups, in file order (the order `read_data` reads)."""

    pieces: list[pads.Fragment]  # every row group of every file
    parts: dict[str, list[int]]  # instrument (sorted) -> the row groups holding its rows
    shared: list[int]  # row groups holding several instruments


def _layout(
    dataset: pads.Dataset, group: str | None, unit: Callable[[str], str] | None = None
) -> _Layout:
    """Found from hive partition keys, or by reading the group column alone; `unit` maps its
    names to the units read together (data.futures: contract ids to roots)."""
    pieces: list[pads.Fragment] = []
    parts: dict[str, list[int]] = {}
    shared: list[int] = []
    for fragment in dataset.get_fragments():
        partition = pads.get_partition_keys(fragment.partition_expression)
        try:
            row_groups = fragment.split_by_row_group()
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"cannot read {fragment.path} as Parquet: {one_line(exc)}") from None
        for piece in row_groups:
            if piece.row_groups[0].num_rows == 0:  # an empty file: no instrument's rows
                continue
            if group is None:
                names = {"series"}
            elif group in partition:
                names = {str(partition[group])}
            else:
                names = _names_in(piece, group)
            if unit is not None:
                names = {unit(name) for name in names}
            if len(names) > 1:
                shared.append(len(pieces))
            for name in names:
                parts.setdefault(name, []).append(len(pieces))
            pieces.append(piece)
    return _Layout(pieces, {name: parts[name] for name in sorted(parts)}, shared)


def _names_in(piece: pads.Fragment, group: str) -> set[str]:
    names: set[str] = set()
    for batch in _batches(piece, [group]):
        col = batch.column(0)
        if col.null_count:
            raise DataError(
                f"group column '{group}' has {col.null_count} null values in {piece.path}"
            )
        names.update(pc.unique(as_text(col, group)).to_pylist())
    return names


def _batches(piece: pads.Fragment, columns: list[str]) -> Iterator[pa.RecordBatch]:
    try:
        yield from piece.to_batches(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {piece.path}: {one_line(exc)}") from None


class _Spill:
    """The rows of row groups that hold several instruments (files per month, say), sorted out
    by instrument in one pass into a file per instrument: reading such a row group once per
    instrument would decode it as many times as it has instruments."""

    def __init__(self, folder: Path, plan: ColumnPlan, names: list[str]) -> None:
        self.folder, self.plan = folder, plan
        self.stem = {name: folder / str(k) for k, name in enumerate(names)}
        self.rows: dict[tuple[str, int], int] = {}  # (instrument, row group) -> rows spilled
        self.open: dict[str, tuple[Any, Any]] = {}

    def write(self, index: int, piece: pads.Fragment) -> None:
        cfg = self.plan.cfg
        self.folder.mkdir(parents=True, exist_ok=True)
        for batch in _batches(piece, [cfg.time_column, cfg.group_column, *self.plan.values]):
            table = pa.Table.from_batches([batch])
            t = self.plan.section.time_ns(table)
            codes, names = group_codes(table, cfg.group_column)
            values = np.column_stack([as_float(table, c) for c in self.plan.values])
            order = np.argsort(codes, kind="stable")
            bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
            for g, name in enumerate(names):
                rows = order[bounds[g] : bounds[g + 1]]
                with open(f"{self.stem[name]}.time", "ab") as f:
                    t[rows].tofile(f)
                with open(f"{self.stem[name]}.values", "ab") as f:
                    values[rows].tofile(f)
                key = (name, index)
                self.rows[key] = self.rows.get(key, 0) + len(rows)

    def read(self, name: str, index: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The rows of `name` that row group `index` held (row groups are read in order)."""
        if name not in self.open:
            self.open[name] = (
                open(f"{self.stem[name]}.time", "rb"),
                open(f"{self.stem[name]}.values", "rb"),
            )
        time_f, values_f = self.open[name]
        n, width = self.rows[(name, index)], len(self.plan.values)
        t = np.fromfile(time_f, np.int64, count=n)
        values = np.fromfile(values_f, np.float64, count=n * width).reshape(n, width)
        return t, {c: values[:, j] for j, c in enumerate(self.plan.values)}

    def done(self, name: str) -> None:
        for f in self.open.pop(name, ()):
            f.close()
            Path(f.name).unlink()


def _locator(paths: list[str], ends: np.ndarray) -> Callable[[int], str]:
    """`locate(row)`: the file an instrument's row was read from, for error messages."""

    def locate(row: int) -> str:
        return f" in {paths[int(np.searchsorted(ends, row, side='right'))]}"

    return locate


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _read_series(plan: ColumnPlan, name: str, layout: _Layout, spill: _Spill) -> Series:
    cfg = plan.cfg
    shared = set(layout.shared)
    times: list[np.ndarray] = []
    columns: list[dict[str, np.ndarray]] = []
    for i in layout.parts[name]:
        if i in shared:
            t, cols = spill.read(name, i)
        else:  # the whole row group is this instrument's
            piece = layout.pieces[i]
            try:
                table = piece.to_table(columns=[cfg.time_column, *plan.values])
            except (pa.ArrowInvalid, OSError) as exc:
                raise DataError(f"cannot read {piece.path}: {one_line(exc)}") from None
            t = plan.section.time_ns(table)
            cols = {c: as_float(table, c) for c in plan.values}
        times.append(t)
        columns.append(cols)
    spill.done(name)
    locate = _locator(
        [layout.pieces[i].path for i in layout.parts[name]], np.cumsum([len(t) for t in times])
    )
    t = _concat(times)
    values = {c: _concat([cols[c] for cols in columns]) for c in plan.values}
    del times, columns
    if (end := read_end(cfg)) is not None:  # a study's fold: nothing from its end on
        keep = t < end
        t, values = t[keep], {c: v[keep] for c, v in values.items()}
    return make_series(plan, name, t, values, locate)


def _root_tables(dataset: pads.Dataset, plan: ColumnPlan, scratch: Path) -> Iterator[pa.Table]:
    """data.futures: each root's rows (every contract of it), in the common types and in file
    order, as `read_data` reads them; row groups holding several roots are first sorted out by root
    into spill files."""
    cfg = plan.cfg
    column = root_column(cfg) or cfg.group_column
    unit = None if root_column(cfg) else partial(root_of, pattern=cfg.futures.root_pattern)
    layout = _layout(dataset, column, unit)
    if not layout.parts:
        raise DataError(f"{cfg.path} has no rows")
    stem = {root: scratch / str(k) for k, root in enumerate(layout.parts)}
    for i in layout.shared:
        table = common_types(plan, read_file(dataset, layout.pieces[i], projection(plan)))
        codes, names = group_codes(table, column)
        units = np.array([unit(n) if unit else n for n in names], dtype=object)[codes]
        scratch.mkdir(parents=True, exist_ok=True)
        for root in set(units):
            part = table.filter(pa.array(units == root))
            feather.write_feather(part, f"{stem[root]}-{i}.arrow", compression="uncompressed")
    for root, parts in layout.parts.items():
        tables = []
        for i in parts:
            if i in layout.shared:
                spilled = Path(f"{stem[root]}-{i}.arrow")
                tables.append(feather.read_table(spilled, memory_map=False))
                spilled.unlink()
            else:
                piece = read_file(dataset, layout.pieces[i], projection(plan))
                tables.append(common_types(plan, piece))
        yield pa.concat_tables(tables)


def _stream_roots(dataset: pads.Dataset, plan: ColumnPlan, scratch: Path) -> Loaded:
    """`stream` with data.futures: one root at a time, its rolls added to `rolls` as read."""
    loaded = Loaded.of(plan, iter(()))

    def series() -> Iterator[Series]:
        for table in _root_tables(dataset, plan, scratch):
            root = from_table(plan, table)
            loaded.rolls += root.rolls
            yield from root.series

    loaded.series = series()
    return loaded


def stream(cfg: Any, scratch: Path, section: DataSection) -> Loaded:
    """`read.read_data`, one instrument at a time: `series` is an iterator, and each instrument is
    read from the row groups that hold it (several files when it spans them), so memory holds one
    instrument. Row groups that hold several instruments are first sorted out into files
    under `scratch`, in one pass. Errors name the file of the offending rows. With
    data.futures one root at a time, `rolls` complete once `series` is read. `section`: the
    run's."""
    dataset = open_dataset(cfg.path)
    plan = column_plan(dataset, cfg, section)
    check_files(dataset, cfg, plan.values)
    if plan.section.futures is not None:
        return _stream_roots(dataset, plan, scratch)
    layout = _layout(dataset, cfg.group_column)
    if not layout.parts:
        raise DataError(f"{cfg.path} has no rows")
    spill = _Spill(scratch, plan, list(layout.parts))

    def series() -> Iterator[Series]:
        for i in layout.shared:
            spill.write(i, layout.pieces[i])
        for name in layout.parts:
            yield _read_series(plan, name, layout, spill)

    return Loaded.of(plan, series())
