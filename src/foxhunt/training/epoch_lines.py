"""A training's progress where stdout is not a terminal (a log file, a pipe, a CI job, a test's
capture): one line per epoch, not Lightning's bar, which writes every step into the file (1.5 MB
for one panel run). On a terminal Lightning draws its bar as usual; `trainer.enable_progress_bar
=false` shows neither."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar


class EpochLines(ProgressBar):
    """Lightning's progress bar as one line on stdout at the end of each training epoch:
    'epoch 3/30, step 2151: train loss 0.2154, val loss 0.2101, 41.3 s'."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._started = 0.0

    def disable(self) -> None:  # Lightning's: on every process but rank 0, and while tuning
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._enabled:
            print(epoch_line(trainer, time.perf_counter() - self._started), flush=True)


def epoch_line(trainer: L.Trainer, seconds: float) -> str:
    """The line of the epoch `trainer` has just ended (its losses where they were logged)."""
    epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
    line = f"epoch {trainer.current_epoch + 1}" + (f"/{epochs}" if epochs else "")
    line += f", step {trainer.global_step}:"
    metrics = trainer.callback_metrics
    for name, key in (("train loss", "train_loss_epoch"), ("val loss", "val_loss")):
        if key in metrics:
            line += f" {name} {float(metrics[key]):.4f},"
    return f"{line} {seconds:.1f} s"


def epoch_lines(trainer: Any, callbacks: Sequence[L.Callback]) -> list[L.Callback]:
    """[EpochLines()] where Lightning would draw its own bar (`trainer`: the trainer group's
    config, no progress bar among `callbacks`) and stdout is not a terminal; else []."""
    if trainer.get("enable_progress_bar") is False or sys.stdout.isatty():
        return []
    if any(isinstance(c, ProgressBar) for c in callbacks):
        return []
    return [EpochLines()]
