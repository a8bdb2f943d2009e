"""The commands' error routing, run in one process as a test session runs many: a user's error
is one line and exit 2 wherever it is raised, the user's HYDRA_FULL_ERROR=1 gives the
traceback, and no command leaves the environment changed for the next."""

from __future__ import annotations

import os

import pytest
from hydra.errors import HydraException

from foxhunt.errors import ConfigError
from tests.helpers import run_script

BAD_TYPE = "model.hidden_dim=abc"
TYPE_ERROR = "Value 'abc' of type 'str' could not be converted to Integer"


def _one_line(code: int, stderr: str, *wanted: str) -> None:
    assert code == 2 and stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    for text in wanted:
        assert text in stderr


def test_errors_are_one_line_in_any_order_and_leave_the_environment_as_it_was(tmp_path):
    before = dict(os.environ)
    run = f"hydra.run.dir={tmp_path / 'run'}"
    for _ in range(2):  # each kind after the other, twice: none depends on what ran before
        _one_line(*run_script("predict.py", run)[::2], "ckpt_path is required")  # in the task
        _one_line(*run_script("train.py", BAD_TYPE, run)[::2], TYPE_ERROR, "model.hidden_dim")
        _one_line(*run_script("predict.py", "predict.nope=1", run)[::2], "predict.nope")
        assert dict(os.environ) == before


def test_a_sweep_with_one_bad_combination_is_one_line_before_any_job(tmp_path):
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    code, _, stderr = run_script("train.py", "-m", "model.hidden_dim=16,abc", sweep)
    _one_line(code, stderr, TYPE_ERROR)
    assert not (tmp_path / "sweep").exists()  # nothing started


def test_the_users_hydra_full_error_gives_the_traceback(tmp_path):
    run = f"hydra.run.dir={tmp_path / 'run'}"
    with pytest.raises(HydraException, match="Error merging override model.hidden_dim=abc"):
        run_script("train.py", BAD_TYPE, run, full_error=True)
    with pytest.raises(ConfigError, match="ckpt_path is required"):
        run_script("predict.py", run, full_error=True)
    assert "HYDRA_FULL_ERROR" not in os.environ
