"""The GPU check's dry run on a CPU (`python -m benchmarks.gpu_check --device cpu --quick`):
every section runs the code it runs on a GPU, at tiny sizes, so the check is ready the day a
GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SECTIONS = ("env", "fused_vsn", "budget", "estimator", "seed", "bench_S")
GPU_ONLY = ("bench_DLE", "bench_DLE_bf16", "bench_DLE_compiled", "bench_DLE_graphs", "bench_B")


@pytest.mark.slow
def test_the_dry_run_passes_every_section(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check"]
        + ["--device", "cpu", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == result
    status = {name: result[name]["status"] for name in (*SECTIONS, *GPU_ONLY)}
    assert status == dict.fromkeys(SECTIONS, "ok") | dict.fromkeys(GPU_ONLY, "skipped"), status
    assert result["fused_vsn"]["cases"]["float32"]["pass"]
    assert result["seed"]["exit_code"] == 0 and result["seed"]["batch_size"] > 0
    assert result["estimator"]["worst_abs_train_error"] < 0.05  # on a CPU the counts are exact
