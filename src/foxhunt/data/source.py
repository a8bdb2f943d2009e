"""Where the data is: one Parquet file or a directory of them, opened with pyarrow, and the
bundled sample, generated at its own path on first use."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from foxhunt.data.samples import SAMPLE_PATH, make_es_sample
from foxhunt.errors import DataError

log = logging.getLogger(__name__)


def one_line(exc: Exception) -> str:
    """An exception's message on one line, for a DataError that quotes it."""
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
        raise DataError(f"cannot read {p} as Parquet: {one_line(exc)}") from None
    if isinstance(dataset, pads.FileSystemDataset) and not dataset.files:
        raise DataError(f"no Parquet files in {p}")
    return dataset


def data_files(cfg: Any) -> list[Path]:
    """The Parquet files the configured data consists of."""
    dataset = open_dataset(cfg.path)
    if isinstance(dataset, pads.FileSystemDataset):
        return [Path(f) for f in dataset.files]
    return [Path(cfg.path)]


def ensure_sample(path: str | Path) -> None:
    """Generate the bundled synthetic ES sample if `path` is its own location and it is not
    there yet. Any other missing path stays missing, for `open_dataset` to name: a mistyped
    data.path must never train on synthetic data."""
    p = Path(path)
    if p.exists() or p.resolve() != Path(SAMPLE_PATH).resolve():
        return
    log.info("generating the bundled sample at %s", p)
    make_es_sample(p)
