"""Shared fixtures: small Parquet files written on the fly, and data configs pointing at them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from foxhunt.config import DataConfig


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one thread per test worker (and for the commands it starts): threads of two workers
        # spin-waiting for the same two cores at OpenMP barriers slow both many times over
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


T0 = np.datetime64("2026-01-05T00:00:00", "ns").astype(np.int64)
FIVE_MIN = 5 * 60 * 10**9


def make_table(lengths: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Columns of a multi-instrument file: time, symbol, two features, a known input, target."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, n in lengths.items():
        t = T0 + FIVE_MIN * np.arange(n)
        cols["timestamp"].append(t)
        cols["symbol"].append(np.full(n, symbol))
        cols["f1"].append(rng.normal(size=n))
        cols["f2"].append(rng.normal(size=n) * 10 + 3)
        cols["k1"].append(np.sin(np.arange(n) / 10))
        cols["y"].append(np.cumsum(rng.normal(size=n)))
    return {k: np.concatenate(v) for k, v in cols.items()}


def write_table(path: Path, cols: dict[str, np.ndarray]) -> Path:
    arrays = {
        k: pa.array(v, pa.timestamp("ns", tz="UTC")) if k == "timestamp" else pa.array(v)
        for k, v in cols.items()
    }
    pq.write_table(pa.table(arrays), path)
    return path


@pytest.fixture
def table_path(tmp_path: Path) -> Path:
    return write_table(tmp_path / "bars.parquet", make_table({"AAA": 300, "BBB": 200}))


@pytest.fixture
def data_cfg(table_path: Path) -> DataConfig:
    return DataConfig(
        path=str(table_path),
        group_column="symbol",
        target="y",
        features=["f1", "f2"],
        known_features=["k1"],
        encoder_length=16,
        prediction_length=4,
        val_fraction=0.2,
        test_fraction=0.2,
        batch_size=8,
    )


@pytest.fixture(scope="session")
def es_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small slice of the bundled synthetic ES sample (real OHLCV schema)."""
    from foxhunt.data.sample import make_es_sample

    return make_es_sample(tmp_path_factory.mktemp("es") / "ES_FUT_tiny.parquet", days=12)


def with_(cfg: DataConfig, **changes) -> DataConfig:
    return replace(cfg, **changes)


@contextmanager
def read_only(directory: Path) -> Iterator[Path]:
    """`directory` unwritable for this process while the block runs: `chattr +i` for root
    (which permission bits do not stop), mode 0o555 otherwise; skips where neither works."""
    directory.mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0
    if root:
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("chattr +i is not available to make a directory unwritable for root")
    else:
        directory.chmod(0o555)
    try:
        yield directory
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        else:
            directory.chmod(0o755)
