"""The lazy path: instruments streamed one at a time into a disk-backed window store.

The store holds the normalized float32 rows that `WindowDataset` indexes, as `numpy.memmap`
arrays, so neither the data nor the store has to fit in memory (the OS page cache holds what is
read). `foxhunt.data.stream` yields one instrument's checked, derived float64 rows (row groups
holding several instruments are first sorted out by instrument into spill files, in one pass);
`foxhunt.data.windows.DiskWindowBuilder` appends them to a float64 scratch file while merging
the train-split moments (`splits.Moments`: Chan et al.'s parallel update), then reads the
scratch file back in chunks and normalizes it into float32 exactly as the in-memory path does
(same float64 formula, then the cast), so both give the same numbers. The files are those of
`foxhunt.data.windows`, and

    meta.json    shapes, the schema (with its normalization), data.futures' rolls; written last

A store is cached: a folder in `data.cache_dir` named after the data and a hash of the data
files' paths, sizes and mtimes and of every data setting that shapes the rows. A re-run with the
same data and config opens it without reading the Parquet files; a new build replaces the stores
made earlier for the same data path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foxhunt_serve import Roll
from omegaconf import OmegaConf

from foxhunt.data import panel_inputs
from foxhunt.data.columns import model_inputs, resolve_columns, resolve_target_kind
from foxhunt.data.read import instrument_names, timeline
from foxhunt.data.section import DataSection
from foxhunt.data.source import data_files, open_dataset
from foxhunt.data.splits import SPLITS, calendar_cuts
from foxhunt.data.stream import stream
from foxhunt.data.windows import DiskWindowBuilder, Resolve, WindowArrays, on_disk, split_windows
from foxhunt.errors import ConfigError, WriteError
from foxhunt.files import alive

FORMAT_VERSION = 10  # 2: calendar splits; 3: time.i64; 4: constant features dropped; 5: rolls
# 6: futures inputs from ratio-adjusted prices under roll.adjust=difference too; 7: the target
# on each instrument's scale, a level's on the scale of its moves; 8: a short level's fallback
# scale relative to its own level; 9: naive times local on data.calendar's clock; 10: rows
# and statics by series (meta.json's names), not by the schema's vocabulary
LAZY_MEMORY_FRACTION = 0.5  # data.lazy=auto: lazy when the in-memory path would need more
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
    """data.lazy: true, false, or auto: lazy when the in-memory path would need more than
    LAZY_MEMORY_FRACTION of the memory available now, unless the data's cross-section needs
    every name's rows at once (data.cross_section, or data.target_transform as it resolves on
    the data: `foxhunt.data.panel_inputs`). Free memory never changes what is trained: such a
    panel is read in memory, and a ConfigError refuses it in one line where data.lazy=true, or
    where the memory free cannot hold it. A transform that waits for the target's kind (PENDING)
    may be read lazily: `_build` refuses it once the training rows show returns."""
    lazy = cfg.lazy
    if isinstance(lazy, str) and lazy.lower() in ("true", "false"):
        lazy = lazy.lower() == "true"
    if lazy is False:
        return False
    if lazy is not True and lazy != "auto":
        raise ConfigError(f"data.lazy must be auto, true or false, got {lazy!r}")
    # the names decide auto; under data.lazy=true only where the kind is known before the read
    counted = lazy == "auto" or resolve_target_kind(cfg) == "return"
    auto = str(getattr(cfg, "target_transform", "none")) == "auto"
    names = _names(cfg) if auto and counted else 0
    transform = panel_inputs.ahead(cfg, names)
    if lazy is True:
        why = "data.lazy=true reads the panel one name at a time"
        refused = panel_inputs.refusal(cfg, transform, names, why, "set data.lazy=false")
        if refused:
            raise ConfigError(refused)
        return True
    need, free = eager_bytes_estimate(cfg), _available_bytes()
    why = f"the panel needs about {need / 2**30:.1f} GiB in memory, {free / 2**30:.1f} GiB free"
    refused = panel_inputs.refusal(cfg, transform, names, why, "free memory")
    if refused and need > free:
        raise ConfigError(refused)
    if refused:
        return False
    if transform == panel_inputs.PENDING:  # in memory while it fits, else refused if returns
        return need > free
    return need > LAZY_MEMORY_FRACTION * free


def _names(cfg: Any) -> int:
    """The data's instruments (data.futures: roots), from the group column alone."""
    if not cfg.group_column:
        return 1
    return len(instrument_names(open_dataset(cfg.path), cfg))


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

    arrays: WindowArrays
    schema: dict[str, Any]
    splits: dict[str, Any]  # the cuts and each instrument's target spans (splits.split_record)
    instruments: int
    rolls: list[Roll]  # data.futures: every root's rolls
    path: Path
    reused: bool


def _open(entry: Path, reused: bool) -> Store:
    meta = json.loads((entry / "meta.json").read_text())
    counts = {s: meta[s] for s in SPLITS}
    return Store(
        arrays=on_disk(
            entry,
            meta["rows"],
            meta["columns"],
            meta["known"],
            counts,
            meta["schema"],
            meta["names"],
        ),
        schema=meta["schema"],
        splits=meta["splits"],
        instruments=meta["instruments"],
        rolls=[Roll(**r) for r in meta["rolls"]],
        path=entry,
        reused=reused,
    )


def open_store(
    cfg: Any, fixed_schema: dict | None, resolve: Resolve, section: DataSection
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
        _build(cfg, building, resolve, section)
        building.rename(entry)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        if (entry / "meta.json").exists():  # another process finished it first
            return _open(entry, reused=True)
        raise WriteError(f"cannot write the window store in {root}: {exc}") from None
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


def _build(cfg: Any, folder: Path, resolve: Resolve, section: DataSection) -> None:
    loaded = stream(cfg, folder / "spill", section)  # first: its checks name what is wrong
    cuts = calendar_cuts(timeline(cfg, section), cfg)
    builder = DiskWindowBuilder(folder)
    schema, arrays, splits = split_windows(loaded, cuts, cfg, resolve, builder)
    # the kind the training rows showed decides a transform that waited for it (wants_lazy)
    panel_inputs.refuse_streamed(cfg, schema["target_kind"], len(builder.names))
    shutil.rmtree(folder / "spill", ignore_errors=True)
    meta = {
        "version": FORMAT_VERSION,
        "data_path": str(Path(cfg.path).resolve()),
        "rows": builder.rows,
        "columns": arrays.inputs.shape[1],
        "known": arrays.known.shape[1],
        "instruments": len(builder.names),
        "names": builder.names,
        **builder.counts,
        "schema": schema,
        "splits": splits,
        "rolls": [dataclasses.asdict(r) for r in loaded.rolls],  # complete: the series are read
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
