"""The callback the seed section adds to its training run (scripts/train.py, another process:
Hydra instantiates it from +callbacks.gpu_check_probe._target_)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.gpu_check.common import cuda_usage
from foxhunt.files import write_json
from foxhunt.memory import MB
from foxhunt.memory.budget import live_tensors
from foxhunt.memory.search import BatchSizeSearch


class SeedProbe(L.Callback):
    """What the seed scenario's training run did, written to `path` as it goes (the seed section
    adds it with +callbacks.gpu_check_probe._target_=benchmarks.gpu_check.probe.SeedProbe): the
    searched batch sizes as soon as the search is over, each phase's peaks (the allocator's on
    CUDA, the live tensors' on CPU) and batches, the wall-clock time (time.time()) of each
    phase's start and end in `events`, and at each teardown this process's CUDA context."""

    def __init__(self, path: str, others_mb: float | None = None) -> None:
        self.path = Path(path)
        self.others_mb = others_mb
        self.data: dict[str, Any] = {"phases": {}, "events": {}}
        self._epoch_started = 0.0
        self._event("callbacks_built")  # before the data is read and the model built

    def _write(self) -> None:
        write_json(self.path, self.data)

    def _event(self, name: str) -> None:
        self.data["events"][name] = time.time()
        self._write()

    def _peak(self, phase: str, device: torch.device) -> None:
        p = self.data["phases"].setdefault(
            phase, {"batches": 0, "peak_allocated_mb": 0.0, "peak_reserved_mb": None}
        )
        p["batches"] += 1
        if device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(device) / MB
            reserved = torch.cuda.max_memory_reserved(device) / MB
            p["peak_reserved_mb"] = round(max(p["peak_reserved_mb"] or 0.0, reserved), 1)
        else:
            counter = live_tensors()
            allocated = counter.peak / MB if counter is not None else 0.0
        p["peak_allocated_mb"] = round(max(p["peak_allocated_mb"], allocated), 1)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after BatchSizeSearch's on_fit_start: the memory callbacks come before configured ones
        search = next((c for c in trainer.callbacks if isinstance(c, BatchSizeSearch)), None)
        if search is not None:
            self.data["search"] = {
                "batch_size": search.batch_size,
                "val_batch_size": search.val_batch_size,
                "trials": search.trials,
            }
        self._event("search_done")

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("sanity_end")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_started = time.perf_counter()
        self._event("train_epoch_start")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        self._peak("train", pl_module.device)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._event("validation_start")

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any
    ) -> None:
        self._peak("sanity" if trainer.sanity_checking else "val", pl_module.device)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.data["epoch_s"] = round(time.perf_counter() - self._epoch_started, 1)
        self.data["global_step"] = trainer.global_step
        self._event("train_epoch_end")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("fit_end")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("test_start")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        self._peak("test", pl_module.device)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("test_end")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        stage = getattr(stage, "value", stage)  # Lightning passes TrainerFn: "fit", "test"
        if pl_module.device.type == "cuda":
            self.data[f"usage_end_{stage}"] = cuda_usage(pl_module.device, self.others_mb)
        self._event(f"teardown_{stage}")
