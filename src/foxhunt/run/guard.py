"""A run directory belongs to one run: checked and locked before Hydra writes anything there.

Hydra writes a run's `.hydra/` and opens its log file in the run directory before the task
starts, so the checks run as a Hydra callback (`on_run_start`, `on_multirun_start`: configured in
conf/train.yaml), where a refusal costs nothing already written:
- the directory (and its `checkpoints/`) must be writable: one line, not the log handler's
  traceback;
- a live run's directory is locked (`filelock`; the lock goes with the process, however it
  ends), so a second run into it stops at once;
- a fresh run into a directory that holds an earlier run's results is refused, unless it
  continues that run (`ckpt_path=` one of its checkpoints, or `resume=auto` of the same
  experiment); a sweep directory likewise, unless `+sweep.resume=true`;
- a DDP process after the first checks nothing: rank 0 holds the lock for them all. Under a
  launcher (torchrun, `foxhunt.run.ranks`) rank 0 then hands its run directory to the others,
  which wait for it here, before their Hydra writes anything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from foxhunt.errors import FoxhuntError
from foxhunt.files import check_writable
from foxhunt.run import ranks, resume
from foxhunt.run.dir import LOCK_NAME, RunDir


def lock(run_dir: Path) -> FileLock:
    """`run_dir`'s lock, held (until released, or the process ends however it ends);
    FoxhuntError if another run has it."""
    held = FileLock(run_dir / LOCK_NAME)
    try:
        held.acquire(timeout=0)
    except Timeout:
        raise FoxhuntError(
            f"run directory {run_dir} is in use by another foxhunt run (it holds "
            f"{LOCK_NAME}); wait for it to end or give another hydra.run.dir"
        ) from None
    return held


def claim(run_dir: Path, continues: bool, resumable: str) -> FileLock:
    """Check `run_dir` is writable, lock it, and refuse it if it holds another run's results;
    the lock, held."""
    check_writable(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # as Hydra would next
    held = lock(run_dir)
    found = RunDir(run_dir).holds_results()
    if found and not continues:
        held.release()
        raise FoxhuntError(
            f"{run_dir} already holds a run's results ({', '.join(found[:3])}); nothing was "
            f"written: {resumable}, or give another directory"
        )
    return held


class RunDirectoryGuard(Callback):
    """The checks of this module as a Hydra callback. `results=False` (predict, interpret):
    only that the run directory is writable."""

    def __init__(self, results: bool = True) -> None:
        self.results = results
        # this run's lock: released when the run ends (a process that runs several commands
        # runs each in turn), or with the process
        self.held: FileLock | None = None

    def _guard(self, check: Any) -> Any:
        try:
            return check()
        except FoxhuntError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)

    def _release(self, **kwargs: Any) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None

    on_run_end = on_multirun_end = _release

    def __getstate__(self) -> dict[str, Any]:
        # a launcher's workers (joblib) get the callbacks too: the lock stays with this process
        return {**self.__dict__, "held": None}

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if ranks.other_rank():  # rank 0 has checked and locked the run directory
            self._guard(lambda: ranks.follow_run_dir(config, None))
            return
        # resolving hydra.run.dir here fixes it (Hydra caches ${now:...}) for run_job after
        run_dir = Path(config.hydra.run.dir).resolve()
        if not self.results:
            self._guard(lambda: check_writable(run_dir))  # no lock
        else:
            continues = resume.continues(config, RunDir(run_dir))
            hint = "continue it with resume=auto or ckpt_path=<one of its checkpoints>"
            self.held = self._guard(lambda: claim(run_dir, continues, hint))
        self._guard(lambda: ranks.follow_run_dir(config, run_dir))  # a launcher's other ranks

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if ranks.other_rank():
            return
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        continues = bool(config.get("sweep", {}).get("resume"))
        hint = "continue it with +sweep.resume=true"
        self.held = self._guard(lambda: claim(sweep_dir, continues, hint))
