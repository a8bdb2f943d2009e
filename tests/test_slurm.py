"""foxhunt on a real SLURM cluster through Hydra's submitit launcher: sweeps as job arrays, a
study's workers as jobs, a killed job's trial run again, a preempted training requeued and
resumed, and the backtest's folds as jobs.

The cluster is scripts/slurm-local's (one node, the machine's CPUs, accounting in slurmdbd),
which .ci/run starts; elsewhere these tests are skipped unless FOXHUNT_TEST_SLURM is set.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from subprocess import PIPE

import optuna
import pyarrow.parquet as pq
import pytest
import torch
from optuna.trial import TrialState

from tests.helpers import ROOT, launcher_env, printed_summary, run_cli, tiny_overrides, wait_for
from tests.test_tune import overrides as tune_overrides
from tests.test_tune import postgres_url, write_panel
from tests.training.test_multinode import COMMON

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
    deadline = time.monotonic() + 300
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


def history(job: str) -> list[str]:
    """Every state `job` ended a run in, a requeue included (sacct --duplicates), once its
    last run has ended (as in `sacct`: the launcher has the result before SLURM ends it)."""
    deadline = time.monotonic() + 300
    while (states := _history(job)) and states[-1] in {"PENDING", "RUNNING", "COMPLETING"}:
        assert time.monotonic() < deadline, states
        time.sleep(1)
    return states


def _history(job: str) -> list[str]:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-D", "-o", "State", "-j", job],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line]


def job_ids(sweep_dir: Path) -> list[str]:
    """The SLURM ids of a sweep's jobs that have started (array tasks: <array>_<task>), from
    submitit's folder."""
    return sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if any(p.glob("*_log.*")))


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


def study_args(tmp_path: Path, *extra: str) -> list[str]:
    """A study of the tiniest TFT (tests/test_tune.py's) in the shared PostgreSQL, new each run."""
    data = write_panel(tmp_path / "panel.parquet", signal_weight=1.0)
    name = f"tune.study=slurm-{uuid.uuid4().hex[:8]}"
    return tune_overrides(data, tmp_path, f"tune.storage={postgres_url()}", name, *extra)


def study_name(args: list[str]) -> str:
    return dict(a.split("=", 1) for a in args)["tune.study"]


def trials(args: list[str]) -> list[optuna.trial.FrozenTrial]:
    storage = dict(a.split("=", 1) for a in args)["tune.storage"]
    return optuna.load_study(study_name=study_name(args), storage=storage).get_trials()


def test_a_studys_workers_run_as_jobs_sharing_one_postgresql_study(cluster, tmp_path):
    args = study_args(tmp_path, "tune.trials=4", "tune.folds=1")
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    jobs = run_cli(
        "-m", "tune.worker=0,1", *args, *LAUNCH, sweep, cwd=tmp_path, script="tune.py",
        own_process=True,
    )  # fmt: skip
    assert jobs.returncode == 0, jobs.stderr[-3000:]
    done = trials(args)
    assert [t.state for t in done] == [TrialState.COMPLETE] * 4
    jobs = job_ids(tmp_path / "sweep")
    assert list(sacct(jobs[0].split("_")[0]).values()) == ["COMPLETED"] * 2
    assert {t.user_attrs["slurm_job"] for t in done} <= set(jobs)
    # each job a worker of the one study; how its trials split depends on when each job
    # started (on a busy node one may find all 4 finished)
    logs = [out.read_text() for out in (tmp_path / "sweep").rglob("*_log.out")]
    printed = [json.loads(line) for log in logs for line in log.splitlines() if line[:1] == "{"]
    assert len(printed) == 2 and {p["study"] for p in printed} == {study_name(args)}
    assert max(p["trials_finished"] for p in printed) == 4
    plain = run_cli(*args, cwd=tmp_path, script="tune.py")  # no new trial: the summary
    summary = json.loads(plain.stdout.strip().splitlines()[-1])
    assert summary["trials_completed"] == 4 and "tune: trial" not in plain.stdout


def running_trial(args: list[str], sweep: subprocess.Popen, timeout: float = 300) -> str:
    """The SLURM job of the study's first running trial, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        try:
            running = [t for t in trials(args) if t.state == TrialState.RUNNING]
        except KeyError:  # the workers have not made the study yet
            running = []
        if running and "slurm_job" in running[0].user_attrs:
            return running[0].user_attrs["slurm_job"]
        time.sleep(0.5)
    raise AssertionError(f"no trial running after {timeout} s")


def test_a_job_cancelled_mid_trial_fails_and_its_trial_runs_again(cluster, tmp_path):
    args = study_args(tmp_path, "tune.trials=4", "tune.folds=1", "optim.schedule_steps=600")
    jobs = ["-m", "tune.worker=0,1", *args, *LAUNCH, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    command = [sys.executable, str(ROOT / "scripts" / "tune.py"), *jobs]
    with subprocess.Popen(command, cwd=tmp_path, stdout=PIPE, stderr=PIPE, text=True) as sweep:
        victim = running_trial(args, sweep)
        subprocess.run(["scancel", victim], check=True, timeout=30)
        _, err = sweep.communicate(timeout=600)
    assert sweep.returncode != 0 and victim in err, err[-3000:]  # the sweep names the job
    # the launcher gives up at the cancelled job; the other runs on: wait for it to end
    states = sacct(victim.split("_")[0])
    assert states[victim].startswith("CANCELLED"), states
    plain = run_cli(*args, cwd=tmp_path, script="tune.py")  # what the sweep left, finished
    assert plain.returncode == 0, plain.stderr[-3000:]
    done = trials(args)
    complete = [t for t in done if t.state == TrialState.COMPLETE]
    killed = [t for t in done if t.state == TrialState.FAIL]
    seen = [(t.number, t.state.name, t.user_attrs.get("slurm_job"), t.user_attrs.get("failed"))
            for t in done]  # fmt: skip
    assert len(complete) == 4 and len(killed) == 1, (victim, seen)
    assert killed[0].user_attrs["slurm_job"] == victim
    retry = [t for t in complete if t.user_attrs.get("retry_of") == killed[0].number]
    assert len(retry) == 1 and retry[0].params == killed[0].params


def test_a_preempted_training_saves_requeues_and_resumes_to_the_same_weights(
    cluster, tmp_path, table_path
):
    # no early stopping: twelve epochs, so that the signal, sent once epoch 0 is written, lands
    # mid-training (a signal after it: tests/training/test_resume.py)
    epochs = ("trainer.max_epochs=12", "callbacks.early_stopping_patience=null")
    args = tiny_overrides(table_path, *epochs, "model.variable_dim=4", "trainer.deterministic=true")
    requeue = ("hydra.launcher.max_num_timeout=2", "resume=auto_or_new")

    def sweep(name: str, *extra: str) -> subprocess.Popen:
        jobs = ["-m", *args, *LAUNCH, *extra, f"hydra.sweep.dir={tmp_path / name}"]
        command = [sys.executable, str(ROOT / "scripts" / "train.py"), *jobs]
        return subprocess.Popen(command, cwd=tmp_path, stdout=PIPE, stderr=PIPE, text=True)

    with sweep("straight") as straight, sweep("preempted", *requeue) as preempted:
        wait_for("preempted/0/checkpoints/last.ckpt", tmp_path, preempted)  # epoch 0 done
        (job,) = job_ids(tmp_path / "preempted")
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        for proc in (straight, preempted):
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
    assert history(job) == ["REQUEUED", "COMPLETED"]  # saved, requeued, resumed
    summary = json.loads((tmp_path / "preempted" / "0" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("preempted/0/checkpoints/last.ckpt")
    weights = [
        torch.load(tmp_path / run / "0" / "checkpoints" / "last.ckpt", weights_only=True)
        for run in ("straight", "preempted")
    ]
    assert weights[0]["global_step"] == weights[1]["global_step"]
    for name, value in weights[0]["state_dict"].items():
        assert torch.equal(value, weights[1]["state_dict"][name]), name


def test_a_backtests_folds_run_as_jobs_and_the_same_command_pools_them(
    cluster, tmp_path, table_path
):
    sweep_dir = tmp_path / "sweep"
    folds = ("backtest.folds=2", "backtest.fold=0,1")
    jobs = ["-m", *tiny_overrides(table_path), *folds, *LAUNCH, f"hydra.sweep.dir={sweep_dir}"]
    command = [sys.executable, str(ROOT / "scripts" / "backtest.py"), *jobs]
    # the command that submitted the folds dies (a login shell closed): the jobs run on
    with subprocess.Popen(command, cwd=tmp_path, stdout=PIPE, stderr=PIPE, text=True) as first:
        while not (sweep_dir / ".submitit").is_dir() or len(job_ids(sweep_dir)) < 2:
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.2)
        first.kill()
    array = job_ids(sweep_dir)[0].split("_")[0]
    assert list(sacct(array).values()) == ["COMPLETED"] * 2
    assert not (sweep_dir / "backtest_summary.json").exists()
    trained = {p: p.stat().st_mtime_ns for p in sweep_dir.glob("*/checkpoints/last.ckpt")}
    assert len(trained) == 2

    again = run_cli(
        *jobs, "+sweep.resume=true", cwd=tmp_path, script="backtest.py", own_process=True
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in trained} == trained  # no fold trained again
    summary = json.loads((sweep_dir / "backtest_summary.json").read_text())
    assert [f["fold"] for f in summary["folds"]] == [0, 1] and summary["folds_missing"] == []
    oos = pq.read_table(sweep_dir / "oos_predictions.parquet")
    assert sorted(set(oos["fold"].to_pylist())) == [0, 1]
    assert (sweep_dir / "backtest_report.md").is_file()


def srun_job(cwd: Path, tasks: int, args: list[str]) -> tuple[int, str]:
    """A user's DDP job script, `tasks` tasks on one node running `foxhunt train` with `args`
    (srun starts the processes), submitted and waited for: its exit code and output."""
    script = cwd / "ddp.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes=1 --ntasks-per-node={tasks} --cpus-per-task=1 --mem=4G --time=5\n"
        f"srun --kill-on-bad-exit=1 {sys.executable} -m foxhunt train {' '.join(args)}\n"
    )
    sbatch = ["sbatch", "--wait", f"--chdir={cwd}", f"--output={cwd / 'job.out'}", str(script)]
    env = launcher_env()  # what sbatch passes on
    done = subprocess.run(sbatch, capture_output=True, text=True, timeout=420, env=env)
    return done.returncode, (cwd / "job.out").read_text()


def test_ddp_as_srun_tasks_trains_one_run_as_one_process_would(cluster, tmp_path, table_path):
    # as tests/training/test_multinode.py: 2 ranks at batch 8 against 1 process at 16
    common = tiny_overrides(table_path, *COMMON)
    code, out = srun_job(
        tmp_path, 2, [*common, "trainer=ddp", "trainer.devices=2", "data.batch_size=8"]
    )
    assert code == 0, out[-3000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")  # one run directory, rank 0's
    assert {p.name for p in run_dir.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    assert out.count("every figure in") == 1  # the summary line, printed by rank 0 alone
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["global_batch_size"]) == (2, 16)
    assert "threads: 1 on rank 1 of 2" in (run_dir / "train_ddp_process_1.log").read_text()
    (tmp_path / "one").mkdir()
    single = run_cli(*common, "data.batch_size=16", cwd=tmp_path / "one", own_process=True)
    one = printed_summary(single.stdout)
    for key in ("val_loss", "test_loss", "test_mae", "baseline_test_loss"):
        assert summary["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5), key


def test_fewer_srun_tasks_than_devices_is_one_error_line(cluster, tmp_path, table_path):
    args = [*tiny_overrides(table_path), "trainer=ddp", "trainer.devices=2"]
    code, out = srun_job(tmp_path, 1, args)  # Lightning #19883: once a hang
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "--ntasks-per-node=1" in errors[0], out[-3000:]
    assert "Traceback" not in out
