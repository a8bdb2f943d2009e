"""The lazy path: instruments streamed one at a time into a disk-backed window store.

The store holds the normalized float32 rows that `WindowDataset` indexes, as `numpy.memmap`
arrays, so neither the data nor the store has to fit in memory (the OS page cache holds what is
read). It is built in two passes that each hold one instrument or one chunk at a time:

1. `foxhunt.data.stream` yields one instrument's checked, derived float64 rows (row groups
   holding several instruments are first sorted out by instrument into spill files, in one
   pass); they are appended to a float64 scratch file while train-split moments are merged
   (`splits.Moments`: Chan et al.'s parallel update).
2. The scratch file is read back in chunks and normalized into float32 exactly as the in-memory
   path does (same float64 formula, then the cast), so both give the same numbers.

A store is cached: a folder in `data.cache_dir` named after the data and a hash of the data
files' paths, sizes and mtimes and of every data setting that shapes the rows. A re-run with the
same data and config opens it without reading the Parquet files; a new build replaces the stores
made earlier for the same data path.

    inputs.f32   [rows, 1 + observed + known]  normalized, the target first
    target.f32   [rows]                        column 0 of inputs, contiguous
    known.f32    [rows, known]                 the trailing columns of inputs, contiguous
    group.i64    [rows]                        index in the schema's instrument vocabulary
    time.i64     [rows]                        each row's time, int64 ns UTC (for the baselines)
    static.npy   [groups, static]              normalized static reals
    train.i64, val.i64, test.i64               window starts of each split
    meta.json    shapes, the schema (with its normalization), data.futures' rolls; written last
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from foxhunt.data.columns import model_inputs, resolve_columns
from foxhunt.data.futures import Roll
from foxhunt.data.read import timeline
from foxhunt.data.schema import drop_features, found_schema
from foxhunt.data.source import data_files, open_dataset
from foxhunt.data.splits import (
    SPLITS,
    Moments,
    as_float32,
    calendar_cuts,
    check_normalized,
    normalized_statics,
    split_record,
    split_starts,
)
from foxhunt.data.stream import stream
from foxhunt.errors import ConfigError, DataError
from foxhunt.files import alive

FORMAT_VERSION = 6  # 2: calendar splits; 3: time.i64; 4: constant features dropped; 5: rolls
# 6: futures inputs from ratio-adjusted prices under roll.adjust=difference too
LAZY_MEMORY_FRACTION = 0.5  # data.lazy=auto: lazy when the in-memory path would need more
CHUNK_BYTES = 16 * 2**20  # float64 scratch rows normalized at a time
# settings that do not change the stored rows, so a change reuses the store
_NOT_IN_KEY = {"path", "batch_size", "num_workers", "lazy", "cache_dir", "generate_if_missing"}


def _available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def eager_bytes_estimate(cfg: Any) -> int:
    """Peak bytes the in-memory path needs, from the row count in the Parquet footers: the
    projected table and its float64 columns, then float64 inputs, the train rows' copy, the
    normalized copy and the float32 result (benchmarks/bench_data.py measured 6.5 GiB at 4 million
    rows x 32 columns, where this estimates 6.6)."""
    dataset = open_dataset(cfg.path)
    observed, known, _, _, values = resolve_columns(dataset.schema, cfg)
    observed, known = model_inputs(cfg, observed, known)
    encoder_columns = 1 + len(observed) + len(known)
    return dataset.count_rows() * (16 * (len(values) + 2) + 38 * encoder_columns)


def wants_lazy(cfg: Any) -> bool:
    """data.lazy: true, false, or auto (lazy when the in-memory path would need more than
    LAZY_MEMORY_FRACTION of the memory available now)."""
    lazy = cfg.lazy
    if isinstance(lazy, str) and lazy.lower() in ("true", "false"):
        lazy = lazy.lower() == "true"
    if isinstance(lazy, bool):
        return lazy
    if lazy != "auto":
        raise ConfigError(f"data.lazy must be auto, true or false, got {lazy!r}")
    return eager_bytes_estimate(cfg) > LAZY_MEMORY_FRACTION * _available_bytes()


def cache_root(cfg: Any) -> Path:
    """data.cache_dir, or .foxhunt-cache next to the data (the temp dir if that is read-only)."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    parent = Path(cfg.path).resolve().parent
    if os.access(parent, os.W_OK):
        return parent / ".foxhunt-cache"
    return Path(tempfile.gettempdir()) / "foxhunt-cache"


def _settings(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg):
        cfg = OmegaConf.structured(cfg)
    settings = OmegaConf.to_container(cfg, resolve=True)
    return {k: v for k, v in settings.items() if k not in _NOT_IN_KEY}


def cache_key(cfg: Any, fixed_schema: dict | None) -> str:
    """A hash of the data files (path, size, mtime), the settings that shape the rows and the
    normalization a checkpoint fixes."""
    files = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in data_files(cfg)]
    blob = json.dumps(
        {
            "version": FORMAT_VERSION,
            "files": files,
            "data": _settings(cfg),
            "schema": fixed_schema,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Store:
    """The window store's arrays (memmaps), the schema it was normalized with, where it is."""

    inputs: np.ndarray
    target: np.ndarray
    known: np.ndarray
    group: np.ndarray
    static: np.ndarray
    time_ns: np.ndarray
    starts: dict[str, np.ndarray]
    schema: dict[str, Any]
    splits: dict[str, Any]  # the cuts and each instrument's target spans (splits.split_record)
    instruments: int
    rolls: list[Roll]  # data.futures: every root's rolls
    path: Path
    reused: bool


def _memmap(path: Path, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    # copy-on-write: writable for torch.from_numpy, and nothing can change the file
    return np.memmap(path, dtype=dtype, mode="c", shape=shape)


def _open(entry: Path, reused: bool) -> Store:
    meta = json.loads((entry / "meta.json").read_text())
    rows, columns, known = meta["rows"], meta["columns"], meta["known"]
    return Store(
        inputs=_memmap(entry / "inputs.f32", np.float32, (rows, columns)),
        target=_memmap(entry / "target.f32", np.float32, (rows,)),
        known=_memmap(entry / "known.f32", np.float32, (rows, known)),
        group=_memmap(entry / "group.i64", np.int64, (rows,)),
        static=np.load(entry / "static.npy"),
        time_ns=_memmap(entry / "time.i64", np.int64, (rows,)),
        starts={s: _memmap(entry / f"{s}.i64", np.int64, (meta[s],)) for s in SPLITS},
        schema=meta["schema"],
        splits=meta["splits"],
        instruments=meta["instruments"],
        rolls=[Roll(**r) for r in meta["rolls"]],
        path=entry,
        reused=reused,
    )


def open_store(
    cfg: Any, fixed_schema: dict | None, resolve: Callable[[dict, np.ndarray], dict]
) -> Store:
    """The cached store of the configured data, built first if there is none.
    `resolve(found, constant)` turns the schema found in the data (with train-split statistics,
    and which encoder columns are constant over the training rows) into the
    one to normalize with: itself, or a checkpoint's after checking that the two match."""
    root = cache_root(cfg)
    entry = root / f"{Path(cfg.path).resolve().name}-{cache_key(cfg, fixed_schema)}"
    if (entry / "meta.json").exists():
        try:
            return _open(entry, reused=True)
        except (OSError, ValueError, KeyError):  # a file of it deleted or cut short: rebuild
            shutil.rmtree(entry, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    building = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    try:
        _build(cfg, building, resolve)
        building.rename(entry)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        if (entry / "meta.json").exists():  # another process finished it first
            return _open(entry, reused=True)
        raise DataError(f"cannot write the window store in {root}: {exc}") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _evict_older(entry)
    return _open(entry, reused=False)


def _evict_older(entry: Path) -> None:
    """Remove the stores built earlier for the same data path, and abandoned builds of it."""
    data_path = json.loads((entry / "meta.json").read_text())["data_path"]
    prefix = entry.name.rsplit("-", 1)[0] + "-"
    for other in entry.parent.glob(f"{prefix}*"):
        if other == entry or not other.is_dir():
            continue
        if ".tmp-" in other.name:
            pid = other.name.rsplit("-", 1)[1]
            if pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(other, ignore_errors=True)
            continue
        try:
            same = json.loads((other / "meta.json").read_text())["data_path"] == data_path
        except (OSError, ValueError, KeyError):
            continue
        if same:
            shutil.rmtree(other, ignore_errors=True)


def _build(cfg: Any, folder: Path, resolve: Callable[[dict, np.ndarray], dict]) -> None:
    loaded = stream(cfg, folder / "spill")  # first: its checks name what is wrong with the files
    cuts = calendar_cuts(timeline(cfg), cfg)
    E, H = cfg.encoder_length, cfg.prediction_length
    spans: dict[str, dict] = {}
    columns = 1 + len(loaded.observed) + len(loaded.known)
    moments = Moments(columns)
    names: list[str] = []
    statics: list[np.ndarray] = []
    counts = dict.fromkeys(SPLITS, 0)
    rows = 0
    scratch, ordinals = folder / "inputs.f64", folder / "ordinal.i64"
    with (
        open(scratch, "wb") as scratch_f,
        open(ordinals, "wb") as ordinal_f,
        open(folder / "time.i64", "wb") as time_f,
        open(folder / "train.i64", "wb") as train_f,
        open(folder / "val.i64", "wb") as val_f,
        open(folder / "test.i64", "wb") as test_f,
    ):
        for s in loaded.series:
            *starts, train_rows = split_starts(s.time_ns, cuts, E, H)
            spans |= split_record(cuts, [s], [starts], E, H)["instruments"]
            block = np.column_stack([s.target, s.observed, s.known])
            moments.add(block[train_rows])
            block.tofile(scratch_f)
            np.full(len(block), len(names), np.int64).tofile(ordinal_f)
            s.time_ns.astype(np.int64).tofile(time_f)
            for split, f, st in zip(SPLITS, (train_f, val_f, test_f), starts, strict=True):
                (st + rows).tofile(f)
                counts[split] += len(st)
            rows += len(block)
            names.append(s.name)
            statics.append(s.static)
    shutil.rmtree(folder / "spill", ignore_errors=True)

    found = found_schema(loaded, cfg, names, *moments.mean_std(), np.stack(statics))
    schema = resolve(found, moments.constant())
    keep = drop_features(found, schema["dropped"])[1]
    group_of_series, static = normalized_statics(schema, names, statics)
    np.save(folder / "static.npy", static.astype(np.float32))

    _normalize(folder, scratch, ordinals, (columns, keep), schema, names, group_of_series)
    scratch.unlink()
    ordinals.unlink()
    meta = {
        "version": FORMAT_VERSION,
        "data_path": str(Path(cfg.path).resolve()),
        "rows": rows,
        "columns": len(keep),
        "known": len(schema["known"]),
        "instruments": len(names),
        **counts,
        "schema": schema,
        "splits": {"cuts": cuts.to_dict(), "instruments": spans},
        "rolls": [dataclasses.asdict(r) for r in loaded.rolls],  # complete: the series are read
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def _normalize(
    folder: Path,
    scratch: Path,
    ordinals: Path,
    width_keep: tuple[int, list[int]],
    schema: dict[str, Any],
    names: list[str],
    group_of_series: np.ndarray,
) -> None:
    """Pass 2: float64 scratch rows to the float32 store, a chunk at a time, with plain reads
    and writes (a memmap would count every page it touched as resident); of each row, the
    encoder columns `keep` of its `width` (the schema's: without the dropped features)."""
    width, keep = width_keep
    encoder_columns = [schema["target"], *schema["observed"], *schema["known"]]
    columns, known = len(encoder_columns), len(schema["known"])
    mean, std = np.asarray(schema["input_mean"]), np.asarray(schema["input_std"])
    chunk_rows = max(1, CHUNK_BYTES // (8 * width))
    with (
        open(scratch, "rb") as scratch_f,
        open(ordinals, "rb") as ordinal_f,
        open(folder / "inputs.f32", "wb") as inputs_f,
        open(folder / "target.f32", "wb") as target_f,
        open(folder / "known.f32", "wb") as known_f,
        open(folder / "group.i64", "wb") as group_f,
    ):
        while True:
            block = np.fromfile(scratch_f, np.float64, count=chunk_rows * width)
            if block.size == 0:
                break
            rows = block.reshape(-1, width)[:, keep]
            rows -= mean  # in place: the same float64 operations as the in-memory path
            rows /= std
            normalized = as_float32(rows)
            ordinal = np.fromfile(ordinal_f, np.int64, count=len(normalized))
            check_normalized(
                normalized,
                encoder_columns,
                schema["input_mean"],
                schema["input_std"],
                lambda row: names[ordinal[row]],  # noqa: B023 - called before the next chunk
            )
            normalized.tofile(inputs_f)
            np.ascontiguousarray(normalized[:, 0]).tofile(target_f)
            np.ascontiguousarray(normalized[:, columns - known :]).tofile(known_f)
            group_of_series[ordinal].tofile(group_f)
