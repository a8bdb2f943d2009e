"""`foxhunt train` as torchrun's worker script, with probes, for the multi-node tests.

Each rank runs `ddp_probe.Probe` (the windows of each batch, the synced metrics, the checkpoint
it resumed from, its batch sizes) and `NodeProbe`, which writes to `<cwd>/node_rank<N>.json`
the files this process wrote (an audit hook sees every open for writing and every rename:
foxhunt's atomic writes end in os.replace), its intra-op threads in a training step, and the
batch-size search's trials. `<cwd>/pid_rank<N>` holds its pid (to kill one rank).
FOXHUNT_PROBE_LATE_RANK=<rank>: that rank starts 2 s after the others, so that its Hydra's
time stamp differs from rank 0's.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from foxhunt.memory.search import BatchSizeSearch
from tests.training.ddp_probe import Probe

RANK = int(os.environ.get("RANK", "0"))
CWD = Path.cwd()
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
written: set[str] = set()
seen: dict[str, Any] = {}


def _record(event: str, args: tuple) -> None:
    """Audit hook: the paths opened for writing or renamed onto."""
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int | bytes) or path is None:
            return
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else flags & WRITE_FLAGS
        if writes:
            written.add(str(Path(path).resolve()))
    elif event == "os.rename":
        written.add(str(Path(args[1]).resolve()))


def _save() -> None:
    out = {"written": sorted(written), **seen}
    (CWD / f"node_rank{RANK}.json").write_text(json.dumps(out))


class NodeProbe(L.Callback):
    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        seen["threads"] = torch.get_num_threads()
        seen["world_size"] = trainer.world_size

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        search = next((c for c in trainer.callbacks if isinstance(c, BatchSizeSearch)), None)
        if search is not None:
            seen["search"] = {
                "batch_size": search.batch_size,
                "val_batch_size": search.val_batch_size,
                "trials": search.trials,
            }


def _train_with_probes(train: Any) -> Any:
    def wrapped(cfg: Any, run_dir: Path, extra_callbacks=(), overrides=()) -> dict[str, Any]:
        return train(cfg, run_dir, [*extra_callbacks, Probe(), NodeProbe()], overrides)

    return wrapped


if __name__ == "__main__":
    (CWD / f"pid_rank{RANK}").write_text(str(os.getpid()))
    if os.environ.get("FOXHUNT_PROBE_LATE_RANK") == str(RANK):
        time.sleep(2)
    sys.addaudithook(_record)
    atexit.register(_save)
    import foxhunt.app.train.phases as run

    run.train = _train_with_probes(run.train)  # before commands imports it
    from foxhunt.app.commands import main

    main("train")
