"""Whatever a Parquet file or directory holds, the data module either gives finite windows or
fails with foxhunt's one-line error: random schemas, dtypes, nulls, NaN/inf, huge values,
duplicate and unsorted times, integer and timezone-aware times, tiny instruments, several files
with mixed schemas, in memory and through the lazy window store."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from foxhunt.config import DataConfig, OhlcvConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.errors import FoxhuntError

INTEGERS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint64()]
FLOATS = [pa.float16(), pa.float32(), pa.float64()]
DICTIONARY = pa.dictionary(pa.int32(), pa.string())
TEXT = [pa.string(), DICTIONARY]
TIMES = [pa.timestamp("ns"), pa.timestamp("s", "UTC"), pa.date32()]
NUMBERS = INTEGERS + FLOATS + [pa.bool_()]
VALUE_TYPES = NUMBERS + TEXT
SPECIAL = [np.nan, np.inf, -np.inf, 1e300, -1e300, 3.5e38, 1e38, 1e30, 7e4, 2.0**63, -(2.0**63)]
UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
T0_NS = 1_767_571_200 * 10**9  # 2026-01-05
NAMES = {
    "string": ["AAA", "BB", "C"],
    "int": [7, 10, 2],
    "float": [1.5, 0.1, 2.0],
    "bool": [True, False],
}


@dataclass
class Column:
    """One column of the whole table, before it is cut into files."""

    name: str
    values: np.ndarray  # float64 (int64 for times), one per row
    nulls: np.ndarray  # bool
    type: pa.DataType | None  # None: as pyarrow infers it


def clipped(values: np.ndarray, dtype: type) -> np.ndarray:
    """Floats as integers of `dtype`, NaN as 0 and the rest clipped into its range."""
    if values.dtype.kind != "f":
        return values.astype(dtype)
    info = np.iinfo(dtype)
    low, high = float(info.min), np.nextafter(float(info.max), 0)
    return np.clip(np.nan_to_num(values, nan=0.0), low, high).astype(dtype)


def numpy_dtype(t: pa.DataType) -> np.dtype:
    """A numeric arrow type's numpy dtype (`to_pandas_dtype` imports pandas on pyarrow 15)."""
    return pa.array([], type=t).to_numpy().dtype


def to_arrow(values: np.ndarray, nulls: np.ndarray, t: pa.DataType) -> pa.Array:
    """`values` as an Arrow array of type `t`, clipped or wrapped as a careless writer would."""
    mask = nulls if nulls.any() else None
    if values.dtype == object:  # instrument names: as they are, or as text
        items = values.tolist() if t is None else [str(v) for v in values]
        arr = pa.array(items, pa.array(items).type, mask=mask)  # typed even if all null
        return arr.dictionary_encode() if t is not None and pa.types.is_dictionary(t) else arr
    if pa.types.is_string(t) or pa.types.is_dictionary(t):
        arr = pa.array(values.astype(str), pa.string(), mask=mask)
        return arr.dictionary_encode() if pa.types.is_dictionary(t) else arr
    if pa.types.is_boolean(t):
        return pa.array(values > 0, mask=mask)
    if pa.types.is_integer(t) and values.dtype.kind == "f":
        return pa.array(clipped(values, numpy_dtype(t)), mask=mask)
    if pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        arr = pa.array(clipped(values, np.int64), pa.int64(), mask=mask)
        if t == pa.date32():
            arr = arr.cast(pa.int32(), safe=False)
        return arr.cast(t, safe=False)
    with np.errstate(over="ignore"):
        return pa.array(values.astype(numpy_dtype(t)), mask=mask)


def rarely(draw) -> bool:
    """True one time in eight, so that most cases hold one defect or none and some load."""
    return draw(st.integers(0, 7)) == 7


def usually(draw, options: list):
    """The first option, or rarely any of them."""
    return draw(st.sampled_from(options)) if rarely(draw) else options[0]


def time_column(draw, lengths: list[int]) -> tuple[Column, str | None]:
    """The time column (each instrument's bars from the same start, in order, then spoiled
    rarely) and the data.time_unit to set."""
    kind = draw(st.sampled_from(["timestamp", "integer", "date"]))
    unit = draw(st.sampled_from(list(UNIT_NS)))
    start = usually(draw, [T0_NS, 0, -T0_NS, 2**62, 2**63 - 10**12])
    step = usually(draw, [300 * 10**9, 10**9, 1] if kind != "date" else [86_400 * 10**9])
    t = [(start + step * i) // UNIT_NS[unit] for n in lengths for i in range(n)]
    rows = len(t)
    while rows > 1 and rarely(draw):
        i = draw(st.integers(1, rows - 1))
        if draw(st.booleans()):
            t[i] = t[i - 1]  # a duplicate time
        else:
            t[i - 1], t[i] = t[i], t[i - 1]
    nulls = np.zeros(rows, bool)
    if rows and rarely(draw):
        nulls[draw(st.integers(0, rows - 1))] = True
    time_unit = unit if kind == "integer" else None
    if kind == "date":
        t = [v * UNIT_NS[unit] // (86_400 * 10**9) for v in t]
        type_ = draw(st.sampled_from([pa.date32(), pa.date64()]))
        if type_ == pa.date64():
            t = [v * 86_400_000 for v in t]
    elif kind == "timestamp":
        type_ = pa.timestamp(unit, tz=draw(st.sampled_from([None, "UTC", "America/Chicago"])))
    else:
        type_ = usually(draw, [pa.int64(), pa.int32(), pa.uint64()])
    if draw(st.integers(0, 3)) == 3:  # not set, or wrong
        time_unit = draw(st.sampled_from([None, *UNIT_NS]))
    t = np.array([max(-(2**63), min(v, 2**63 - 1)) for v in t], dtype=np.int64)
    return Column("timestamp", t, nulls, type_), time_unit


def value_column(draw, name: str, rows: int, rng: np.random.Generator, positive=False) -> Column:
    """Random values (positive: prices), often with a null or a special value."""
    values = rng.normal(size=rows) * usually(draw, [1.0, 1e3, 1e-6, 1e-11])
    if positive:
        values = 100.0 + np.abs(values)
    nulls = np.zeros(rows, bool)
    while rows and draw(st.integers(0, 3)) == 3:
        i = draw(st.integers(0, rows - 1))
        if draw(st.booleans()):
            nulls[i] = True
        else:
            values[i] = draw(st.sampled_from(SPECIAL))
    types = [pa.float64(), pa.float32(), pa.int64()]
    types += [] if positive else NUMBERS
    type_ = draw(st.sampled_from(VALUE_TYPES)) if rarely(draw) else draw(st.sampled_from(types))
    return Column(name, values, nulls, type_)


@st.composite
def cases(draw) -> tuple[list[Column], dict, dict]:
    """(columns, how to write them, the data config's settings)."""
    group_kind = draw(st.sampled_from(["none", "string", "dictionary", "int", "float", "bool"]))
    names = [None] if group_kind == "none" else NAMES.get(group_kind, NAMES["string"])
    names = names[: draw(st.integers(1, len(names)))]
    lengths = [draw(st.integers(0, 6)) if rarely(draw) else draw(st.integers(10, 40))
               for _ in names]  # fmt: skip
    rows = sum(lengths)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    time, time_unit = time_column(draw, lengths)
    columns = [time]
    if group_kind != "none":
        labels = np.repeat(np.array(names, dtype=object), lengths)
        nulls = np.zeros(rows, bool)
        if rows and rarely(draw):
            nulls[draw(st.integers(0, rows - 1))] = True
        type_ = DICTIONARY if group_kind == "dictionary" else None  # else inferred
        columns.append(Column("symbol", labels, nulls, type_))
    if draw(st.booleans()):
        for name in ("open", "high", "low", "close", "volume"):
            columns.append(value_column(draw, name, rows, rng, positive=True))
        features, target, known = "ohlcv", None, []
    else:
        n = draw(st.integers(1, 3))
        columns += [value_column(draw, f"x{i}", rows, rng) for i in range(n)]
        columns.append(value_column(draw, "y", rows, rng))
        features = draw(st.sampled_from(["all", [f"x{i}" for i in range(n)]]))
        target = "y"
        known = draw(st.sampled_from([[], ["x0"]]))
    static = []
    if draw(st.booleans()):  # a static real, constant per instrument (rarely not)
        per = rng.normal(size=len(names)) * usually(draw, [1.0, 1e30, 1e-13])
        values = np.repeat(per, lengths)
        if rows and rarely(draw):
            values[draw(st.integers(0, rows - 1))] += 1.0
        columns.append(Column("s0", values, np.zeros(rows, bool), pa.float64()))
        static = ["s0"]
    if rarely(draw):  # a column with no value at all
        values = [c for c in columns if c.name not in ("timestamp", "symbol")]
        draw(st.sampled_from(values)).nulls[:] = True
    drift = None  # often: one file's column of another type, or missing
    if draw(st.booleans()):
        k = draw(st.integers(0, len(columns) - 1))
        types = [*TEXT, None] if columns[k].name == "symbol" else [*VALUE_TYPES, *TIMES, None]
        drift = (k, draw(st.sampled_from(types)))
    write = {
        "layout": draw(st.sampled_from(["file", "rows", "instruments", "hive"])),
        "files": draw(st.integers(2, 3)),
        "interleave": draw(st.booleans()),  # rows ordered by time, instruments mixed
        "drift": drift,
        "row_group_size": draw(st.sampled_from([None, 7])),
    }
    cfg = {
        "group_column": None if group_kind == "none" else "symbol",
        "time_unit": time_unit,
        "target": target,
        "features": features,
        "known_features": known,
        "static_features": static,
        "nan_policy": draw(st.sampled_from(["error", "ffill", "drop"])),
        "encoder_length": draw(st.integers(1, 4)),
        "prediction_length": draw(st.integers(1, 3)),
        "val_fraction": draw(st.sampled_from([0.2, 0.0])),
        "test_fraction": draw(st.sampled_from([0.2, 0.0])),
        "batch_size": 4,
        "ohlcv": OhlcvConfig(
            return_lags=[2],
            volatility_windows=[2],
            volume_windows=[2],
            range_windows=[1],
            location_windows=[1],
        ),
    }
    return columns, write, cfg


def table_of(columns: list[Column], rows: np.ndarray, drift: tuple | None = None) -> pa.Table:
    arrays = {}
    for k, c in enumerate(columns):
        t = c.type
        if drift is not None and drift[0] == k:
            if drift[1] is None:
                continue  # this file lacks the column
            t = drift[1]
        arrays[c.name] = to_arrow(c.values[rows], c.nulls[rows], t)
    return pa.table(arrays)


def write_parquet(table: pa.Table, path: Path, **options) -> None:
    try:
        pq.write_table(table, path, **options)
    except pa.ArrowInvalid:  # Parquet stores seconds as milliseconds, which can overflow
        reject()


def write(folder: Path, columns: list[Column], how: dict) -> Path:
    """The columns as one file or as several, per `how`; returns the data path."""
    rows = np.arange(len(columns[0].values))
    if how["interleave"]:
        rows = rows[np.argsort(columns[0].values, kind="stable")]
    options = {"row_group_size": how["row_group_size"]}
    if how["layout"] == "file":
        write_parquet(table_of(columns, rows), folder / "data.parquet", **options)
        return folder / "data.parquet"
    data = folder / "data"
    data.mkdir()
    symbol = next((c for c in columns if c.name == "symbol"), None)
    if how["layout"] in ("rows", "instruments") or symbol is None:
        if how["layout"] == "instruments" and symbol is not None:
            parts = [rows[symbol.values[rows] == v] for v in dict.fromkeys(symbol.values)]
        else:
            parts = np.array_split(rows, how["files"])
        for k, part in enumerate(parts):
            drift = how["drift"] if k == 1 else None
            write_parquet(table_of(columns, part, drift), data / f"part{k}.parquet", **options)
        return data
    others = [c for c in columns if c.name != "symbol"]
    for value in dict.fromkeys(symbol.values):
        (data / f"symbol={value}").mkdir()
        part = rows[symbol.values[rows] == value]
        write_parquet(table_of(others, part), data / f"symbol={value}" / "p.parquet", **options)
    return data


def set_up(cfg: DataConfig) -> ParquetDataModule | str:
    """The data module set up, or the message of the FoxhuntError it raised (one line)."""
    dm = ParquetDataModule(cfg)
    try:
        dm.setup()
    except FoxhuntError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"not one line: {message!r}"
        return message
    return dm


def batches(dm: ParquetDataModule) -> list[dict[str, torch.Tensor]]:
    """Every batch of every split, checked finite."""
    out = []
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        for batch in loader:
            for key, tensor in batch.items():
                if tensor.is_floating_point():
                    assert torch.isfinite(tensor).all(), f"{key} not finite"
            out.append(batch)
    return out


def check(folder: Path, columns: list[Column], how: dict, settings_: dict) -> None:
    """Read in memory and through the lazy store: both fail in one line, or both give the same
    finite windows."""
    cfg = DataConfig(path=str(write(folder, columns, how)), **settings_)
    eager = set_up(replace(cfg, lazy=False))
    lazy = set_up(replace(cfg, lazy=True, cache_dir=str(folder / "cache")))
    if (
        isinstance(lazy, str)
        and not isinstance(eager, str)
        and eager.schema.target_transform != "none"
    ):
        # a cross-sectional target needs the panel in memory: the lazy read refuses it in one
        # line rather than train another target (foxhunt.data.panel_inputs)
        assert "needs every name's rows at once" in lazy, lazy
        event("lazy refuses the cross-sectional target")
        return
    if isinstance(eager, str) or isinstance(lazy, str):
        assert isinstance(eager, str) and isinstance(lazy, str), f"eager: {eager}; lazy: {lazy}"
        event(" ".join(eager.split()[:9]))  # --hypothesis-show-statistics: what failed
        return
    event("loaded")
    a, b = eager.schema.to_dict(), lazy.schema.to_dict()
    target = a["input_mean"][0], a["input_std"][0]
    for kind in ("input", "static"):
        mean, std = (np.asarray(a[f"{kind}_{s}"]) for s in ("mean", "std"))
        assert np.isfinite(mean).all() and np.isfinite(std).all()
        # a mean agrees to the rounding of the values it sums, relative to their size: a target
        # of int64 extremes (+-9.2e18) had means -56.9 and -0.11, its std 3.1e18
        error = np.abs(np.asarray(b.pop(f"{kind}_mean")) - a.pop(f"{kind}_mean"))
        assert (error <= 1e-9 * (np.abs(mean) + std) + 1e-12).all(), (kind, error, mean, std)
        np.testing.assert_allclose(
            b.pop(f"{kind}_std"), a.pop(f"{kind}_std"), rtol=1e-9, atol=1e-12
        )
    # each instrument's target centre and scale (the pooled ones where its history is short),
    # to the rounding of the target's values as the input means above
    size = abs(target[0]) + target[1]
    error = np.abs(np.asarray(b.pop("target_centres")) - a.pop("target_centres"))
    assert (error <= 1e-9 * size + 1e-12).all(), (error, target)
    np.testing.assert_allclose(b.pop("target_scales"), a.pop("target_scales"), rtol=1e-9)
    assert a == b
    for x, y in zip(batches(eager), batches(lazy), strict=True):
        for key in x:
            torch.testing.assert_close(y[key], x[key], rtol=0, atol=1e-6)


FUZZ = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.slow  # 500 examples, about 10 s
@FUZZ
@given(cases())
def test_any_parquet_loads_finite_or_fails_in_one_line(case):
    columns, how, settings_ = case
    with tempfile.TemporaryDirectory() as folder:
        check(Path(folder), columns, how, settings_)
