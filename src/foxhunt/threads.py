"""CPU threads for foxhunt's processes: fast on a busy machine as on a quiet one.

On a CPU shared with other work (a sweep's other jobs, a notebook beside a training, a CI runner)
a training ran 25-50x slower than alone (benchmarks/bench_contention.py, 2 cores, one other
training): PyTorch's OpenMP threads spin at every barrier while another process holds the core
they wait for, and a TFT step runs thousands of small parallel ops, each ending in a barrier.
Threads that sleep instead (OMP_WAIT_POLICY=PASSIVE) fixed that but made a quiet training 28%
slower (each barrier then wakes a sleeping thread), and one thread 22% slower. So foxhunt keeps
OpenMP's defaults and sizes the intra-op threads to the CPUs the other processes leave it:

- `usable_cpus`: the CPUs this process may run on (its affinity mask, capped by a cgroup CPU
  quota such as `docker --cpus`), where torch counts every CPU of the host;
- `rank_cpus`: one process's share of its node when several share it: the usable CPUs over the
  node's processes (torchrun's LOCAL_WORLD_SIZE; the Trainer's processes per node once it
  runs), or SLURM's CPUs per task (SLURM_CPUS_PER_TASK; else SLURM_CPUS_ON_NODE over
  SLURM_NTASKS_PER_NODE) where SLURM set them. Ranks on other nodes do not count: each node
  has its own CPUs;
- `CpuShare`: between batches, at most every `interval_s`, how busy the other processes kept
  those CPUs since the last look (/proc/stat's busy time less this process's own CPU time);
  the threads are the CPUs left, at least one. Quiet, that is all of them; beside another
  training, one: a single thread meets no barrier. Two foxhunt trainings so settle on one
  thread each, and both go back to all when alone again. (Lightning's and torch's tuners do not
  do this: they size threads once, from the core count.)

`FOXHUNT_THREADS=off`, or OMP_NUM_THREADS set by the user (as joblib's workers have it: their
share; torchrun sets 1 with --nproc-per-node above 1), leaves the threads as they are; a run
with `trainer.deterministic=true` keeps the count it started with (`rank_cpus()`), so that its
result does not depend on the machine's load; so does a DDP process (`rank_cpus` of the
Trainer's processes per node, where Lightning's launcher would count the affinity alone).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

import lightning as L
import torch

log = logging.getLogger(__name__)
clock = time.monotonic  # seconds (a test replaces it)


def off() -> bool:
    """FOXHUNT_THREADS=off, or threads the user (or the launcher) set."""
    setting = os.environ.get("FOXHUNT_THREADS", "").lower() in ("off", "0", "false")
    return setting or "OMP_NUM_THREADS" in os.environ


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (v2 `cpu.max`, v1 `cfs_quota_us`), or
    None where there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _affinity() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup quota."""
    cpus = len(_affinity())
    quota = cgroup_cpus()
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def rank_cpus(local_processes: int | None = None, env: Mapping[str, str] = os.environ) -> int:
    """This process's share of its node's usable CPUs: SLURM's CPUs per task where set, else
    the node's CPUs (`usable_cpus()`, capped by SLURM_CPUS_ON_NODE) over the processes on
    this node: `local_processes`, else the launcher's count (torchrun's LOCAL_WORLD_SIZE,
    SLURM_NTASKS_PER_NODE), else 1. At least 1."""
    cpus = usable_cpus()
    if env.get("SLURM_CPUS_PER_TASK"):
        return max(1, min(cpus, int(env["SLURM_CPUS_PER_TASK"])))
    if env.get("SLURM_CPUS_ON_NODE"):
        cpus = min(cpus, int(env["SLURM_CPUS_ON_NODE"]))
    if local_processes is None:
        launcher = env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE") or "1"
        local_processes = int(launcher)
    return max(1, cpus // max(1, local_processes))


def busy_seconds(cpus: set[int], stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds `cpus` spent busy since boot, all processes together (None without
    /proc/stat): user, nice, system, irq, softirq and steal time."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds this process has used, all its threads."""
    t = os.times()
    return t.user + t.system


class CpuShare:
    """Intra-op threads = the usable CPUs the other processes left free since the last look
    (see the module); `update()` between batches."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.cpus = rank_cpus()
        self.affinity = _affinity()
        self.interval_s = interval_s
        self.threads = torch.get_num_threads()
        self._last = self._sample()
        self.changes = 0  # how often the thread count changed

    def _sample(self, wall: float | None = None) -> tuple[float, float | None, float]:
        wall = clock() if wall is None else wall
        return wall, busy_seconds(self.affinity), own_seconds()

    def others(self, before: tuple, now: tuple) -> float | None:
        """CPUs the other processes kept busy between two samples."""
        wall = now[0] - before[0]
        if now[1] is None or before[1] is None or wall <= 0:
            return None
        return max(0.0, (now[1] - before[1]) - (now[2] - before[2])) / wall

    def update(self) -> int:
        """The thread count now, changed if the others' load changed (at most every
        `interval_s`)."""
        wall = clock()
        if wall - self._last[0] < self.interval_s:  # the clock alone: no read of /proc/stat
            return self.threads
        now = self._sample(wall)
        others = self.others(self._last, now)
        self._last = now
        if others is None:
            return self.threads
        threads = min(self.cpus, max(1, round(self.cpus - others)))
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.threads = threads
            self.changes += 1
        return self.threads


def use_cpus() -> int | None:
    """Intra-op threads = `rank_cpus()` unless `off()`; the count set."""
    if off():
        return None
    threads = rank_cpus()
    torch.set_num_threads(threads)
    return threads


class ShareCpus(L.Callback):
    """The threads of a run, set when it starts: a DDP process's share of its node (the
    Trainer's processes per node, `rank_cpus`), fixed; one process on the CPU follows
    `CpuShare.update()` before every training, validation and test batch. `fixed` (a run with
    trainer.deterministic=true): the thread count stays as it started, since a reduction
    split over another number of threads sums in another order, and the result would depend
    on how busy the machine was. The count is logged (`threads: ...`) on every rank."""

    def __init__(self, fixed: bool = False) -> None:
        self.fixed = fixed
        # read before fit: Lightning's DDP launcher sets OMP_NUM_THREADS itself in fit()
        self.ours = not off()
        self.share: CpuShare | None = None
        self.found: int | None = None  # the thread count at setup

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.ours or self.found is not None:
            return
        self.found = torch.get_num_threads()
        processes = getattr(trainer.strategy, "num_processes", 1)  # on this node
        if trainer.world_size > 1:
            torch.set_num_threads(rank_cpus(processes))
        elif trainer.strategy.root_device.type == "cpu" and not self.fixed and self.share is None:
            self.share = CpuShare()
        if stage == "fit":
            log.info(
                "threads: %d on rank %d of %d (%d usable CPUs on this node, %d processes here)",
                torch.get_num_threads(),
                trainer.global_rank,
                trainer.world_size,
                usable_cpus(),
                processes,
            )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.found is not None:  # the process's count as the run found it (the next run
            torch.set_num_threads(self.found)  # in this process, a study's, starts from it)
            self.found = None

    def _update(self, *args: object) -> None:
        if self.share is not None:
            self.share.update()

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = _update
