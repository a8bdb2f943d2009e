"""The one place that decides what a run continues from: a training run (`ckpt_path`,
`resume=auto`), a sweep (`+sweep.resume=true`), a backtest (`resume=auto`) and their jobs and
folds. An experiment is its command-line overrides but the resume ones."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from foxhunt.errors import CheckpointError, ConfigError, FoxhuntError
from foxhunt.run import ranks
from foxhunt.run.dir import RunDir

log = logging.getLogger(__name__)
# the overrides that are not part of what an experiment is (resume=auto matches on the rest)
RESUME_KEYS = ("resume", "ckpt_path", "trainer.max_epochs", "sweep.resume")
MULTIRUN = {"-m", "--multirun"}


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def experiment_key(overrides: Sequence[str]) -> set[str]:
    """What identifies an experiment: its command-line overrides but the resume ones."""
    return {o for o in overrides if _key(o) not in RESUME_KEYS}


def same_experiment(run: RunDir, overrides: Sequence[str]) -> bool:
    """Whether `run`'s saved overrides are the experiment `overrides` name."""
    saved = run.overrides
    return saved.is_file() and experiment_key(OmegaConf.load(saved)) == experiment_key(overrides)


def continues(config: DictConfig, run: RunDir) -> bool:
    """Whether a run composed as `config` continues the run whose results are in `run`
    (the run directory guard refuses a fresh run there)."""
    if config.get("ckpt_path"):
        own = run.checkpoints.resolve()
        return Path(config.ckpt_path).expanduser().resolve().parent == own
    return bool(config.get("resume")) and same_experiment(run, config.hydra.overrides.task)


def find_previous_run(run_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The `last.ckpt` of an earlier run of the same experiment: this run's own when it is
    run again (a requeued cluster job: never another's, which may be newer), else the newest
    of the run directories beside this one (outputs/<date>/<time>/) that no live run holds
    (a sweep's job beside it, still training)."""
    own = RunDir(run_dir)
    if own.last_ckpt.is_file() and same_experiment(own, overrides):
        return own.last_ckpt
    found = [
        r.last_ckpt
        for r in own.siblings()
        if r.path.resolve() != own.path.resolve()
        and r.last_ckpt.is_file()
        and same_experiment(r, overrides)
        and not r.in_use()
    ]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def resume_source(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The checkpoint a training run continues from: `ckpt_path`, the newest earlier run of
    the same experiment (`resume=auto`), or, for a job of a resumed sweep
    (`+sweep.resume=true`), its own `last.ckpt` when an earlier attempt was interrupted."""
    run = RunDir(run_dir)
    if cfg.resume is None:
        if cfg.ckpt_path:
            return Path(cfg.ckpt_path)
        if cfg.get("sweep", {}).get("resume") and run.last_ckpt.is_file():
            log.info("sweep.resume: this job was interrupted; resuming it from %s", run.last_ckpt)
            return run.last_ckpt
        return None
    if cfg.ckpt_path:
        raise ConfigError("give either ckpt_path or resume, not both")
    # the ranks of a launcher (torchrun) take rank 0's answer: a newer run may appear meanwhile
    found = ranks.decided("resume", lambda: _previous_run(cfg.resume, run, overrides))
    return None if found is None else Path(found)


def _previous_run(resume: str, run: RunDir, overrides: Sequence[str]) -> str | None:
    """`resume=auto`'s answer (`find_previous_run`), said in the log; an error when there is
    none, unless resume=auto_or_new."""
    found = find_previous_run(run.path, overrides)
    if found is not None:
        log.info("resume=%s: resuming from %s", resume, found)
    elif resume == "auto_or_new":
        log.info("resume=auto_or_new: no earlier run of this experiment, starting fresh")
    else:
        raise CheckpointError(
            f"resume=auto found no earlier run of this experiment (same overrides) with "
            f"checkpoints/last.ckpt under {run.path.resolve().parents[1]}; "
            "use resume=auto_or_new to start fresh"
        )
    return None if found is None else str(found)


def pinned_resume(argv: list[str], ckpt_path: Path | None) -> list[str]:
    """A `resume=auto` command line as DDP's other processes re-run it: continuing from the
    checkpoint this process resolved (the newest run may change meanwhile). ckpt_path and
    resume do not identify the experiment, so the re-run is the same experiment."""
    resumed = f'"{ckpt_path}"' if ckpt_path else "null"
    return [*(a for a in argv if _key(a) != "resume"), f"ckpt_path={resumed}"]


def finished(run: RunDir, why: str) -> dict[str, Any] | None:
    """The summary of a job or fold that finished in an earlier attempt (reported again, not
    re-run), or None."""
    if not run.summary.is_file():
        return None
    log.info("%s: %s finished earlier, not re-running it", why, run.path)
    return json.loads(run.summary.read_text())


def interrupted(run: RunDir) -> Path | None:
    """The `last.ckpt` an interrupted job or fold resumes from (foxhunt's exact resume)."""
    return run.last_ckpt.resolve() if run.last_ckpt.is_file() else None


def _task_overrides(args: list[str]) -> set[str]:
    """What identifies a sweep: its task overrides (hydra.* and the resume switch aside), as
    Hydra records them in the sweep's multirun.yaml."""
    return {
        a
        for a in args
        if "=" in a
        and not a.startswith("-")
        and not a.lstrip("+~").startswith("hydra")
        and _key(a) != "sweep.resume"
    }


def _given(argv: list[str], key: str) -> bool:
    return any(not a.startswith("-") and _key(a) == key for a in argv)


def resume_sweep(argv: list[str], root: Path = Path("multirun")) -> list[str]:
    """`-m ... +sweep.resume=true` without a hydra.sweep.dir: send the sweep into the newest
    earlier sweep directory of the same command under `root` (found by its multirun.yaml),
    where its finished jobs are skipped and its interrupted jobs resume from their last.ckpt."""
    resume = any(_key(a) == "sweep.resume" and a.endswith("=true") for a in argv)
    if not resume or not MULTIRUN & set(argv) or _given(argv, "hydra.sweep.dir"):
        return argv
    wanted = _task_overrides(argv)
    found = [
        p
        for p in root.glob("*/*/multirun.yaml")
        if _task_overrides(list(OmegaConf.load(p).hydra.overrides.task)) == wanted
    ]
    if not found:
        raise FoxhuntError(
            f"+sweep.resume=true found no earlier sweep of this command (same overrides) "
            f"under {root.resolve()}; give hydra.sweep.dir=<its directory> or drop the switch"
        )
    sweep_dir = max(found, key=lambda p: p.stat().st_mtime).parent
    print(f"sweep.resume: continuing the sweep in {sweep_dir}", file=sys.stderr)
    return [*argv, f"hydra.sweep.dir={sweep_dir}"]


def resume_backtest(argv: list[str], plan: str, root: Path = Path("outputs")) -> list[str]:
    """`resume=auto` (or auto_or_new) without a hydra.run.dir: send the backtest into the
    newest earlier backtest directory (the one holding its fold `plan`) of the same overrides
    under `root`, where its finished folds are kept and an interrupted one resumes. A multirun
    resumes as sweeps do."""
    if MULTIRUN & set(argv):
        return resume_sweep(argv)
    resume = next((a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] == "resume"), None)
    if resume not in ("auto", "auto_or_new") or _given(argv, "hydra.run.dir"):
        return argv
    task = [a for a in argv if "=" in a and not a.lstrip("+~").startswith("hydra")]
    found = [p.parent for p in root.glob(f"*/*/{plan}") if same_experiment(RunDir(p.parent), task)]
    if not found:
        if resume == "auto_or_new":
            return argv
        raise FoxhuntError(
            f"resume=auto found no earlier backtest with the same overrides under "
            f"{root.resolve()}; give hydra.run.dir=<its directory> or use resume=auto_or_new"
        )
    backtest_dir = max(found, key=lambda p: (p / plan).stat().st_mtime)
    print(f"resume: continuing the backtest in {backtest_dir}", file=sys.stderr)
    return [*argv, f"hydra.run.dir={backtest_dir}"]
