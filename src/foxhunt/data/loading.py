"""Read Parquet with pyarrow, check it, and turn it into one contiguous block of rows per
instrument, with the features in their TFT roles.

`load` reads the whole projected table at once; `stream` yields the same series one instrument at
a time, reading only the files (row groups) that hold it, so memory holds one instrument."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from foxhunt.data.features import OhlcvSpec, derive_features, feature_names, ohlcv_spec
from foxhunt.errors import ConfigError, DataError

OHLCV_TARGET = "log_return"
_OHLCV_FIELDS = ("open", "high", "low", "close", "volume")
TIME_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
# every value ends up in float32 tensors: a larger one is inf there (or its square in a std)
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Series:
    """One instrument's rows, in time order, after NaN handling and feature derivation."""

    name: str
    time_ns: np.ndarray  # int64
    observed: np.ndarray  # float64 [rows, n_observed]
    known: np.ndarray  # float64 [rows, n_known]
    static: np.ndarray  # float64 [n_static_real]
    target: np.ndarray  # float64 [rows]


@dataclass
class Loaded:
    """Everything read from the data: the role of each column and the series."""

    observed: list[str]
    known: list[str]
    static: list[str]
    target: str
    target_kind: str
    series: Iterable[Series]  # a list from `load`, an iterator from `stream`
    skipped: dict[str, str]  # column -> its type: not numeric, so left out by features=all


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def open_dataset(path: str | Path) -> pads.Dataset:
    """Open one Parquet file or a directory of them; a clear DataError when that fails."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {p}")
    try:
        # hive: a directory like symbol=ES/part-0.parquet provides the column `symbol`
        dataset = pads.dataset(p, format="parquet", partitioning="hive")
        dataset.schema  # noqa: B018 - forces reading a footer, so a non-Parquet file fails here
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {p} as Parquet: {_one_line(exc)}") from None
    if isinstance(dataset, pads.FileSystemDataset) and not dataset.files:
        raise DataError(f"no Parquet files in {p}")
    return dataset


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _type_name(t: pa.DataType) -> str:
    """The type without its parameters: timestamp[ns, tz=UTC] -> timestamp."""
    return str(t).split("[")[0].split("<")[0].split("(")[0]


def skipped_columns(schema: pa.Schema, cfg: Any) -> dict[str, str]:
    """The columns data.features=all leaves out for not being numeric, with their type."""
    if cfg.features != "all":
        return {}
    roles = {cfg.time_column, cfg.group_column, cfg.target, *cfg.known_features}
    roles |= set(cfg.static_features)
    return {
        f.name: _type_name(f.type)
        for f in schema
        if f.name not in roles and not _is_numeric(f.type)
    }


def resolve_columns(
    schema: pa.Schema, cfg: Any
) -> tuple[list[str], list[str], list[str], str, list[str]]:
    """Return (observed, known, static, target, values): column names by role, checked to exist,
    and every numeric column to read (the target only when it is not derived)."""
    names = set(schema.names)
    ohlcv = cfg.features == "ohlcv"
    target = cfg.target if cfg.target is not None else OHLCV_TARGET
    known, static = list(cfg.known_features), list(cfg.static_features)
    wanted = [cfg.time_column] + ([cfg.group_column] if cfg.group_column else []) + known + static
    if ohlcv:
        wanted += [getattr(cfg.ohlcv, f) for f in _OHLCV_FIELDS]
        if cfg.target is not None:
            wanted.append(target)
        observed = []
    else:
        wanted.append(target)
        if cfg.features == "all":
            skip = {cfg.time_column, cfg.group_column, target, *known, *static}
            observed = [f.name for f in schema if f.name not in skip and _is_numeric(f.type)]
            if not observed:
                raise DataError("data.features=all found no numeric feature column in the file")
        else:
            observed = [c for c in cfg.features if c != target and c not in known]
            wanted += observed
    missing = [c for c in dict.fromkeys(wanted) if c not in names]
    if missing:
        raise DataError(
            f"missing column(s) {', '.join(missing)} in {cfg.path}; "
            f"the file has: {', '.join(schema.names)}"
        )
    keys = {cfg.time_column, cfg.group_column}
    values = [c for c in dict.fromkeys(wanted + observed) if c not in keys]
    return observed, known, static, target, values


def _as_float(table: pa.Table, column: str) -> np.ndarray:
    col = table.column(column)
    if not (_is_numeric(col.type)):
        raise DataError(f"column '{column}' is {col.type}, expected a numeric column")
    # unsafe: an integer beyond 2**53 rounds to the nearest float64 instead of failing
    return pc.cast(col, pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def _time_ns(table: pa.Table, cfg: Any) -> np.ndarray:
    """The time column as int64 nanoseconds since 1970: a timestamp or date column by its own
    unit, an integer column by data.time_unit (required: nothing in the file says it)."""
    column = cfg.time_column
    col = table.column(column)
    if col.null_count:
        raise DataError(f"time column '{column}' has {col.null_count} null values")
    try:
        if pa.types.is_integer(col.type):
            col = pc.cast(pc.cast(col, pa.int64()), pa.timestamp(_time_unit(cfg, col)))
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
            f"years 1677-2262): {_one_line(exc)}"
        ) from None
    return pc.cast(col, pa.int64()).to_numpy()


def _time_unit(cfg: Any, col: pa.ChunkedArray) -> str:
    unit = cfg.time_unit
    if unit is None:
        guess = _unit_like(col)
        like = f": values like {col[0].as_py()} look like {TIME_UNITS[guess]}" if len(col) else ""
        raise DataError(
            f"time column '{cfg.time_column}' holds integers ({col.type}) of no stated unit"
            f"{like}; set data.time_unit={guess} (one of s, ms, us, ns)"
        )
    if unit not in TIME_UNITS:
        raise ConfigError(f"data.time_unit must be s, ms, us or ns, got {unit!r}")
    return unit


def _unit_like(col: pa.ChunkedArray) -> str:
    """The unit integer times of this magnitude are most likely in: a date of this century
    has 10 digits in seconds, 13 in milliseconds, 16 in microseconds, 19 in nanoseconds."""
    if len(col) == 0:
        return "s"
    typical = np.median(np.abs(pc.cast(col, pa.float64(), safe=False).to_numpy()))
    digits = np.log10(max(typical, 1.0))
    return "s" if digits < 10.5 else "ms" if digits < 13.5 else "us" if digits < 16.5 else "ns"


def _as_text(col: pa.ChunkedArray | pa.Array, column: str) -> pa.ChunkedArray | pa.Array:
    """Instrument names as text, the one way every reader (and the report) spells them."""
    try:
        return pc.cast(col, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise DataError(
            f"group column '{column}' is {col.type}, which cannot name instruments: use text "
            "or integers"
        ) from None


def _group_codes(table: pa.Table, column: str | None) -> tuple[np.ndarray, list[str]]:
    if column is None:
        return np.zeros(table.num_rows, dtype=np.int64), ["series"]
    col = table.column(column)
    if col.null_count:
        raise DataError(f"group column '{column}' has {col.null_count} null values")
    as_text = _as_text(col, column)
    names = sorted(pc.unique(as_text).to_pylist())
    codes = pc.index_in(as_text, value_set=pa.array(names, pa.string())).to_numpy()
    return codes.astype(np.int64), names


def _nowhere(row: int) -> str:
    return ""


def _handle_non_finite(
    columns: dict[str, np.ndarray],
    policy: str,
    group: str,
    locate: Callable[[int], str] = _nowhere,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Apply data.nan_policy; return the columns and the mask of rows kept."""
    bad = {c: int((~np.isfinite(v)).sum()) for c, v in columns.items()}
    bad = {c: n for c, n in bad.items() if n}
    keep = np.ones(len(next(iter(columns.values()))), dtype=bool)
    if not bad:
        return columns, keep
    if policy == "error":
        listed = ", ".join(f"'{c}' ({n})" for c, n in bad.items())
        first = min(int(np.argmax(~np.isfinite(columns[c]))) for c in bad)
        raise DataError(
            f"NaN/inf values in instrument {group}{locate(first)}: {listed}; "
            "set data.nan_policy=ffill or data.nan_policy=drop to handle them"
        )
    if policy == "ffill":
        filled = {}
        for c, v in columns.items():
            finite = np.isfinite(v)
            # index of the last finite value at or before each row (-1 before the first one)
            last = np.maximum.accumulate(np.where(finite, np.arange(len(v)), -1))
            filled[c] = np.where(last >= 0, v[np.maximum(last, 0)], np.nan)
            keep &= last >= 0  # leading values with nothing to carry forward are dropped
        columns = filled
    else:
        for v in columns.values():
            keep &= np.isfinite(v)
    return {c: v[keep] for c, v in columns.items()}, keep


def _ohlcv_spec(cfg: Any) -> OhlcvSpec | None:
    if cfg.features != "ohlcv":
        return None
    options = {f.name for f in dataclasses.fields(OhlcvSpec)}
    return ohlcv_spec(**{k: getattr(cfg.ohlcv, k) for k in options})


def model_inputs(cfg: Any, observed: list[str], known: list[str]) -> tuple[list[str], list[str]]:
    """The observed and known inputs the model sees: with features=ohlcv, the derived ones."""
    spec = _ohlcv_spec(cfg)
    if spec is None:
        return observed, known
    derived_observed, derived_known = feature_names(spec)
    return list(derived_observed), list(derived_known) + known


def resolve_target_kind(cfg: Any) -> str:
    if cfg.target_kind != "auto":
        return cfg.target_kind
    return "return" if cfg.features == "ohlcv" and cfg.target is None else "level"


def group_names(dataset: pads.Dataset, column: str | None) -> list[str]:
    """The instrument vocabulary, reading only the group column, a file at a time."""
    if column is None:
        return []
    seen: set[str] = set()
    for fragment in dataset.get_fragments():
        names = _read_file(dataset, fragment, [column]).column(0)
        seen.update(pc.unique(_as_text(names, column)).to_pylist())
    return sorted(seen)


def _time_kind(t: pa.DataType) -> str | None:
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "timestamp"
    return "integer" if pa.types.is_integer(t) else None


def check_files(dataset: pads.Dataset, cfg: Any, values: list[str]) -> None:
    """Every file of a directory holds the columns to read with usable types, from its footer
    alone; a DataError naming the file otherwise (pyarrow would fill a missing column with nulls
    and fail a type mismatch deep in the scan)."""
    if not isinstance(dataset, pads.FileSystemDataset) or len(dataset.files) < 2:
        return
    time_col = cfg.time_column
    wanted = [time_col] + ([cfg.group_column] if cfg.group_column else []) + values
    first: tuple[pa.DataType, str] | None = None
    for fragment in dataset.get_fragments():
        path = fragment.path
        try:
            schema = fragment.physical_schema
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"cannot read {path} as Parquet: {_one_line(exc)}") from None
        partition = pads.get_partition_keys(fragment.partition_expression)
        missing = [c for c in wanted if c not in schema.names and c not in partition]
        if missing:
            raise DataError(
                f"missing column(s) {', '.join(missing)} in {path}; "
                f"the file has: {', '.join(schema.names)}"
            )
        for c in values:
            if c in schema.names and not _is_numeric(schema.field(c).type):
                raise DataError(
                    f"column '{c}' is {schema.field(c).type} in {path}, expected a numeric column"
                )
        if time_col not in schema.names:
            continue
        t = schema.field(time_col).type
        if _time_kind(t) is None:
            raise DataError(
                f"time column '{time_col}' is {t} in {path}, expected a timestamp or integer"
            )
        if first is None:
            first = (t, path)
        elif _time_kind(t) != _time_kind(first[0]):
            raise DataError(
                f"time column '{time_col}' is {t} in {path} but {first[0]} in {first[1]}; "
                "write every file with the same schema"
            )


@dataclass
class _Plan:
    """What to read and the role of every column; shared by `load` and `stream`."""

    cfg: Any
    observed: list[str]  # the model's observed inputs (derived ones with features=ohlcv)
    known: list[str]  # the model's known inputs (calendar ones first with features=ohlcv)
    user_known: list[str]  # data.known_features
    static: list[str]
    target: str
    target_kind: str
    values: list[str]  # the numeric columns read
    spec: OhlcvSpec | None
    skipped: dict[str, str]  # column -> its type: not numeric, so left out by features=all

    def loaded(self, series: Iterable[Series]) -> Loaded:
        return Loaded(
            self.observed,
            self.known,
            self.static,
            self.target,
            self.target_kind,
            series,
            self.skipped,
        )


def column_plan(dataset: pads.Dataset, cfg: Any) -> _Plan:
    """The role of every configured column, from the dataset's schema alone (no rows read)."""
    observed, known, static, target, values = resolve_columns(dataset.schema, cfg)
    model_observed, model_known = model_inputs(cfg, observed, known)
    return _Plan(
        cfg=cfg,
        observed=model_observed,
        known=model_known,
        user_known=known,
        static=static,
        target=target,
        target_kind=resolve_target_kind(cfg),
        values=values,
        spec=_ohlcv_spec(cfg),
        skipped=skipped_columns(dataset.schema, cfg),
    )


def _series(
    plan: _Plan,
    name: str,
    t: np.ndarray,
    values: dict[str, np.ndarray],
    locate: Callable[[int], str] = _nowhere,
) -> Series:
    """Check one instrument's rows and derive its features.
    `locate(row)` names the file of a row (" in <path>"), or is empty."""
    cfg = plan.cfg
    for c, v in values.items():
        beyond = np.isfinite(v) & (np.abs(v) > FLOAT32_MAX)
        if beyond.any():
            i = int(np.argmax(beyond))
            raise DataError(
                f"column '{c}' of instrument {name} holds {v[i]:.3g} at its row {i}{locate(i)}, "
                f"beyond float32's range of +-{FLOAT32_MAX:.3g}: rescale the column"
            )
    steps = np.diff(t)
    if (steps <= 0).any():
        i = int(np.argmax(steps <= 0)) + 1
        raise DataError(
            f"time column '{cfg.time_column}' is not strictly increasing in instrument "
            f"{name} at its row {i} (of {len(t)}){locate(i)}; "
            "sort the file by instrument and time"
        )
    cols, keep = _handle_non_finite(values, cfg.nan_policy, name, locate)
    t = t[keep]
    if len(t) == 0:  # as short as can be: an error, as a short one is, not left out unsaid
        policy = cfg.nan_policy
        raise DataError(f"instrument {name} has no rows left after data.nan_policy={policy}")
    if plan.spec is not None:
        o, h, lo, c, v = (cols[getattr(cfg.ohlcv, f)] for f in _OHLCV_FIELDS)
        try:
            derived = derive_features(t, o, h, lo, c, v, plan.spec)
        except DataError as exc:
            raise DataError(f"{exc} in instrument {name}") from None
        w = derived.warmup
        obs = _stack(list(derived.observed.values()), len(t))[w:]
        kn = _stack(list(derived.known.values()) + [cols[k] for k in plan.user_known], len(t))[w:]
        y = cols[plan.target][w:] if cfg.target is not None else derived.target[w:]
        t = t[w:]
    else:
        obs = _stack([cols[c] for c in plan.observed], len(t))
        kn = _stack([cols[k] for k in plan.known], len(t))
        y = cols[plan.target]
    st = np.array([cols[s][0] for s in plan.static], dtype=np.float64)
    for s in plan.static:
        if np.ptp(cols[s]) > 0:
            raise DataError(f"static feature '{s}' varies within instrument {name}")
    for label, block, names in (
        ("feature", obs, plan.observed),
        ("known feature", kn, plan.known),
        ("target", y[:, None], [plan.target]),
    ):
        finite = np.isfinite(block).all(axis=0)
        if not finite.all():
            bad = [names[i] for i in np.flatnonzero(~finite)]
            raise DataError(f"derived {label}(s) {', '.join(bad)} not finite in {name}")
    return Series(name, t, obs, kn, st, y)


def load(cfg: Any) -> Loaded:
    """Read, check and shape the configured data; every user-fixable problem is a DataError."""
    dataset = open_dataset(cfg.path)
    plan = column_plan(dataset, cfg)
    check_files(dataset, cfg, plan.values)
    projection = [cfg.time_column] + ([cfg.group_column] if cfg.group_column else []) + plan.values
    # file by file in its own types, as `stream` reads them, then in the common ones: a scan of
    # the dataset would cast every file to the first one's types (a float to its int8, say)
    tables = [
        _common_types(plan, _read_file(dataset, fragment, projection))
        for fragment in dataset.get_fragments()
    ]
    return _from_table(plan, pa.concat_tables(tables))


def _read_file(dataset: pads.Dataset, fragment: pads.Fragment, columns: list[str]) -> pa.Table:
    """`columns` of one file in the types it has, hive partition keys included."""
    try:
        schema = fragment.physical_schema
        partition = [f for f in dataset.schema if f.name not in schema.names]
        return fragment.to_table(schema=pa.schema([*schema, *partition]), columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {fragment.path}: {_one_line(exc)}") from None


def _common_types(plan: _Plan, table: pa.Table) -> pa.Table:
    """The columns to read in the types every file is converted to: times in nanoseconds,
    instrument names as text, values in float64."""
    cfg = plan.cfg
    columns = {cfg.time_column: pa.array(_time_ns(table, cfg), pa.timestamp("ns"))}
    if cfg.group_column:
        columns[cfg.group_column] = _as_text(table.column(cfg.group_column), cfg.group_column)
    columns |= {c: pa.array(_as_float(table, c)) for c in plan.values}
    return pa.table(columns)


def load_table(table: pa.Table, cfg: Any) -> Loaded:
    """`load` for a table already in memory (`cfg.path` only names it in messages)."""
    return _from_table(column_plan(pads.dataset(table), cfg), table)


def _from_table(plan: _Plan, table: pa.Table) -> Loaded:
    cfg = plan.cfg
    if table.num_rows == 0:
        raise DataError(f"{cfg.path} has no rows")

    time_ns = _time_ns(table, cfg)
    codes, names = _group_codes(table, cfg.group_column)
    values = {c: _as_float(table, c) for c in plan.values}
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    series = []
    for g, name in enumerate(names):
        rows = order[bounds[g] : bounds[g + 1]]
        series.append(_series(plan, name, time_ns[rows], {c: v[rows] for c, v in values.items()}))
    return plan.loaded(series)


# --- rows after the data: the known-future inputs of a forecast --------------------------------


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
    codes, names = _group_codes(table, cfg.group_column)
    future = np.zeros(table.num_rows, dtype=bool)
    for g in np.unique(codes[empty]):
        rows = np.flatnonzero(codes == g)
        filled = np.flatnonzero(~empty[rows])
        future[rows[filled[-1] + 1 if len(filled) else 0 :]] = True
    if not future.any():
        return table, {}
    after = table.filter(pa.array(future))
    t = _time_ns(after, cfg)
    known = {k: _as_float(after, k) for k in cfg.known_features if k in after.column_names}
    after_codes = codes[future]
    by_name = {}
    for g in np.unique(after_codes):
        rows = after_codes == g
        by_name[names[g]] = Future(t[rows], {k: v[rows] for k, v in known.items()})
    return table.filter(pa.array(~future)), by_name


def known_at(cfg: Any, time_ns: np.ndarray, user_known: dict[str, np.ndarray]) -> np.ndarray:
    """The model's known inputs [rows, known] at `time_ns` (bars after the data): with
    features=ohlcv the calendar encodings derived from the time, then data.known_features
    from `user_known`."""
    spec = _ohlcv_spec(cfg)
    columns = []
    if spec is not None and spec.calendar:
        ones = np.ones(len(time_ns))  # prices do not enter the calendar encodings
        columns += list(derive_features(time_ns, ones, ones, ones, ones, ones, spec).known.values())
    columns += [user_known[k] for k in cfg.known_features]
    return _stack(columns, len(time_ns))


# --- the lazy path: one instrument at a time ----------------------------------------------------


@dataclass
class _Layout:
    """Where each instrument's rows are: row groups, in file order (the order `load` reads)."""

    pieces: list[pads.Fragment]  # every row group of every file
    parts: dict[str, list[int]]  # instrument (sorted) -> the row groups holding its rows
    shared: list[int]  # row groups holding several instruments


def _layout(dataset: pads.Dataset, group: str | None) -> _Layout:
    """Found from hive partition keys, or by reading the group column alone."""
    pieces: list[pads.Fragment] = []
    parts: dict[str, list[int]] = {}
    shared: list[int] = []
    for fragment in dataset.get_fragments():
        partition = pads.get_partition_keys(fragment.partition_expression)
        try:
            row_groups = fragment.split_by_row_group()
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"cannot read {fragment.path} as Parquet: {_one_line(exc)}") from None
        for piece in row_groups:
            if piece.row_groups[0].num_rows == 0:  # an empty file: no instrument's rows
                continue
            if group is None:
                names = {"series"}
            elif group in partition:
                names = {str(partition[group])}
            else:
                names = _names_in(piece, group)
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
        names.update(pc.unique(_as_text(col, group)).to_pylist())
    return names


def _batches(piece: pads.Fragment, columns: list[str]) -> Iterator[pa.RecordBatch]:
    try:
        yield from piece.to_batches(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {piece.path}: {_one_line(exc)}") from None


class _Spill:
    """The rows of row groups that hold several instruments (files per month, say), sorted out
    by instrument in one pass into a file per instrument: reading such a row group once per
    instrument would decode it as many times as it has instruments."""

    def __init__(self, folder: Path, plan: _Plan, names: list[str]) -> None:
        self.folder, self.plan = folder, plan
        self.stem = {name: folder / str(k) for k, name in enumerate(names)}
        self.rows: dict[tuple[str, int], int] = {}  # (instrument, row group) -> rows spilled
        self.open: dict[str, tuple[Any, Any]] = {}

    def write(self, index: int, piece: pads.Fragment) -> None:
        cfg = self.plan.cfg
        self.folder.mkdir(parents=True, exist_ok=True)
        for batch in _batches(piece, [cfg.time_column, cfg.group_column, *self.plan.values]):
            table = pa.Table.from_batches([batch])
            t = _time_ns(table, cfg)
            codes, names = _group_codes(table, cfg.group_column)
            values = np.column_stack([_as_float(table, c) for c in self.plan.values])
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


def _read_series(plan: _Plan, name: str, layout: _Layout, spill: _Spill) -> Series:
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
                raise DataError(f"cannot read {piece.path}: {_one_line(exc)}") from None
            t = _time_ns(table, cfg)
            cols = {c: _as_float(table, c) for c in plan.values}
        times.append(t)
        columns.append(cols)
    spill.done(name)
    locate = _locator(
        [layout.pieces[i].path for i in layout.parts[name]], np.cumsum([len(t) for t in times])
    )
    t = _concat(times)
    values = {c: _concat([cols[c] for cols in columns]) for c in plan.values}
    del times, columns
    return _series(plan, name, t, values, locate)


def stream(cfg: Any, scratch: Path) -> Loaded:
    """`load`, one instrument at a time: `series` is an iterator, and each instrument is read
    from the row groups that hold it (several files when it spans them), so memory holds one
    instrument. Row groups that hold several instruments are first sorted out into files
    under `scratch`, in one pass. Errors name the file of the offending rows."""
    dataset = open_dataset(cfg.path)
    plan = column_plan(dataset, cfg)
    check_files(dataset, cfg, plan.values)
    layout = _layout(dataset, cfg.group_column)
    if not layout.parts:
        raise DataError(f"{cfg.path} has no rows")
    spill = _Spill(scratch, plan, list(layout.parts))

    def series() -> Iterator[Series]:
        for i in layout.shared:
            spill.write(i, layout.pieces[i])
        for name in layout.parts:
            yield _read_series(plan, name, layout, spill)

    return plan.loaded(series())


def data_files(cfg: Any) -> list[Path]:
    """The Parquet files the configured data consists of."""
    dataset = open_dataset(cfg.path)
    if isinstance(dataset, pads.FileSystemDataset):
        return [Path(f) for f in dataset.files]
    return [Path(cfg.path)]


def _stack(columns: list[np.ndarray], rows: int) -> np.ndarray:
    if not columns:
        return np.zeros((rows, 0))
    return np.stack(columns, axis=1).astype(np.float64, copy=False)
