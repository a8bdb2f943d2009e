"""The processes of one run that a launcher outside foxhunt starts (torchrun, on one node or
several): which rank this process is, and what rank 0 decides for all of them.

Lightning's own DDP start re-runs the command line with rank 0's run directory and checkpoint
(`foxhunt.app.train.ddp`). A launcher instead starts every rank from the same command line,
each with
a Hydra of its own, and Hydra's time-stamped run directory differs by rank when the ranks start
in different seconds (hydra#2070) or on machines whose clocks differ. So rank 0 decides and the
others follow, over the launcher's key-value store:
- the run directory: rank 0's guard (`foxhunt.run.guard`) claims and locks it as for a single
  process, then hands it over; every other rank waits for it before Hydra writes anything and
  runs there with no `.hydra/` of its own and its own log, `train_ddp_process_<rank>.log`;
- what the run resumes from (`resume=auto`): rank 0 resolves it, the others take its answer.

The launchers known here: torchrun (its workers have TORCHELASTIC_RUN_ID; the store is its
elastic agent's, at MASTER_ADDR:MASTER_PORT) and SLURM's srun with several tasks (SLURM_PROCID of
SLURM_STEP_NUM_TASKS; srun has no store, so rank 0 hosts one on the port after the one
Lightning's process group takes, on the job's first node).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from foxhunt.errors import FoxhuntError

WAIT_S = 600  # how long a rank waits for rank 0's decision (rank 0 reads no data before it)
OTHER_LOG = "train_ddp_process_{rank}"  # Lightning's name for the other processes' logs


@dataclass(frozen=True)
class Launched:
    """This process's place among the ranks a launcher started."""

    rank: int
    world_size: int
    attempt: str  # the launcher's restart count: a restarted group decides afresh


def launched(env: Mapping[str, str] = os.environ) -> Launched | None:
    """This process's rank among several that a launcher started, or None (one process, or
    Lightning's own DDP start)."""
    if "TORCHELASTIC_RUN_ID" in env and int(env.get("WORLD_SIZE", "1")) > 1:
        attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        return Launched(int(env["RANK"]), int(env["WORLD_SIZE"]), attempt)
    if int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:  # srun's tasks (a requeue: an attempt)
        attempt = env.get("SLURM_RESTART_COUNT", "0")
        return Launched(int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"]), attempt)
    return None


_srun: list[Any] = []  # srun's store, opened once: rank 0's serves while its process lives


def _store(timeout_s: float) -> Any:
    """The launcher's key-value store, as a client (under srun, rank 0 hosts it)."""
    import torch.distributed as dist  # the ranks' collectives come later, from Lightning

    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return _srun_store(timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise FoxhuntError(
            "this torchrun gives its workers no store of its agent (TORCHELASTIC_USE_AGENT_STORE)"
            ", which foxhunt's ranks agree on their run directory through; use a newer torch"
        )
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=timeout_s)
    return dist.TCPStore(address, port, is_master=False, timeout=timeout)


def _srun_store(timeout_s: float) -> Any:
    """srun's ranks' store: rank 0's, on the job's first node, one port after Lightning's."""
    import torch.distributed as dist
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if not _srun:
        slurm = SLURMEnvironment()
        _srun.append(
            dist.TCPStore(
                slurm.main_address,
                slurm.main_port + 1,
                is_master=int(os.environ["SLURM_PROCID"]) == 0,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        )
    return _srun[0]


def decided(what: str, decide: Callable[[], Any], wait_s: float = WAIT_S) -> Any:
    """`decide()` as rank 0 answers it, in every rank (JSON); one process answers it itself."""
    ranks = launched()
    if ranks is None:
        return decide()
    key = f"foxhunt/{ranks.attempt}/{what}"
    if ranks.rank == 0:
        answer = decide()
        _store(wait_s).set(key, json.dumps(answer))
        return answer
    try:
        return json.loads(_store(wait_s).get(key))
    except Exception as exc:  # noqa: BLE001 - the store's errors: a timeout, rank 0 gone
        raise FoxhuntError(
            f"rank {ranks.rank}: rank 0 did not hand over the run's {what} in {wait_s:g} s "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); see rank 0's error"
        ) from None


def follow_run_dir(config: Any, run_dir: Path | None) -> Path | None:
    """Under a launcher, the run directory every rank uses: rank 0's (`run_dir` there), put
    into another rank's Hydra `config` before Hydra writes anything (no .hydra/, its own
    log). Else `run_dir`."""
    from omegaconf import open_dict, read_write

    ranks = launched()
    if ranks is None:
        return run_dir
    path = Path(decided("run_dir", lambda: str(run_dir)))
    if ranks.rank == 0:
        return path
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.run.dir = str(path)
        config.hydra.output_subdir = None
        config.hydra.job.name = OTHER_LOG.format(rank=ranks.rank)
    return path


def other_rank() -> bool:
    """A rank after the first (of a launcher's, or of Lightning's own DDP start, which re-runs
    the command with rank 0's run directory)."""
    ranks = launched()
    if ranks is not None:
        return ranks.rank > 0
    return any(int(os.environ.get(k, "0") or 0) > 0 for k in ("LOCAL_RANK", "RANK", "NODE_RANK"))
