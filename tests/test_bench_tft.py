"""The benchmark script runs end to end (ours only) and ends with its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from foxhunt.memory import PART_NAMES
from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_tft.py"
ARGS = ["--config", "S", "--skip-theirs", "--steps", "2", "--eval-batches", "2"]
ARGS += ["--repeats", "1", "--warmup", "1"]

TOP_KEYS = {
    "config",
    "device",
    "torch",
    "threads",
    "train_speedup",
    "eval_speedup",
    "memory_ratio",
    "gemm_gflops",
    "datamodule_windows_per_s",
    "datamodule_vs_train",
    "ours",
    "theirs",
}
OURS_KEYS = {
    "params",
    "train_samples_per_s",
    "eval_ms_per_batch",
    "peak_mib",
    "peak_breakdown_mib",
    "gflop_per_step",
    "achieved_gflops",
    "gemm_fraction",
}


@pytest.mark.slow
def test_bench_script_ours_only_ends_with_json() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *ARGS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    assert TOP_KEYS <= result.keys()
    assert result["config"] == "S" and result["device"] == "cpu"
    # without theirs there is nothing to compare against
    assert result["theirs"] is None
    assert result["train_speedup"] is None and result["memory_ratio"] is None
    for key in ("gemm_gflops", "datamodule_windows_per_s", "datamodule_vs_train", "threads"):
        assert result[key] > 0, key

    ours = result["ours"]
    assert OURS_KEYS <= ours.keys()
    for key in OURS_KEYS - {"peak_breakdown_mib"}:
        assert ours[key] > 0, key
    breakdown = ours["peak_breakdown_mib"]
    assert list(breakdown) == list(PART_NAMES)  # the parts the memory estimator names
    assert breakdown["parameters"] > 0 and breakdown["optimizer_state"] > 0
    assert sum(breakdown.values()) == pytest.approx(ours["peak_mib"], rel=1e-6)
