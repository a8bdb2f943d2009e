"""foxhunt on a real SLURM cluster through Hydra's submitit launcher: sweeps as job arrays, a
study's workers as jobs, a killed job's trial run again, a preempted training requeued and
resumed, and the backtest's folds as jobs.

The cluster is scripts/slurm-local's (one node, the machine's CPUs, accounting in slurmdbd),
which .ci/run starts; elsewhere these tests are skipped unless FOXHUNT_TEST_SLURM is set.
"""

from __future__ import annotations

import csv
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import run_cli, tiny_overrides

pytestmark = pytest.mark.slow  # whole jobs: the full tier

# each job 1 CPU of the node and 2 GB, no GPU, 10 minutes; the partition is the cluster's default
LAUNCH = (
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.timeout_min=10",
)


def up() -> bool:
    """Whether the cluster's node takes jobs (sinfo waits ~10 s for a controller that is down)."""
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in done.stdout.split())


@pytest.fixture(scope="module")
def cluster() -> None:
    """Waits (at most a minute) until the cluster is up; skips where none was asked for."""
    if not os.environ.get("FOXHUNT_TEST_SLURM"):
        pytest.skip("FOXHUNT_TEST_SLURM is not set (.ci/run starts a cluster: scripts/slurm-local)")
    deadline = time.monotonic() + 60
    while not up():
        assert time.monotonic() < deadline, "the SLURM cluster is not up: scripts/slurm-local start"
        time.sleep(1)


def sacct(job: str) -> dict[str, str]:
    """Each job (array task) of `job` and its state, from the cluster's accounting, once none
    is pending or running any more (the launcher has a job's result before SLURM ends it)."""
    deadline = time.monotonic() + 60
    while (states := _sacct(job)) and {"PENDING", "RUNNING", "COMPLETING"} & set(states.values()):
        assert time.monotonic() < deadline, states
        time.sleep(1)
    return states


def _sacct(job: str) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", job],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def job_ids(sweep_dir: Path) -> list[str]:
    """The SLURM ids of a sweep's jobs (array tasks: <array>_<task>), from submitit's folder."""
    return sorted(p.name for p in (sweep_dir / ".submitit").glob("*_*") if p.is_dir())


def summary_rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


def test_a_sweep_runs_as_a_job_array_and_writes_its_summary(cluster, tmp_path, table_path):
    sweep_dir = tmp_path / "sweep"
    args = tiny_overrides(table_path, "trainer.max_epochs=1", "model.variable_dim=4")
    grid = ("model.hidden_dim=8,12", "model.num_heads=2,4")
    result = run_cli(
        "-m", *args, *LAUNCH, *grid, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path, own_process=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = job_ids(sweep_dir)
    array = jobs[0].split("_")[0]
    assert jobs == [f"{array}_{k}" for k in range(4)]  # one array, a task per combination
    assert list(sacct(array).values()) == ["COMPLETED"] * 4
    rows = summary_rows(sweep_dir)
    assert sorted(r["status"] for r in rows) == ["ok"] * 4
    swept = {
        tuple(o for o in r["overrides"].split() if o.startswith(("model.h", "model.n")))
        for r in rows
    }
    assert swept == {
        (f"model.hidden_dim={d}", f"model.num_heads={h}") for d in (8, 12) for h in (2, 4)
    }
