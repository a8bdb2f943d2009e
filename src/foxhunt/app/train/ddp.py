"""DDP for a run: its strategy, and the checks and hand-overs before Lightning starts the other
processes by re-running this command.

Lightning has no public way to ask whether fit() will re-run the command line: the launcher
that does it, `_SubprocessScriptLauncher` (DDP's default `start_method="popen"`, and FSDP's),
is private, and its one public property (`is_interactive_compatible`) is also False for the
spawn launcher, which re-runs nothing. The command line it re-runs is what a Hydra multirun
would repeat whole and what a resume must pin, so this module asks the private class, and is
the one place that does."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from foxhunt.errors import ConfigError
from foxhunt.run.resume import pinned_resume


def ddp_strategy(name: str) -> str | Strategy:
    """The trainer's strategy: `name`, or for ddp a DDPStrategy without its buffer broadcast."""
    if name != "ddp":
        return name
    # the buffers here are constants (the quantiles), and the broadcast would be a collective
    # in validation steps, whose number differs by process (torch 2.13 renamed the switch)
    ddp_args = inspect.signature(DistributedDataParallel).parameters
    key = "forward_sync_buffers" if "forward_sync_buffers" in ddp_args else "broadcast_buffers"
    return DDPStrategy(**{key: False})


def reruns_the_command(trainer: L.Trainer) -> bool:
    """Whether fit() starts the other processes by re-running this command (not torchrun's or
    SLURM's processes, which start themselves; not spawn's, which re-run no command line)."""
    strategy = trainer.strategy
    if not isinstance(strategy.launcher, _SubprocessScriptLauncher):
        return False
    return not strategy.cluster_environment.creates_processes_externally


def srun_tasks_match(trainer: L.Trainer) -> None:
    """Under SLURM, one task per device on each node, or one line before fit() (Lightning's
    own check raises inside it; a mismatch once hung: Lightning #19883)."""
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]  # "2", or "2(x3)"
    slurm = isinstance(getattr(trainer.strategy, "cluster_environment", None), SLURMEnvironment)
    if slurm and tasks and int(tasks) != trainer.num_devices:
        raise ConfigError(
            f"trainer.devices={trainer.num_devices}, but this SLURM job runs {tasks} task(s) "
            f"per node (--ntasks-per-node={tasks}): srun starts one process per device; give "
            "the job --ntasks-per-node equal to trainer.devices"
        )


def before_other_processes(cfg: DictConfig, trainer: L.Trainer, ckpt_path: Path | None) -> None:
    """Checks and hand-overs for DDP, whose other processes Lightning starts inside fit() by
    re-running this command (with the same Hydra run directory, no .hydra of their own)."""
    if cfg.memory.oom_backoff.enabled and not cfg.memory.oom_backoff.keep_effective_batch:
        raise ConfigError(
            "memory.oom_backoff.keep_effective_batch=false turns an OOM into extra optimizer "
            "steps, which the other DDP processes would not take; keep it true with DDP"
        )
    if not reruns_the_command(trainer):
        return
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ConfigError(
            f"trainer.strategy={cfg.trainer.strategy} cannot run inside a Hydra multirun (-m): "
            "Lightning starts the other processes by re-running the command, which would "
            "re-run the whole sweep; run each combination as its own command"
        )
    if cfg.resume is not None:
        sys.argv[1:] = pinned_resume(sys.argv[1:], ckpt_path)
