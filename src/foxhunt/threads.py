"""CPU threads for foxhunt's processes: fast on a busy machine as on a quiet one.

On a CPU shared with other work (a sweep's other jobs, a notebook beside a training, a CI runner)
a training ran up to 17x slower than alone: PyTorch's OpenMP threads spin at every barrier while
another process holds the core they wait for, and a TFT step runs thousands of small parallel
ops, each ending in a barrier. So, unless the user set them:

- `OMP_WAIT_POLICY=PASSIVE`: a waiting thread sleeps instead of spinning. OpenMP reads it once,
  when torch loads its runtime, so the entry points import this module before anything that
  imports torch (its own isort section in pyproject.toml keeps it first); importing it sets it.
- intra-op threads: the CPUs this process may run on (its affinity mask, capped by a cgroup
  CPU quota such as `docker --cpus`), where torch counts every CPU of the host (`use_cpus`).
  Lightning's DDP launcher and joblib's workers then give each process its share.

`FOXHUNT_THREADS=off` leaves both as they are; `OMP_WAIT_POLICY` or `OMP_NUM_THREADS` set by the
user win. benchmarks/bench_contention.py measures the effect.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

OFF = os.environ.get("FOXHUNT_THREADS", "").lower() in ("off", "0", "false")


def quiet_waits() -> bool:
    """OMP_WAIT_POLICY=PASSIVE unless set, off, or too late (torch already loaded); whether set."""
    if OFF or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


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


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cgroup_cpus()
    return max(1, min(cpus or 1, math.ceil(quota) if quota else cpus or 1))


def use_cpus() -> int | None:
    """Intra-op threads = `usable_cpus()` unless OMP_NUM_THREADS is set or off; the count set."""
    if OFF or "OMP_NUM_THREADS" in os.environ:
        return None
    import torch  # here: importing this module must not load torch

    threads = usable_cpus()
    torch.set_num_threads(threads)
    return threads


quiet_waits()
