"""Hydra multirun: every combination runs, an invalid one fails alone, the summary is written."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, tiny_overrides


@pytest.mark.slow
def test_multirun_sweep_survives_an_invalid_combination(tmp_path, table_path):
    sweep_dir = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train.py"),
            "-m",
            *tiny_overrides(table_path, "trainer.max_epochs=1", "model.variable_dim=4"),
            "model.hidden_dim=8,12",
            "model.num_heads=2,8",  # hidden 12 does not split into 8 heads
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    by_overrides = {r["overrides"]: r for r in rows}
    bad = [r for r in rows if r["status"] == "invalid"]
    assert len(bad) == 1
    assert bad[0]["overrides"].endswith("model.hidden_dim=12 model.num_heads=8")
    assert "not divisible by model.num_heads=8" in bad[0]["error"]
    good = [r for r in rows if r["status"] == "ok"]
    assert len(good) == 3
    assert all(not math.isnan(float(r["metric"])) for r in good)
    assert len(by_overrides) == 4
    md = (sweep_dir / "sweep_summary.md").read_text()
    assert md.index("| ok |") < md.index("| invalid |")  # sorted by the metric, failures last
    assert (sweep_dir / "sweep_summary.png").stat().st_size > 1000


def _sweep(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), "-m", *args]


@pytest.mark.slow  # 7 CPU-s: the full tier
def test_sweep_resume_with_no_earlier_sweep_is_one_error(tmp_path, table_path):
    args = (*tiny_overrides(table_path), "model.hidden_dim=8,12", "+sweep.resume=true")
    result = subprocess.run(_sweep(*args), cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: +sweep.resume=true found no earlier sweep")
    assert not (tmp_path / "multirun").exists()


@pytest.mark.slow  # 7 CPU-s: the full tier
def test_a_sweep_cannot_select_on_the_test_split(tmp_path, table_path):
    args = (*tiny_overrides(table_path), "model.hidden_dim=8,12", "optimized_metric=test_loss")
    result = subprocess.run(_sweep(*args), cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: optimized_metric=test_loss would select the sweep's best on the test split, "
        "whose score is then no longer out of sample; use val_loss"
    ]
    assert not (tmp_path / "multirun").exists()  # refused before any directory


@pytest.mark.slow
def test_killed_sweep_resumes_skipping_finished_jobs(tmp_path, table_path):
    args = (
        *tiny_overrides(table_path, "trainer.max_epochs=3", "model.variable_dim=4"),
        "model.num_heads=2",
        "model.hidden_dim=8,12,16",
    )
    proc = subprocess.Popen(
        _sweep(*args), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    # job 0 finishes; job 1 is killed (no chance to write anything) after its first epoch
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob("multirun/*/*/1/checkpoints/last.ckpt")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    proc.kill()
    proc.communicate()
    (sweep_dir,) = tmp_path.glob("multirun/*/*")
    finished = (sweep_dir / "0" / "summary.json").read_bytes()
    assert not (sweep_dir / "1" / "summary.json").exists()
    assert not (sweep_dir / "2").exists()

    time.sleep(1.1)  # a new sweep would get a new ${now:%H-%M-%S} directory
    result = subprocess.run(
        _sweep(*args, "+sweep.resume=true"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"continuing the sweep in {sweep_dir.relative_to(tmp_path)}" in result.stderr
    assert list(tmp_path.glob("multirun/*/*")) == [sweep_dir]  # no second sweep directory
    assert (sweep_dir / "0" / "summary.json").read_bytes() == finished  # not re-run
    resumed = json.loads((sweep_dir / "1" / "summary.json").read_text())
    assert (
        Path(resumed["resumed_from"]) == (sweep_dir / "1" / "checkpoints" / "last.ckpt").resolve()
    )
    assert resumed["epochs"] == 3
    fresh = json.loads((sweep_dir / "2" / "summary.json").read_text())
    assert fresh["resumed_from"] is None
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"]
