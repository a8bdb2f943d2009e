"""Shared fixtures: small Parquet files written on the fly, and data configs pointing at them.

The plain functions they are built from live in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from foxhunt.config import DataConfig
from tests.helpers import make_table, write_table


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one thread per test worker (and for the commands it starts): threads of two workers
        # spin-waiting for the same two cores at OpenMP barriers slow both many times over
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


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
