"""Checkpoints to resume from: after an interrupt, and the best ones across a resume.

Ctrl-C, SIGTERM and SIGUSR2 end training at a batch boundary, with a checkpoint to resume from.
SIGUSR2 is what SLURM sends before a job's time limit (`sbatch --signal=USR2@<s>`, which
submitit asks for) and what `scancel --signal=USR2` preempts with: once the checkpoint is written
it goes on to the handler that was there before (`foxhunt.app.cli`), submitit's, which requeues
the job.

Lightning's own KeyboardInterrupt handling stops wherever the interrupt lands (between a
backward and its optimizer step, say) and writes nothing; its OnExceptionCheckpoint would save
that half-done step. Here the signal only raises a flag; the training batch in flight finishes,
`checkpoints/last.ckpt` is replaced atomically with the state after it, and fit() ends with
`Interrupted`. Resuming from that checkpoint continues the same epoch at the next batch (the
data module records how far the epoch got). A signal during validation takes effect at the
next training batch, or, after the last epoch, when training ends: resumed, such a run trains no
more and goes on to its test. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from foxhunt.run.dir import LAST_CKPT

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Training stopped on a signal after writing `checkpoint`."""

    def __init__(self, signum: int | None, checkpoint: Path, epoch: int, batch: int | None) -> None:
        # signum None: this DDP process stopped with another that received the signal;
        # batch None: the signal came after the last training batch
        self.signum, self.checkpoint = signum or signal.SIGINT, checkpoint
        name = signal.Signals(signum).name if signum else "a signal to another DDP process"
        after = "its last batch" if batch is None else f"batch {batch}"
        self.what = f"{name} during epoch {epoch} after {after}; wrote {checkpoint}"
        # how to continue: a command that runs this training some other way says its own
        self.resume = "resume with the same command and resume=auto, or ckpt_path=<that file>"
        super().__init__(self.what)

    def __str__(self) -> str:
        return f"{self.what} ({self.resume})"


class GracefulInterrupt(L.Callback):
    # SIGUSR2 where the platform has one (not Windows)
    NAMES = ("SIGINT", "SIGTERM", "SIGUSR2")
    SIGNALS = tuple(getattr(signal, n) for n in NAMES if hasattr(signal, n))

    def __init__(self, dirpath: Path) -> None:
        self.dirpath = Path(dirpath)
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signum = None
        # set here, after Lightning recorded the handlers it restores at teardown; this replaces
        # Lightning's SIGTERM flag, which would stop mid-validation without a checkpoint
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now
        self.signum = signum
        log.warning(
            "%s: finishing this training batch, then writing a checkpoint",
            signal.Signals(signum).name,
        )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if not self._requested(trainer):
            return
        path = self.dirpath / LAST_CKPT  # replaced atomically (SafeCheckpointIO)
        trainer.save_checkpoint(path)
        raise Interrupted(self.signum, path, trainer.current_epoch, idx)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a signal after the last training batch: the last epoch's last.ckpt is written, and a
        # resume from it trains no more (StaysStopped, or the epoch ceiling reached)
        if self._requested(trainer):
            epoch = trainer.current_epoch - 1  # Lightning counted the last epoch as done
            raise Interrupted(self.signum, self.dirpath / LAST_CKPT, epoch, None)

    def _requested(self, trainer: L.Trainer) -> bool:
        """Whether any DDP process received a signal: every rank stops at the same point."""
        requested = self.signum is not None
        if trainer.world_size > 1:
            requested = trainer.strategy.reduce_boolean_decision(requested, all=False)
        return requested

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exc: Any) -> None:
        self._restore()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()


class BestCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that, resumed into a new run directory, still knows the earlier run's
    best checkpoints. Lightning then reloads only `best_model_path`, so the first epoch after a
    resume would count as the best so far and the run's best val_loss would depend on where it
    was resumed. The earlier files are read, never deleted: Lightning removes only files inside
    this callback's own directory."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        moved = state_dict.get("dirpath", self.dirpath) != self.dirpath
        with warnings.catch_warnings():
            if moved:  # its "won't be reloaded" is what this class undoes
                warnings.filterwarnings("ignore", message="The dirpath has changed")
            super().load_state_dict(state_dict)
        if not moved:
            return
        kept = {p: s for p, s in state_dict.get("best_k_models", {}).items() if Path(p).is_file()}
        if state_dict.get("best_model_path") not in kept:
            self.best_model_path = ""  # gone: the best is found again from here on
            return
        self.best_k_models = kept
        self.best_model_score = state_dict["best_model_score"]
        self.kth_best_model_path = state_dict["kth_best_model_path"]
        self.kth_value = state_dict["kth_value"]


class LatestCheckpoint(ModelCheckpoint):
    """`last.ckpt`, the latest state, written every epoch. Lightning 2.6's own `save_last`
    writes it only in a step that also saves a top-k checkpoint: with save_top_k=1 that is the
    best state, not the latest, and a resume would go back to it."""

    def __init__(self, dirpath: Path) -> None:
        super().__init__(dirpath=dirpath, filename="last", enable_version_counter=False)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with warnings.catch_warnings():  # "won't be reloaded": nothing here needs to be
            warnings.filterwarnings("ignore", message="The dirpath has changed")
            super().load_state_dict(state_dict)


class StaysStopped(EarlyStopping):
    """Lightning's EarlyStopping that, resumed from a checkpoint written after it stopped the
    training, stops it again before the first batch. Lightning's own trains on to the next
    validation: a SLURM job requeued during its test would train again, and differ from the
    same run unpreempted."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            trainer.should_stop = True


def early_stopping(monitor: str, patience: int | None) -> EarlyStopping | None:
    """EarlyStopping (minimising `monitor`), or none while `patience` is None: what
    `callbacks.early_stopping_patience` switches on (conf/callbacks/default.yaml)."""
    return None if patience is None else StaysStopped(monitor, patience=patience, mode="min")


class TrainingOutcome(L.Callback):
    """Every epoch's validation score (kept in the checkpoint, so across resumes) and how the
    training ended: stopped early, or at the epoch ceiling, and then whether it still improved
    (its last epoch the best): summary.json's `training`."""

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.scores: list[list[float]] = []  # [epoch, score]; lists load weights-only
        self.ceiling: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # before optim.schedule_steps sets the epochs the schedule ends at (TFTModule)
        self.ceiling = trainer.max_epochs

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        score = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or score is None:
            return
        epoch = trainer.current_epoch
        self.scores = [s for s in self.scores if s[0] != epoch] + [[epoch, float(score)]]

    def state_dict(self) -> dict[str, Any]:
        return {"scores": self.scores}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scores = [list(s) for s in state_dict.get("scores", [])]

    def outcome(self, trainer: L.Trainer) -> dict[str, Any]:
        """How the fit ended: `stopped` (early_stopping, schedule: its end, max_epochs: the
        ceiling, or other), the best epoch,
        whether it was still improving at the ceiling, and the scores by epoch."""
        early = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
        if early is not None and early.stopped_epoch > 0:
            stopped = "early_stopping"
        elif self.ceiling is not None and trainer.current_epoch >= self.ceiling:
            stopped = "max_epochs"
        elif trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs:
            stopped = "schedule"  # its end (optim.schedule_steps)
        else:
            stopped = "other"  # max_steps, max_time, an interrupt
        best = min(self.scores, key=lambda s: s[1]) if self.scores else None
        improving = stopped == "max_epochs" and best is not None and best is self.scores[-1]
        if improving:
            log.warning(
                "training stopped at trainer.max_epochs=%d with %s still improving (its best "
                "is the last epoch's): a higher ceiling may train a better model",
                trainer.max_epochs,
                self.monitor,
            )
        return {
            "stopped": stopped,
            "best_epoch": None if best is None else int(best[0]),
            "still_improving": improving,
            "patience": None if early is None else early.patience,
            self.monitor: [s[1] for s in self.scores],
        }
