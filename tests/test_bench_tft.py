"""The benchmark script runs end to end (ours only) and ends with its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from foxhunt.memory import PART_NAMES
from foxhunt.models import TemporalFusionTransformer
from tests.helpers import ARCH, ROOT

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


@pytest.mark.slow
def test_the_dle_configuration_feeds_a_static_id_and_known_inputs() -> None:
    """NVIDIA's configuration (hidden 128, 4 heads, encoder 168, decoder 24, 3 quantiles) at a
    small batch: the model it times has the static id (369 series) and three known inputs."""
    args = ["--config", "DLE", "--batch-size", "8", "--skip-theirs", "--lean"]
    args += ["--steps", "1", "--eval-batches", "1", "--repeats", "1", "--warmup", "0"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["config"] == "DLE" and result["batch_size"] == 8
    expected = TemporalFusionTransformer(
        **{**ARCH, "hidden_dim": 128, "variable_dim": 128},
        num_observed=1,
        num_known=3,
        prediction_length=24,
        static_cardinalities=(369,),
    ).num_parameters()
    assert result["ours"]["params"] == expected
    assert result["ours"]["train_samples_per_s"] > 0 and result["ours"]["peak_mib"] > 0
