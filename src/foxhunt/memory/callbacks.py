"""Lightning callbacks that keep a run inside its memory: OOM backoff, optimizer-state release
during validation, cache clearing and the memory log (the batch-size search is in search.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerFn

from foxhunt.errors import FoxhuntError
from foxhunt.memory.budget import MB, free_memory, reset_peaks, snapshot
from foxhunt.memory.estimator import estimate

log = logging.getLogger(__name__)


def _fitting(trainer: L.Trainer) -> bool:
    """Validation inside fit (not the sanity check, not a separate validate())."""
    return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking


class OutOfMemoryAtMinimum(FoxhuntError):
    """Even the smallest batch does not fit."""


class OOMBackoff(L.Callback):
    """Survive `torch.OutOfMemoryError` in a training or validation step by splitting batches.

    The LightningModule runs each step through `run_chunks`: the batch in micro-batches of the
    current size (the whole batch until the first OOM). On an OOM, memory is freed outside the
    `except` block, the micro-batch size drops by `factor`, and the step carries on: training
    with `keep_effective_batch` restarts the batch with zeroed gradients and accumulates the
    micro-batches into one optimizer step (the same update as the whole batch); otherwise, and
    in validation, it resumes at the micro-batch that failed. No sample is skipped or counted
    twice and the loader's batches stay as they are. The sizes are kept in checkpoints.

    Under DDP a training step is collective: after its micro-batches (or its first OOM) every
    process reports whether it ran out of memory, and if any did, all shrink to the same size
    and redo the step, so the one gradient all-reduce that follows always matches. Validation
    steps stay per process (they hold no collective), each with its own micro-batch size."""

    def __init__(
        self,
        factor: float = 2.0,
        min_batch_size: int = 1,
        max_retries: int = 8,
        keep_effective_batch: bool = True,
        explain: Callable[[], str] | None = None,
    ) -> None:
        self.factor = factor
        self.min_batch_size = min_batch_size
        self.max_retries = max_retries
        self.keep_effective_batch = keep_effective_batch
        self.explain = explain  # what batch 1 needs, from the estimator, for the final error
        self.micro: dict[str, int | None] = {"train": None, "val": None}
        self.events: list[dict[str, Any]] = []
        self.device = torch.device("cpu")
        self.step = 0
        self.strategy: Strategy | None = None
        self.world_size = 1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.device = pl_module.device
        self.strategy, self.world_size = trainer.strategy, trainer.world_size

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step = trainer.global_step

    def run_chunks(self, n: int, kind: str, fn: Callable[[int, int], None], restart: bool) -> None:
        """Call fn(start, stop) over [0, n) in micro-batches; see the class docstring."""
        start = 0
        while True:
            size = min(self.micro[kind] or n, n)
            error = None
            try:
                while start < n:
                    stop = min(start + size, n)
                    fn(start, stop)
                    start = stop
            except torch.OutOfMemoryError as exc:
                error = " ".join(str(exc).split())[:300]
            failed = error is not None
            if failed:  # outside the except: the traceback and its frames' tensors are gone
                free_memory(self.device)
            smaller = self._smaller(size) if failed else size
            if kind == "train" and self.world_size > 1:  # before the step's gradient all-reduce
                ranks, smaller = self._agree(failed, smaller)
                if ranks and not failed:
                    free_memory(self.device)
                    error = f"out of memory on process {', '.join(map(str, ranks))}"
                failed = bool(ranks)
            if not failed:
                return
            self._shrink(kind, size, smaller, n, error)
            if restart:
                start = 0

    def _smaller(self, size: int) -> int:
        """The micro-batch size after an OOM at `size`; 0: none left to try."""
        if size <= self.min_batch_size or len(self.events) >= self.max_retries:
            return 0
        return max(self.min_batch_size, int(size / self.factor))

    def _agree(self, failed: bool, smaller: int) -> tuple[list[int], int]:
        """Across the DDP processes: which ran out of memory, and the smallest size proposed
        (a process without an OOM proposes its current size; 0 gives up)."""
        assert self.strategy is not None
        # one max-reduce: a flag per process, and the negated size (its max is the min size)
        report = torch.zeros(self.world_size + 1, dtype=torch.long, device=self.device)
        report[self.strategy.global_rank] = int(failed)
        report[-1] = -smaller
        report = self.strategy.reduce(report, reduce_op="max").cpu()
        return report[:-1].nonzero().flatten().tolist(), -int(report[-1])

    def _shrink(self, kind: str, size: int, smaller: int, n: int, error: str) -> None:
        if smaller == 0:
            why = (
                f"out of memory at batch size {size} in {kind}"
                if size <= self.min_batch_size
                else f"out of memory {len(self.events) + 1} times (memory.oom_backoff.max_retries)"
            )
            needs = f"; {self.explain()}" if self.explain else ""
            raise OutOfMemoryAtMinimum(
                f"{why}{needs}; use memory.gradient_checkpointing=true, a lower precision or a "
                "smaller model (model.hidden_dim, fewer features)"
            )
        self.micro[kind] = smaller
        event = {"step": self.step, "kind": kind, "batch_size": n, "from": size, "to": smaller}
        self.events.append(event | {"error": error})
        log.warning(
            "[MEMORY] OOM in %s at step %d (micro-batch %d of %d): backing off to %d (%s)",
            kind,
            self.step,
            size,
            n,
            smaller,
            error,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"micro": dict(self.micro), "events": list(self.events)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro = dict(state["micro"])
        self.events = list(state["events"])


class OptimizerStateRelease(L.Callback):
    """Move the optimizer state off the device before validation and back after it.

    The state tensors go to host memory (pinned on CUDA, copied without blocking) and are
    replaced in the optimizer's state dict, so their device memory is freed; after validation
    the same values come back, and training continues bit for bit as without the release. On a
    CPU device the state is copied within host memory: nothing is freed, the path is the same."""

    def __init__(self) -> None:
        self.released_bytes = 0
        self._moved: list[tuple[dict[str, Any], str, torch.device]] = []

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not _fitting(trainer):
            return
        moved = 0
        for optimizer in trainer.optimizers:
            for state in optimizer.state.values():
                for key, t in state.items():
                    if isinstance(t, torch.Tensor):
                        host = torch.empty(
                            t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda
                        )
                        host.copy_(t, non_blocking=t.is_cuda)
                        state[key] = host
                        self._moved.append((state, key, t.device))
                        moved += t.numel() * t.element_size()
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)  # the copies land before the memory is reused
        self.released_bytes = moved
        log.info(
            "[MEMORY] optimizer state off %s for validation: %.1f MB",
            pl_module.device.type,
            moved / MB,
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for state, key, device in self._moved:
            state[key] = state[key].to(device, non_blocking=True)
        self._moved.clear()


class CacheClearing(L.Callback):
    """Every n validation (and optionally training) batches: the model's own caches, Python's
    garbage and, on CUDA, the allocator's unused blocks."""

    def __init__(self, every_n_batches: int, in_training: bool = False) -> None:
        self.every = every_n_batches
        self.in_training = in_training

    def _maybe_clear(self, pl_module: L.LightningModule, batch_idx: int) -> None:
        if (batch_idx + 1) % self.every == 0:
            clear = getattr(pl_module.model, "clear_cache", None)
            if clear is not None:
                clear()
            free_memory(pl_module.device)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *a) -> None:  # noqa: ANN001
        self._maybe_clear(pl_module, batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if self.in_training:
            self._maybe_clear(pl_module, batch_idx)


class MemoryLog(L.Callback):
    """`[MEMORY] epoch 0 before_validation: 1611.0 MB / 4096.0 MB (39.3%), peak ...` at epoch
    start, before and after validation and at epoch end, each with the peak of the phase that
    just ended; the same figures go to the logger as `memory/<phase>_*` metrics."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.peak_mb: float | None = None  # over the run: CUDA allocated, CPU live or RSS

    def _emit(self, trainer: L.Trainer, pl_module: L.LightningModule, phase: str) -> None:
        device = pl_module.device
        s = snapshot(device)
        # CPU tensors are counted only under a budget (the counter slows a step by ~40%)
        used = s.get("allocated_mb", s.get("live_mb"))
        seen = s.get(
            "peak_allocated_mb", s.get("peak_live_mb", s["rss_mb"] if used is None else used)
        )
        self.peak_mb = max(self.peak_mb or 0.0, seen)
        head = f"[MEMORY] epoch {trainer.current_epoch} {phase}: "
        if used is None:
            line = f"{head}rss {s['rss_mb']:.1f} MB"
            self.lines.append(line)
            log.info(line)
            self._log_metrics(trainer, phase, s)
            return
        peak = s.get("peak_allocated_mb", s.get("peak_live_mb"))
        total = s.get("total_mb")
        of = f" / {total:.1f} MB ({used / total:.1%})" if total else ""
        parts = [f"{head}{used:.1f} MB{of}"]
        if peak is not None:
            parts.append(f"peak {peak:.1f} MB")
        if "reserved_mb" in s:
            parts.append(f"reserved {s['reserved_mb']:.1f} MB")
        if "live_mb" in s:
            parts.append(f"rss {s['rss_mb']:.1f} MB")
        line = ", ".join(parts)
        self.lines.append(line)
        log.info(line)
        self._log_metrics(trainer, phase, s)
        reset_peaks(device)

    @staticmethod
    def _log_metrics(trainer: L.Trainer, phase: str, s: dict[str, float]) -> None:
        if trainer.logger is not None:
            metrics = {f"memory/{phase}_{k}": v for k, v in s.items() if k != "total_mb"}
            trainer.logger.log_metrics(metrics, step=trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._emit(trainer, pl_module, "epoch_start")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _fitting(trainer):
            self._emit(trainer, pl_module, "before_validation")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if _fitting(trainer):
            self._emit(trainer, pl_module, "after_validation")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._emit(trainer, pl_module, "epoch_end")


def batch_one_needs(cfg: Any) -> str:
    """What one sample needs by the estimate, for the message when even that does not fit."""
    est = estimate(cfg, 1, 1)
    parts = sorted(est.train.parts.items(), key=lambda kv: -kv[1])[:2]
    budget = cfg.memory.budget_mb
    of = f" of the {budget:.0f} MB budget" if budget else ""
    return (
        f"batch size 1 needs about {est.peak / MB:.1f} MB by the estimate{of} (mostly "
        + ", ".join(f"{k.replace('_', ' ')} {v / MB:.1f} MB" for k, v in parts)
        + ")"
    )


def memory_callbacks(cfg: Any) -> list[L.Callback]:
    """The callbacks the composed memory policy asks for, in the order they must run."""
    mem = cfg.memory
    callbacks: list[L.Callback] = []
    if mem.oom_backoff.enabled:
        ob = mem.oom_backoff
        callbacks.append(
            OOMBackoff(
                ob.factor,
                ob.min_batch_size,
                ob.max_retries,
                ob.keep_effective_batch,
                explain=lambda: batch_one_needs(cfg),
            )
        )
    if mem.release_optimizer_state:  # before the log: its line shows the state released
        callbacks.append(OptimizerStateRelease())
    if mem.clear_cache_every_n_batches > 0:
        callbacks.append(
            CacheClearing(mem.clear_cache_every_n_batches, mem.clear_cache_in_training)
        )
    if mem.log_memory:
        callbacks.append(MemoryLog())
    return callbacks
