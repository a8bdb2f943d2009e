"""scripts/train.py with a probe callback in every process, for the DDP tests.

Lightning starts the other DDP processes by re-running this file, so each has the probe. The
probe writes what its process saw to `<run dir>/probe_rank<N>.json`: the train windows of each
batch, the metrics it logged, the checkpoint it resumed from, its batch sizes and the OOM
backoff's sizes and events.
FOXHUNT_PROBE_OOM_RANK=<rank> lowers that process's CPU budget (memory.budget_mb must be set)
at batch OOM_STEP of the first epoch so that its batch no longer fits but half of it does;
FOXHUNT_PROBE_RANK1_BUDGET_MB=<MB> gives rank 1 that budget from the start.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import lightning as L

from foxhunt.memory.budget import MB, live_tensors
from foxhunt.memory.callbacks import OOMBackoff

OOM_STEP = 3


class Probe(L.Callback):
    def __init__(self) -> None:
        self.batches: list[list[int]] = []  # the first epoch's, in order
        self.oom_rank = int(os.environ.get("FOXHUNT_PROBE_OOM_RANK", "-1"))
        self.step_growth = 0
        self.rank1_budget_mb = os.environ.get("FOXHUNT_PROBE_RANK1_BUDGET_MB")

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        if trainer.global_rank == 1 and self.rank1_budget_mb:
            live_tensors().budget = int(float(self.rank1_budget_mb) * MB)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, idx: int):
        counter = live_tensors()
        if counter is None:
            return
        if trainer.global_rank == self.oom_rank and (trainer.current_epoch, idx) == (0, OOM_STEP):
            counter.budget = counter.live + int(0.7 * self.step_growth)
        counter.reset_peak()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, out: Any, batch: Any, idx):
        counter = live_tensors()
        if counter is not None and trainer.current_epoch == 0 and idx < OOM_STEP:
            self.step_growth = max(self.step_growth, counter.peak - counter.live)
        if trainer.current_epoch == 0:
            self.batches.append(batch["index"].tolist())

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        backoff = next(cb for cb in trainer.callbacks if isinstance(cb, OOMBackoff))
        probe = {
            "batches": self.batches,
            "resumed_from": trainer.ckpt_path and str(trainer.ckpt_path),
            "micro": backoff.micro,
            "events": backoff.events,
            "global_step": trainer.global_step,
            "batch_size": trainer.datamodule.batch_size,
            "val_batch_size": trainer.datamodule.val_batch_size,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        }
        out = Path(trainer.default_root_dir) / f"probe_rank{trainer.global_rank}.json"
        out.write_text(json.dumps(probe))


def _train_with_probe(train: Any) -> Any:
    def wrapped(cfg: Any, run_dir: Path, extra_callbacks=(), overrides=()) -> dict[str, Any]:
        return train(cfg, run_dir, [*extra_callbacks, Probe()], overrides)

    return wrapped


if __name__ == "__main__":
    import foxhunt.app.train.phases as run

    run.train = _train_with_probe(run.train)  # before the script imports it
    script = Path(__file__).resolve().parents[2] / "scripts" / "train.py"
    # run as __main__ (its own `if __name__` block, Hydra's config path beside it) while
    # sys.argv[0] stays this file, which Lightning re-runs for the other processes
    spec = importlib.util.spec_from_file_location("__main__", script)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
