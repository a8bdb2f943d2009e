"""Entry-point plumbing shared by the commands (`foxhunt.app.commands`): `cli.run` composes a
command's config with Hydra, routes its errors and starts it. A user's error (a FoxhuntError
from the task, or a config Hydra cannot compose) is one line on stderr and exit 2; an
interrupted run exits 128 + the signal; the user's own HYDRA_FULL_ERROR=1 gives the
traceback instead. Nothing here changes the environment or module state: tests run many
commands in one process."""

from __future__ import annotations

import functools
import itertools
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from foxhunt.config import register_configs
from foxhunt.errors import ConfigError, FoxhuntError, WriteError
from foxhunt.files import write_json
from foxhunt.run.resume import resume_sweep
from foxhunt.threads import use_cpus
from foxhunt.training.checkpointing import Interrupted

EXIT_USER_ERROR = 2
MAX_CHECKED_JOBS = 64  # a larger sweep's other combinations are composed by Hydra alone
CONFIG_MODULE = "foxhunt.conf"  # the configs ship in the package: a wheel runs anywhere


@dataclass(frozen=True)
class Command:
    """One `foxhunt` command: its word, its config (`foxhunt/conf/<config>.yaml`), its Hydra
    task, a line for `foxhunt --help`, and how it rewrites a resumed command line."""

    name: str
    config: str
    fn: Callable[[DictConfig], Any]
    about: str
    resume: Callable[[list[str]], list[str]] = resume_sweep


def _full_error() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"  # the user's switch, read, never set


def task(fn: Callable[..., Any], words: tuple[str, ...] = ()) -> Callable[..., Any]:
    """Wrap a Hydra task: a FoxhuntError becomes `error: <message>` on stderr and exit 2
    (the traceback only with HYDRA_FULL_ERROR=1). `words` (`train` of `foxhunt train`) go back
    into sys.argv while the task runs: Hydra parses sys.argv[1:] as overrides, and Lightning's
    DDP launcher starts the other processes by running sys.argv again."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sys.argv[1:1] = words
        try:
            result = fn(*args, **kwargs)
            if _in_multirun():  # a job that writes no summary.json (a study's worker) is ok too
                _record_status("ok", "")
            return result
        except FoxhuntError as exc:
            if _full_error():
                raise
            print(f"error: {exc}", file=sys.stderr)
            if _in_multirun() and not isinstance(exc, WriteError):
                # one invalid combination fails its job, not the sweep; the summary shows it.
                # inf, not NaN: a sweeper (Nevergrad, Ax) may abort on a NaN, and every
                # optimized_metric is a loss (minimised)
                _record_status("invalid", str(exc))
                return float("inf")
            _record_status("failed", str(exc))
            sys.exit(EXIT_USER_ERROR)
        except Interrupted as exc:
            # the whole command stops (a sweep too); the sweep summary will show this job
            print(f"interrupted: {exc}", file=sys.stderr)
            _record_status("interrupted", str(exc))
            _hand_on(exc.signum)
            sys.exit(128 + exc.signum)
        finally:
            del sys.argv[1 : 1 + len(words)]

    return wrapper


def _hand_on(signum: int) -> None:
    """SIGUSR2 (SLURM's warning of the time limit, or a preemption) handed on, now that the
    checkpoint is written, to the handler the process had: submitit's requeues the job (which
    resumes with resume=auto_or_new) and exits. Without one the run exits as for SIGTERM."""
    handler = signal.getsignal(signum)
    if signum == getattr(signal, "SIGUSR2", None) and callable(handler):
        handler(signum, None)


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


def _jobs(overrides: list[str]) -> list[list[str]]:
    """The override lists of the jobs a command line makes: one, or a sweep's combinations
    (with -m, or a config that sets hydra.mode=MULTIRUN; sweeps a sweeper expands itself, such
    as an interval, are left to it)."""
    choices = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if not o.is_sweep_override():
            choices.append([o.input_line])
            continue
        try:
            values = list(o.sweep_string_iterator())
        except Exception:  # noqa: BLE001 - an interval, a sweeper's own syntax: not ours
            continue
        prefix = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(o.type.name, "")
        choices.append([f"{prefix}{o.get_key_element()}={v}" for v in values])
    return [list(job) for job in itertools.islice(itertools.product(*choices), MAX_CHECKED_JOBS)]


def check_composes(config_name: str, argv: list[str]) -> None:
    """ConfigError, naming the key and what it accepts, if a job of this command line does not
    compose; before Hydra starts, which would report it over several lines with exit 1."""
    flags = {a for a in argv if a.startswith("-")}
    if flags - {"-m", "--multirun"} or GlobalHydra.instance().is_initialized():
        return  # Hydra's own options (--cfg, -cn, ...), or inside a Hydra app: Hydra reports
    overrides = [a for a in argv if not a.startswith("-")]
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        try:
            for job in _jobs(overrides):
                compose(config_name, job, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(_one_line(exc)) from None


def run(command: Command, words: tuple[str, ...] = ()) -> None:
    """Start `command` with the overrides in sys.argv after `words`: the intra-op threads set,
    the command line rewritten by the command's `resume` (into an earlier run's directory) and
    checked to compose, then Hydra."""
    register_configs()
    use_cpus()  # intra-op threads: the CPUs this process may use (foxhunt.threads)
    try:
        overrides = command.resume(sys.argv[1 + len(words) :])
        if not _full_error():
            check_composes(command.config, overrides)
    except FoxhuntError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    sys.argv[1:] = overrides
    hydra_main = hydra.main(
        version_base="1.3", config_path=f"pkg://{CONFIG_MODULE}", config_name=command.config
    )
    hydra_main(task(command.fn, words))()
