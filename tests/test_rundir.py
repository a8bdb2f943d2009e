"""A run directory belongs to one run; an unusable one, or a wrong Trainer setting, is one line
before any data is read."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from filelock import FileLock

from foxhunt.app.train.phases import train
from foxhunt.errors import ConfigError
from foxhunt.run.guard import LOCK_NAME
from tests.helpers import compose_train, read_only, run_cli, tiny_overrides


def _files(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _one_line(result, start: str) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {start}"), line
    return line


@pytest.mark.slow  # several commands or trainings: the full run, not the fast tier
def test_a_fresh_run_into_a_finished_run_is_refused_and_changes_nothing(tmp_path, table_path):
    run = tmp_path / "run"
    args = [*tiny_overrides(table_path), "trainer.max_epochs=1", f"hydra.run.dir={run}"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    before = _files(run)
    line = _one_line(run_cli(*args, cwd=tmp_path), f"{run} already holds a run's results")
    assert "resume=auto" in line
    assert _files(run) == before  # .hydra/, summary.json, checkpoints, logs: all as they were
    # continuing that run in its own directory is what the directory is for
    resumed = run_cli(*args[:-2], "trainer.max_epochs=2", "resume=auto", args[-1], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def test_a_live_run_directory_is_refused_at_once(tmp_path, table_path):
    run = tmp_path / "run"
    run.mkdir()
    with FileLock(run / LOCK_NAME):  # what a live run holds
        started = time.perf_counter()
        result = run_cli(*tiny_overrides(table_path), f"hydra.run.dir={run}", cwd=tmp_path)
        _one_line(result, f"run directory {run} is in use by another foxhunt run")
    assert time.perf_counter() - started < 60
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing of the second run


def test_a_new_sweep_into_an_earlier_sweep_directory_is_refused(tmp_path, table_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("earlier: sweep\n")
    args = ["-m", *tiny_overrides(table_path), "model.hidden_dim=32,64", f"hydra.sweep.dir={sweep}"]
    line = _one_line(run_cli(*args, cwd=tmp_path), f"{sweep} already holds a run's results")
    assert "+sweep.resume=true" in line
    assert sorted(p.name for p in sweep.iterdir()) == [LOCK_NAME, "multirun.yaml"]


def test_unwritable_directories_are_one_line_before_the_data_is_read(tmp_path):
    missing = tmp_path / "nope.parquet"  # reading it would be a different error
    parent = tmp_path / "locked"
    with read_only(parent):
        result = run_cli(*tiny_overrides(missing), f"hydra.run.dir={parent / 'run'}", cwd=tmp_path)
    _one_line(result, f"cannot write in {parent / 'run'}: ")
    run = tmp_path / "run"
    with read_only(run / "checkpoints"):
        result = run_cli(*tiny_overrides(missing), f"hydra.run.dir={run}", cwd=tmp_path)
    line = _one_line(result, f"cannot write in {run / 'checkpoints'}: ")
    status = json.loads((run / "status.json").read_text())
    assert status == {"status": "failed", "error": line.removeprefix("error: ")}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_epochs=-5", "invalid trainer setting: `max_epochs` must be"),
        # a misspelled trainer key, or a precision flag foxhunt does not train in, fails
        # earlier, at composition (tests/test_config.py)
    ],
)
def test_trainer_settings_are_checked_before_the_data_is_read(tmp_path, override, message):
    cfg = compose_train(*tiny_overrides(tmp_path / "nope.parquet"), override)
    with pytest.raises(ConfigError, match=f"^{message}") as err:
        train(cfg, tmp_path / "run")
    assert "\n" not in str(err.value)


def test_interpret_out_dir_that_is_a_file_is_one_line(tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    ckpt = tmp_path / "any.ckpt"
    result = run_cli(f"ckpt_path={ckpt}", f"out_dir={out}", cwd=tmp_path, script="interpret.py")
    _one_line(result, f"out_dir={out} is a file, not a directory")
    assert out.read_text() == "mine"
