"""Entry-point plumbing shared by the scripts: one-line user errors and exit code 2, an
interrupted run's exit, and re-running a sweep into its own directory (`+sweep.resume=true`)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from foxhunt.config import register_configs
from foxhunt.errors import FoxhuntError, WriteError
from foxhunt.files import write_json
from foxhunt.run.resume import resume_sweep
from foxhunt.threads import use_cpus
from foxhunt.training.checkpointing import Interrupted

EXIT_USER_ERROR = 2
_task_started = False
# Hydra prints a config it cannot compose (a wrong override) over several lines and exits 1;
# with HYDRA_FULL_ERROR=1 it raises the error instead, which run() prints as one line. This
# variable says foxhunt set it, not the user; the task unsets both (its own errors are
# reported as before). Environment variables, so that joblib's worker processes know too.
_SET_BY_FOXHUNT = "FOXHUNT_SET_HYDRA_FULL_ERROR"


def task(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Hydra task: a FoxhuntError becomes `error: <message>` on stderr and exit 2
    (the traceback only with HYDRA_FULL_ERROR=1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _task_started
        _task_started = True
        if os.environ.pop(_SET_BY_FOXHUNT, None):
            del os.environ["HYDRA_FULL_ERROR"]
        try:
            return fn(*args, **kwargs)
        except FoxhuntError as exc:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {exc}", file=sys.stderr)
            if _in_multirun() and not isinstance(exc, WriteError):
                # one invalid combination fails its job, not the sweep; the summary shows it.
                # inf, not NaN: the Optuna sweeper aborts the study on a NaN, and every
                # optimized_metric is a loss (minimised)
                _record_status("invalid", str(exc))
                return float("inf")
            _record_status("failed", str(exc))
            sys.exit(EXIT_USER_ERROR)
        except Interrupted as exc:
            # the whole command stops (a sweep too); the sweep summary will show this job
            print(f"interrupted: {exc}", file=sys.stderr)
            _record_status("interrupted", str(exc))
            sys.exit(128 + exc.signum)

    return wrapper


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _record_status(status: str, error: str) -> None:
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.utilities import rank_zero_only

    if not HydraConfig.initialized() or rank_zero_only.rank != 0:  # DDP: one process writes
        return
    out = Path(HydraConfig.get().runtime.output_dir)
    try:
        write_json(out / "status.json", {"status": status, "error": error})
    except WriteError:
        pass  # an unwritable run directory: the error line already said what failed


def _one_line(exc: Exception) -> str:
    """Hydra's composition error, with the OmegaConf error under it (which names the key and
    what it accepts), as one line."""
    cause = exc.__cause__
    if not isinstance(cause, OmegaConfBaseException):  # a missing option lists those there are
        return " ".join(str(exc).split("Config search path")[0].split())
    head = str(exc).splitlines()[0].rstrip(".")
    return f"{head}: {str(cause).splitlines()[0]} (full_key: {cause.full_key})"


def run(
    hydra_main: Callable[[], Any],
    resume: Callable[[list[str]], list[str]] = resume_sweep,
) -> None:
    """Call a `@hydra.main` function. A config Hydra cannot compose (an unknown key, a value of
    the wrong type or outside an enum) is the user's error: one line, exit 2, before any task
    starts. `resume` rewrites the command line first (into an earlier run's directory)."""
    global _task_started
    _task_started = False
    # the switches below last for this call only: a test (or any program) that runs several
    # commands in one process must not inherit them
    saved = {k: os.environ.get(k) for k in ("HYDRA_FULL_ERROR", _SET_BY_FOXHUNT)}
    try:
        _run(hydra_main, resume)
    finally:
        _task_started = False
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run(hydra_main: Callable[[], Any], resume: Callable[[list[str]], list[str]]) -> None:
    register_configs()
    use_cpus()  # intra-op threads: the CPUs this process may use (foxhunt.threads)
    try:
        sys.argv[1:] = resume(sys.argv[1:])
    except FoxhuntError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        os.environ |= {"HYDRA_FULL_ERROR": "1", _SET_BY_FOXHUNT: "1"}
    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as exc:
        if _task_started or not os.environ.get(_SET_BY_FOXHUNT):
            raise  # the user's HYDRA_FULL_ERROR=1: the traceback
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except SystemExit as exc:
        if exc.code == 1 and not _task_started:
            sys.exit(EXIT_USER_ERROR)
        raise
