"""Shared fixtures: small Parquet files written on the fly, and data configs pointing at them.

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


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one thread per test worker (and for the commands it starts): threads of two workers
        # spin-waiting for the same two cores at OpenMP barriers slow both many times over
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


# The longest tests, as measured in CI (seconds, 2 workers): started first, on alternate
# workers, so that neither worker finishes the run alone behind one of them. Why: xdist's
# worksteal gives each worker half of the (shuffled) collection in order and balances only what
# is still queued; two CI runs lost ~55 s each to a worker idle behind a long test at the end.
# A test missing here (renamed) only loses its head start.
LONGEST_S = {  # by test function (tests/evaluation/test_controls*.py, tests/training/, ...)
    "test_compiled_model_trains_and_resumes_eager": 185,
    "test_the_dry_run_passes_every_section": 87,
    "test_the_default_recipe_finds_what_is_planted": 73,
    "test_the_default_recipe_finds_what_is_planted_too": 80,
    "test_deterministic_runs_do_not_depend_on_the_machines_load": 74,
    "test_a_run_killed_at_any_point_of_a_save_leaves_loadable_checkpoints_and_resumes_exactly": 56,
    "test_selection_on_noise_is_called_what_it_is": 52,
    "test_two_processes_shard_sync_and_match_one_at_the_same_global_batch": 47,
    "test_batch_size_search_takes_what_fits_in_every_process": 44,
    "test_cli_prints_table_and_json": 33,
    "test_estimate_is_the_peak_of_a_real_training_step": 31,
    "test_any_parquet_loads_finite_or_fails_in_one_line": 25,
    "test_folds_run_as_parallel_jobs_and_are_pooled_at_the_end": 22,
    "test_a_250_instrument_panel_end_to_end": 22,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        help="the full suite: also the tests marked slow (positive controls, compile, DDP, "
        "whole tuning studies, the wheel, fuzz); without it, or -m, they are deselected",
    )


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle (a wrapper that runs first)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--full") and not config.option.markexpr:
        slow = [i for i in items if "slow" in i.keywords]
        if slow:  # the README's test command is the fast tier
            config.hook.pytest_deselected(items=slow)
            items[:] = [i for i in items if "slow" not in i.keywords]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def expected_s(item: pytest.Item) -> float:
        return LONGEST_S.get(getattr(item, "originalname", item.name), 0)

    longest = sorted((i for i in items if expected_s(i)), key=expected_s, reverse=True)
    rest = [i for i in items if not expected_s(i)]
    first, second = longest[0::2], longest[1::2]
    fill = max(len(items) // 2 - len(first), 0)  # the first worker's half: first, then rest
    items[:] = first + rest[:fill] + second + rest[fill:]


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
