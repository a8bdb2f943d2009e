"""The test session's options and order. The fixtures are tests/fixtures.py's, loaded where tests
run: not in xdist's controller, which only hands tests to its workers (importing torch there
would cost the whole run its seconds before any worker starts)."""

from __future__ import annotations

import os
import sys

import pytest

# The tests write bytecode caches even where PYTHONDONTWRITEBYTECODE is set (as in some sandboxes
# and CI images): without them every worker compiles src/ again and pytest rewrites every test
# module again, about 5 s of each run's start. The caches go to __pycache__ (git ignores them).
sys.dont_write_bytecode = False


def _controller(config: pytest.Config) -> bool:
    """Whether this process is xdist's controller (-n N with N > 0, not one of its workers)."""
    workers = config.getoption("numprocesses", None)
    return bool(workers) and not os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    if not _controller(config):
        config.pluginmanager.import_plugin("tests.fixtures")
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


# the models built once a session and read by tests on both workers (tests/helpers.shared_dir),
# each at the start of one worker's half, with its tests: a worker that reached a test of one
# while the other built it sat idle (13 s for `plain`, when both halves held its tests)
SHARED = ("plain", "tiny_run")


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

    def shared(item: pytest.Item) -> str | None:
        """The first of the shared models `item` reads (none: it reads none)."""
        return next((n for n in SHARED if n in getattr(item, "fixturenames", ())), None)

    # each shared model and its tests open one worker's half, alternately; then the longest
    opening: list[list[pytest.Item]] = [[], []]
    for k, name in enumerate(SHARED):
        opening[k % 2] += [i for i in items if shared(i) == name]
    longest = sorted((i for i in items if expected_s(i) and not shared(i)), key=expected_s)[::-1]
    rest = [i for i in items if not expected_s(i) and shared(i) is None]
    first, second = opening[0] + longest[0::2], opening[1] + longest[1::2]
    fill = max(len(items) // 2 - len(first), 0)  # the first worker's half: first, then rest
    items[:] = first + rest[:fill] + second + rest[fill:]
