"""Hydra multirun: every combination runs, an invalid one fails alone, the summary is written."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.test_train import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


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
