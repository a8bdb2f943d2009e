"""A tuning study in its storage, shared by several processes and machines: opened (a journal
file in the study's directory, repaired after a killed worker, or an RDB URL), its plan
recorded, its trial counts, and the trials of dead workers found by their heartbeats and queued
again (`foxhunt.app.tune.search` runs the study loop over it)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig
from optuna.trial import TrialState

from foxhunt.errors import ConfigError

log = logging.getLogger(__name__)
JOURNAL = "study.journal"
HOST = socket.gethostname()


def storage_label(cfg: DictConfig, study_dir: Path) -> str:
    """The storage, as a log line names it (an RDB URL without its password)."""
    if not cfg.tune.storage:
        return str(study_dir / JOURNAL)
    from sqlalchemy.engine import make_url

    return make_url(str(cfg.tune.storage)).render_as_string(hide_password=True)


def open_study(cfg: DictConfig, name: str, study_dir: Path, seed: int) -> optuna.Study:
    """The study in its storage, created on first use; an unreachable RDB is one line."""
    t = cfg.tune
    if t.storage:
        storage: Any = optuna.storages.RDBStorage(
            str(t.storage), engine_kwargs={"pool_pre_ping": True}
        )
    else:
        repair_journal(study_dir / JOURNAL)
        backend = optuna.storages.journal.JournalFileBackend(str(study_dir / JOURNAL))
        storage = optuna.storages.JournalStorage(backend)
    pruner: optuna.pruners.BasePruner = {
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=t.startup_trials),
        "halving": lambda: optuna.pruners.SuccessiveHalvingPruner(),
        "none": lambda: optuna.pruners.NopPruner(),
    }[str(t.pruner)]()
    return optuna.create_study(
        study_name=name,
        storage=storage,
        direction="minimize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=t.startup_trials),
        pruner=pruner,
    )


def repair_journal(path: Path, chunk: int = 1 << 16) -> None:
    """Cut off a journal's last line if its append was cut short (a worker killed mid-write):
    it never counted, and Optuna would fail on the next line appended after it. Under the
    journal's own lock (Optuna's default: a symlink beside it, stale after 30 s)."""
    if not path.is_file():
        return
    lock = optuna.storages.journal.JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        with open(path, "r+b") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(end - 1, 0))
            if end == 0 or f.read(1) == b"\n":
                return
            at = end
            while at > 0:  # back to the last newline
                start = max(at - chunk, 0)
                f.seek(start)
                block = f.read(at - start)
                if (i := block.rfind(b"\n")) >= 0:
                    at = start + i + 1
                    break
                at = start
            f.truncate(at)
            os.fsync(f.fileno())
        log.warning("tune: %s ended in a cut-off line (a killed worker's); removed", path)
    finally:
        lock.release()


def open_study_or_explain(cfg: DictConfig, name: str, study_dir: Path, seed: int) -> optuna.Study:
    try:
        return open_study(cfg, name, study_dir, seed)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's, the driver's: one line for any
        if not cfg.tune.storage:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"tune.storage={storage_label(cfg, study_dir)}: cannot open the study ({first})"
        ) from None


def same_plan(study: optuna.Study, plan: dict[str, Any]) -> None:
    """The plan recorded in a new study; a study continued with another space or other folds
    is refused (its trials would not compare)."""
    recorded = study.user_attrs.get("plan")
    if recorded is None:
        study.set_user_attr("plan", plan)
    elif recorded != json.loads(json.dumps(plan)):
        raise ConfigError(
            f"study {study.study_name} was begun with another tune_space or other folds (the "
            "data or backtest settings changed): name a new one with tune.study=..."
        )


def counts(study: optuna.Study) -> dict[str, int]:
    """The study's trials by state, across every worker (the failed: those with an error)."""
    trials = study.get_trials(deepcopy=False)
    n = {s: sum(t.state == s for t in trials) for s in TrialState}
    errors = sum(t.state == TrialState.FAIL and "error" in t.user_attrs for t in trials)
    return {
        "trials_completed": n[TrialState.COMPLETE],
        "trials_pruned": n[TrialState.PRUNED],
        "trials_failed": errors,
        "trials_finished": n[TrialState.COMPLETE] + n[TrialState.PRUNED],
        "trials_running": n[TrialState.RUNNING],
    }


def counts_toward(t: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial takes one of the study's tune.trials: finished, running, or failed
    with an error (not one interrupted or left by a dead worker, which runs again)."""
    finished = t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return finished or (t.state == TrialState.FAIL and "error" in t.user_attrs)


def recover(study: optuna.Study, grace_s: float) -> None:
    """Trials left running by a dead worker (its process gone on this host, or no heartbeat
    for `grace_s`) marked failed, and their parameters queued to run again."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = t.user_attrs
        gone = attrs.get("host") == HOST and not _alive(int(attrs.get("pid", -1)))
        gone = gone or _slurm_job_ended(attrs.get("slurm_job"))
        silent = time.time() - float(attrs.get("alive_at", time.time())) > grace_s
        if not (gone or silent):
            continue
        study._storage.set_trial_user_attr(t._trial_id, "failed", "its worker died")
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
        log.warning("tune: trial %d was left running by a dead worker; queued again", t.number)


def _slurm_job_ended(job: str | None) -> bool:
    """Whether the SLURM job that ran a trial has ended (cancelled, failed, completed...) or was
    requeued and waits to run again (its trial then runs no more), by the cluster's accounting
    (every run of it: sacct -D); False where sacct cannot say."""
    if job is None or shutil.which("sacct") is None:
        return False
    try:
        done = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-D", "-o", "State", "-j", job],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and ended(done.stdout)


# the states of a job that has not ended: PENDING too, which accounting also says of a job
# whose start it has not recorded yet (a worker's recover then failed a live trial: CI, #68)
LIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING", "STOPPED"}


def ended(sacct: str) -> bool:
    """From `sacct -n -X -P -D -o State`'s output (a line a run of the job, the latest last;
    such as "CANCELLED by 0"): whether its latest run ended, or it waits after a requeue."""
    states = [line.split()[0] for line in sacct.splitlines() if line.strip()]
    if not states:
        return False  # accounting does not know it yet
    requeued = "REQUEUED" in states[:-1] and states[-1] == "PENDING"
    return requeued or states[-1] not in LIVE


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_worker(trial: optuna.Trial) -> None:
    """The trial's host and process (and SLURM job), which `recover` checks are still alive."""
    trial.set_user_attr("host", HOST)
    trial.set_user_attr("pid", os.getpid())
    if job := slurm_job():
        trial.set_user_attr("slurm_job", job)


def slurm_job() -> str | None:
    """This process's SLURM job as squeue, sacct and scancel name it (<array>_<task> in an
    array), or None outside SLURM."""
    env = os.environ
    if "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


class Heartbeat:
    """The trial's `alive_at` user attribute renewed every `every_s` seconds while it runs."""

    def __init__(self, trial: optuna.Trial, every_s: float) -> None:
        self.trial, self.every_s, self.stop = trial, every_s, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            self.trial.set_user_attr("alive_at", time.time())
            if self.stop.wait(self.every_s):
                return

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
