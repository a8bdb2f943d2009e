"""resume=auto finds the newest run of the same experiment; nothing is resumed by accident."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.training.test_train import run_cli, tiny_overrides


def _summary(result) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in directory.glob("*.ckpt")}


def test_resume_auto_takes_the_newest_run_of_the_same_experiment(tmp_path, table_path):
    base = tiny_overrides(table_path)
    first = _summary(run_cli(*base, "trainer.max_epochs=1", cwd=tmp_path))
    other = _summary(run_cli(*base, "trainer.max_epochs=1", "model.dropout=0.2", cwd=tmp_path))
    before = _digest(Path(first["run_dir"]) / "checkpoints")
    resumed = _summary(run_cli(*base, "trainer.max_epochs=2", "resume=auto", cwd=tmp_path))
    assert resumed["resumed_from"] == first["last_checkpoint"]  # not the dropout=0.2 run
    assert resumed["resumed_from"] != other["last_checkpoint"]
    assert resumed["epochs"] == 2
    assert resumed["run_dir"] != first["run_dir"]
    assert _digest(Path(first["run_dir"]) / "checkpoints") == before  # never overwritten


def test_resume_auto_with_nothing_to_resume_is_an_error(tmp_path, table_path):
    result = run_cli(*tiny_overrides(table_path), "resume=auto", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: resume=auto found no earlier run")
    assert len(result.stderr.strip().splitlines()) == 1


def test_resume_auto_or_new_starts_fresh_when_allowed(tmp_path, table_path):
    args = (*tiny_overrides(table_path), "trainer.max_epochs=1", "resume=auto_or_new")
    summary = _summary(run_cli(*args, cwd=tmp_path))
    assert summary["resumed_from"] is None
    assert summary["epochs"] == 1
