"""Read Parquet with pyarrow, check it, and turn it into one contiguous block of rows per
instrument, with the features in their TFT roles."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from foxhunt.data.features import OhlcvSpec, derive_features, feature_names, ohlcv_spec
from foxhunt.errors import DataError

OHLCV_TARGET = "log_return"
_OHLCV_FIELDS = ("open", "high", "low", "close", "volume")


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
    series: list[Series]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def open_dataset(path: str | Path) -> pads.Dataset:
    """Open one Parquet file or a directory of them; a clear DataError when that fails."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {p}")
    try:
        dataset = pads.dataset(p, format="parquet")
        dataset.schema  # noqa: B018 - forces reading a footer, so a non-Parquet file fails here
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {p} as Parquet: {_one_line(exc)}") from None
    if isinstance(dataset, pads.FileSystemDataset) and not dataset.files:
        raise DataError(f"no Parquet files in {p}")
    return dataset


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


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
    return pc.cast(col, pa.float64()).to_numpy()


def _time_ns(table: pa.Table, column: str) -> np.ndarray:
    col = table.column(column)
    if pa.types.is_timestamp(col.type):
        col = pc.cast(col, pa.timestamp("ns", tz=col.type.tz))
    elif pa.types.is_date(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("ns")), pa.timestamp("ns"))
    elif not pa.types.is_integer(col.type):
        raise DataError(f"time column '{column}' is {col.type}, expected a timestamp or integer")
    if col.null_count:
        raise DataError(f"time column '{column}' has {col.null_count} null values")
    return pc.cast(col, pa.int64()).to_numpy()


def _group_codes(table: pa.Table, column: str | None) -> tuple[np.ndarray, list[str]]:
    if column is None:
        return np.zeros(table.num_rows, dtype=np.int64), ["series"]
    col = table.column(column)
    if col.null_count:
        raise DataError(f"group column '{column}' has {col.null_count} null values")
    names = sorted(str(v) for v in pc.unique(col).to_pylist())
    as_text = pc.cast(col, pa.string())
    codes = pc.index_in(as_text, value_set=pa.array(names, pa.string())).to_numpy()
    return codes.astype(np.int64), names


def _handle_non_finite(
    columns: dict[str, np.ndarray], policy: str, group: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Apply data.nan_policy; return the columns and the mask of rows kept."""
    bad = {c: int((~np.isfinite(v)).sum()) for c, v in columns.items()}
    bad = {c: n for c, n in bad.items() if n}
    keep = np.ones(len(next(iter(columns.values()))), dtype=bool)
    if not bad:
        return columns, keep
    if policy == "error":
        listed = ", ".join(f"'{c}' ({n})" for c, n in bad.items())
        raise DataError(
            f"NaN/inf values in instrument {group}: {listed}; "
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
    """The instrument vocabulary, reading only the group column."""
    if column is None:
        return []
    values = pc.unique(dataset.to_table(columns=[column]).column(0))
    return sorted(str(v) for v in values.to_pylist())


def load(cfg: Any) -> Loaded:
    """Read, check and shape the configured data; every user-fixable problem is a DataError."""
    dataset = open_dataset(cfg.path)
    observed, known, static, target, raw_cols = resolve_columns(dataset.schema, cfg)
    ohlcv = cfg.features == "ohlcv"
    ohlcv_cols = [getattr(cfg.ohlcv, f) for f in _OHLCV_FIELDS] if ohlcv else []
    projection = [cfg.time_column] + ([cfg.group_column] if cfg.group_column else []) + raw_cols
    try:
        table = dataset.to_table(columns=projection)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {cfg.path}: {_one_line(exc)}") from None
    if table.num_rows == 0:
        raise DataError(f"{cfg.path} has no rows")

    time_ns = _time_ns(table, cfg.time_column)
    codes, group_names = _group_codes(table, cfg.group_column)
    values = {c: _as_float(table, c) for c in raw_cols}
    user_known = list(known)
    spec = _ohlcv_spec(cfg)
    observed, known = model_inputs(cfg, observed, known)
    target_kind = resolve_target_kind(cfg)

    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(group_names) + 1))
    series = []
    for g, name in enumerate(group_names):
        rows = order[bounds[g] : bounds[g + 1]]
        t = time_ns[rows]
        steps = np.diff(t)
        if (steps <= 0).any():
            i = int(np.argmax(steps <= 0)) + 1
            raise DataError(
                f"time column '{cfg.time_column}' is not strictly increasing in instrument "
                f"{name} at its row {i} (of {len(rows)}); sort the file by instrument and time"
            )
        cols, keep = _handle_non_finite(
            {c: v[rows] for c, v in values.items()}, cfg.nan_policy, name
        )
        t = t[keep]
        if len(t) == 0:
            continue
        if ohlcv:
            o, h, lo, c, v = (cols[col] for col in ohlcv_cols)
            derived = derive_features(t, o, h, lo, c, v, spec)
            w = derived.warmup
            obs = _stack(list(derived.observed.values()), len(t))[w:]
            kn = _stack(list(derived.known.values()) + [cols[k] for k in user_known], len(t))[w:]
            y = cols[target][w:] if cfg.target is not None else derived.target[w:]
            t = t[w:]
        else:
            obs = _stack([cols[c] for c in observed], len(t))
            kn = _stack([cols[k] for k in known], len(t))
            y = cols[target]
        st = np.array([cols[s][0] for s in static], dtype=np.float64)
        for s in static:
            if np.ptp(cols[s]) > 0:
                raise DataError(f"static feature '{s}' varies within instrument {name}")
        for label, block, names in (("feature", obs, observed), ("known feature", kn, known)):
            finite = np.isfinite(block).all(axis=0)
            if not finite.all():
                bad = [names[i] for i in np.flatnonzero(~finite)]
                raise DataError(f"derived {label}(s) {', '.join(bad)} not finite in {name}")
        series.append(Series(name, t, obs, kn, st, y))
    return Loaded(observed, known, static, target, target_kind, series)


def _stack(columns: list[np.ndarray], rows: int) -> np.ndarray:
    if not columns:
        return np.zeros((rows, 0))
    return np.stack(columns, axis=1).astype(np.float64, copy=False)
