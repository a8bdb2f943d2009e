"""The largest batch that fits, found at fit start by real trials seeded from the estimator.

Lightning's BatchSizeFinder tries training steps only, from a blind start, and forgets what it
found on resume. Here each trial is the training step itself (foxhunt.training.step: forward,
backward, clipping, optimizer step) plus a validation step at the validation batch size, run
under the budget (a CUDA memory fraction, or the CPU live-tensor budget); a trial fits when it
raised no OOM and its peak left the safety margin free. The estimator's answer is the first
trial; galloping and bisection between the largest size that fit and the smallest that did not
find the rest. Weights, optimizer state and RNG are restored after the trials, and the sizes
are kept in checkpoints so a resumed run does not search again.

Under DDP every process runs the same trials and takes the same decisions: the budget is the
smallest of the processes' and a trial fits only if it fit on every process, so all end with
the same sizes (the largest that fit everywhere).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from foxhunt.errors import ConfigError
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.memory.budget import MB, device_total, free_memory, live_tensors, reset_peaks
from foxhunt.memory.callbacks import OutOfMemoryAtMinimum, batch_one_needs
from foxhunt.memory.estimator import fixed_val_batch_size, max_batch_size
from foxhunt.memory.gallop import largest_fitting
from foxhunt.training.step import train_step, validation_forward

log = logging.getLogger(__name__)


class BatchSizeSearch(L.Callback):
    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.batch_size: int | None = None
        self.val_batch_size: int | None = None
        self.trials: list[dict[str, Any]] = []
        self.strategy: Any = None  # the Trainer's, for the DDP processes' agreement

    def state_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "val_batch_size": self.val_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch_size = state["batch_size"]
        self.val_batch_size = state["val_batch_size"]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if self.batch_size is not None:
            log.info(
                "[MEMORY] batch size %d, validation %d (from the checkpoint, no search)",
                self.batch_size,
                self.val_batch_size,
            )
        else:
            self._search(trainer, pl_module, datamodule)
        if (datamodule.batch_size, datamodule.val_batch_size) == (
            self.batch_size,
            self.val_batch_size,
        ):
            return
        datamodule.batch_size = self.batch_size
        datamodule.val_batch_size = self.val_batch_size
        # configure_optimizers already sized the LR schedule from a train loader at the old
        # batch size (estimated_stepping_batches): drop the loaders, as Lightning's own
        # BatchSizeFinder does, and rebuild optimizer and schedule for the new step count
        # (before a resumed run restores their state)
        loop = trainer.fit_loop
        loop._combined_loader = None
        loop.epoch_loop.val_loop._combined_loader = None
        trainer.strategy.setup_optimizers(trainer)

    # --- the search ------------------------------------------------------------------------

    def _search(self, trainer: L.Trainer, module: L.LightningModule, datamodule: Any) -> None:
        mem = self.cfg.memory
        device = module.device
        self.strategy = trainer.strategy
        budget_mb = mem.budget_mb if mem.budget_mb is not None else device_total(device) / MB
        budget_mb = self._everywhere(budget_mb, "min")  # what each process has free differs
        self.limit = int((budget_mb - mem.safety_margin_mb) * MB)
        train_set, val_set = datamodule.datasets["train"], datamodule.datasets["val"]
        world = trainer.world_size  # DDP: no batch beyond one process's share of the windows
        cap = min(mem.batch_size_search.max_batch_size, _share(len(train_set), world))
        val_cap = min(mem.batch_size_search.max_batch_size, _share(len(val_set), world))
        self.max_trials = mem.batch_size_search.max_trials
        fixed_val = fixed_val_batch_size(mem)
        separate_val = mem.val_batch_size == "auto"

        saved = _Snapshot(module, trainer.optimizers)
        try:
            seed = self._seed(budget_mb, "both", device, cap)
            val_size: Callable[[int], int | None] = (
                (lambda b: None) if separate_val else (lambda b: fixed_val or b)
            )
            best = largest_fitting(
                lambda b: self._trial(module, trainer, train_set, val_set, b, val_size(b)),
                seed,
                cap,
            )
            if best == 0 or not self._fit_at(best):
                raise OutOfMemoryAtMinimum(
                    f"no batch size fits memory.budget_mb={budget_mb:.0f} less "
                    f"memory.safety_margin_mb={mem.safety_margin_mb:.0f}; "
                    + batch_one_needs(self.cfg)
                )
            val_best = fixed_val or best
            if separate_val:
                val_seed = self._seed(budget_mb, "val", device, val_cap)
                val_best = largest_fitting(
                    lambda b: self._trial(module, trainer, None, val_set, None, b),
                    val_seed,
                    val_cap,
                )
                val_best = max(val_best, 1)
        finally:
            saved.restore()
            free_memory(device)
        self.batch_size, self.val_batch_size = best, val_best
        log.info(
            "[MEMORY] batch size search: training %d, validation %d (%d trials, limit %.1f MB)",
            best,
            val_best,
            len(self.trials),
            self.limit / MB,
        )

    def _everywhere(self, value: float, op: str) -> float:
        """`value` reduced over the DDP processes (min or max); itself in one process."""
        x = torch.tensor(float(value), dtype=torch.float64, device=self.strategy.root_device)
        return float(self.strategy.reduce(x, reduce_op=op))

    def _fit_at(self, b: int) -> bool:
        return any(t["batch_size"] == b and t["fits"] for t in self.trials)

    def _seed(self, budget_mb: float, step: str, device: torch.device, cap: int) -> int:
        """The estimator's largest fitting batch size, the trials' first guess; no trace
        beyond the trials' cap (each is seconds on a CPU)."""
        try:
            best, _ = max_batch_size(
                self.cfg, budget_mb, step=step, device=device.type, limit=max(cap, 1)
            )
            return max(best, 1)
        except ConfigError:  # the estimate says nothing fits: let the trials say it for real
            return 1

    def _trial(
        self,
        module: L.LightningModule,
        trainer: L.Trainer,
        train_set: Any,
        val_set: Any,
        batch_size: int | None,
        val_batch_size: int | None,
    ) -> bool:
        """One training step at batch_size (if any) and one validation step at val_batch_size
        (if any), under the budget; True when neither ran out of memory and the peak kept the
        margin free."""
        if len(self.trials) >= self.max_trials:
            return False  # out of trials: only what already fit counts
        device = module.device
        free_memory(device)
        reset_peaks(device)
        error = None
        try:
            if batch_size is not None:
                optimizer, clip = trainer.optimizers[0], self.cfg.trainer.gradient_clip_val
                _train_trial(module, optimizer, _batch(train_set, batch_size, device), clip)
            if val_batch_size is not None:
                _val_trial(module, _batch(val_set, val_batch_size, device))
        except torch.OutOfMemoryError as exc:
            error = " ".join(str(exc).split())[:200]
        # outside the except: the failed step's tensors are released with its traceback
        free_memory(device)
        peak = _peak(device)
        fits = bool(self._everywhere(error is None and peak <= self.limit, "min"))
        self.trials.append(
            {
                "batch_size": batch_size if batch_size is not None else val_batch_size,
                "kind": "train+val" if batch_size is not None else "val",
                "val_batch_size": val_batch_size,
                "fits": fits,
                "peak_mb": round(peak / MB, 1),
                "error": error,
            }
        )
        log.info(
            "[MEMORY] trial batch %s (validation %s): %s, peak %.1f MB",
            batch_size,
            val_batch_size,
            "fits" if fits else "does not fit",
            peak / MB,
        )
        return fits


class _Snapshot:
    """Weights, optimizer state and RNG before the trials, to put back after them."""

    def __init__(self, module: L.LightningModule, optimizers: list[Any]) -> None:
        self.module, self.optimizers = module, optimizers
        self.weights = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        self.optimizer_states = [copy.deepcopy(o.state_dict()) for o in optimizers]
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.training = module.training

    def restore(self) -> None:
        self.module.load_state_dict(self.weights)
        for optimizer, state in zip(self.optimizers, self.optimizer_states, strict=True):
            optimizer.state.clear()
            optimizer.load_state_dict(state)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        self.module.train(self.training)


def _share(n: int, world_size: int) -> int:
    """The windows one of `world_size` processes gets of n (at least 1)."""
    return max(-(-n // world_size), 1)


def _batch(dataset: Any, size: int, device: torch.device) -> dict[str, torch.Tensor]:
    indices = [i % len(dataset) for i in range(size)]
    return {k: v.to(device) for k, v in dataset.__getitems__(indices).items()}


def _train_trial(
    module: Any, optimizer: Any, batch: dict[str, torch.Tensor], clip: float | None
) -> None:
    """The training step as training runs it; then its gradients go, as Lightning releases them
    before a validation (on_validation_model_zero_grad)."""
    module.train()
    train_step(module.model, optimizer, batch, module.quantiles, clip=clip)
    optimizer.zero_grad(set_to_none=True)


def _val_trial(module: Any, batch: dict[str, torch.Tensor]) -> None:
    """The validation forward and its loss."""
    module.eval()
    quantile_loss(validation_forward(module.model, batch), batch["target"], module.quantiles)


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    counter = live_tensors()
    return 0 if counter is None else counter.peak
