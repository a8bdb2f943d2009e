"""Shared fixtures: small Parquet files written on the fly, data configs pointing at them, one
tiny trained run, and the check that every test leaves the process as it found it (loaded by
tests/conftest.py where tests run).

The plain functions they are built from live in tests/helpers.py."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from foxhunt.config import DataConfig
from tests.helpers import (
    TINY_MODEL,
    make_table,
    printed_summary,
    run_script,
    shared_dir,
    tiny_overrides,
    write_table,
)

# what Lightning itself sets for the rest of the process: seed_everything's seed, and cuBLAS's
# workspace with trainer.deterministic=true (put back after each test, not a leak of ours)
LIGHTNING_ENV = {"PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG"}
PYTEST_ENV = {"PYTEST_CURRENT_TEST"}  # pytest's own, of the test running
TORCH_ENV = {"_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"}  # torch.compile's, for its process
# what third-party packages set when first imported: scikit-learn's OpenMP switches (pulled in by
# the bench extra's pytorch-forecasting and Darts, imported by whichever test needs them first)
THIRD_PARTY_ENV = {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}


def _process_state() -> dict[str, object]:
    root = logging.getLogger()
    return {
        "environment": dict(os.environ),
        "cwd": os.getcwd(),
        "root logging handlers": list(root.handlers),
        "root logging level": root.level,
        "torch threads": torch.get_num_threads(),
        "torch deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch default dtype": torch.get_default_dtype(),
        "Hydra initialized": GlobalHydra.instance().is_initialized(),
    }


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test leaves the process as it found it (environment, cwd, logging handlers, torch's
    global settings, Hydra): tests run in any order and worker. What a test changed is put back
    and, but for what Lightning sets itself, fails the test."""
    before = _process_state()
    yield
    after = _process_state()
    env_before, env_after = before["environment"], after["environment"]
    changed = {
        k for k in env_before.keys() | env_after.keys() if env_before.get(k) != env_after.get(k)
    }
    leaks = sorted(changed - LIGHTNING_ENV - PYTEST_ENV - TORCH_ENV - THIRD_PARTY_ENV)
    leaks += [k for k in before if k != "environment" and before[k] != after[k]]
    os.environ.clear()
    os.environ.update(env_before)
    os.chdir(before["cwd"])
    root = logging.getLogger()
    root.handlers[:] = before["root logging handlers"]
    root.setLevel(before["root logging level"])
    torch.set_num_threads(before["torch threads"])
    torch.use_deterministic_algorithms(before["torch deterministic algorithms"])
    torch.set_default_dtype(before["torch default dtype"])
    if not before["Hydra initialized"]:
        GlobalHydra.instance().clear()
    assert not leaks, f"the test changed process-wide state: {leaks}"


def _checkout_outputs() -> set[Path]:
    root = Path(__file__).resolve().parents[1]
    return {p for d in ("outputs", "multirun") for p in (root / d).glob("*/*/*")}


@pytest.fixture(autouse=True, scope="session")
def writes_only_under_tmp() -> Iterator[None]:
    """No test writes a run into the checkout's outputs/ or multirun/ (only under tmp paths)."""
    before = _checkout_outputs()
    yield
    new = sorted(map(str, _checkout_outputs() - before))
    assert not new, f"tests wrote runs into the checkout: {new[:5]}"


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
    from foxhunt.data.samples import make_es_sample

    return make_es_sample(tmp_path_factory.mktemp("es") / "ES_FUT_tiny.parquet", days=12)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One tiny training through `foxhunt train` (data=parquet, a few batches of the smallest
    TFT), shared by the tests that read a trained run: trained once per session for all workers."""
    with shared_dir(tmp_path_factory, "tiny_run") as (root, fresh):
        data, run = root / "bars.parquet", root / "run"
        # the progress bar on: into a capture (not a terminal) it is a line per epoch
        once = ("trainer.max_epochs=1", "trainer.enable_progress_bar=true")
        args = [*tiny_overrides(data, *once), *TINY_MODEL, f"hydra.run.dir={run}"]
        if fresh:
            write_table(data, make_table({"AAA": 300, "BBB": 200}))
            code, out, err = run_script("train.py", *args)
            assert code == 0, err[-3000:]
            (root / "stdout.txt").write_text(out)
    out = (root / "stdout.txt").read_text()
    summary = printed_summary(out)
    return SimpleNamespace(
        root=root, data=data, run=run, args=args, summary=summary, out=out,
        ckpt=Path(summary["best_checkpoint"]),
    )  # fmt: skip
