"""The training step and the validation step, written once.

The LightningModule runs them, the memory estimator traces them under FakeTensorMode, the batch
size search tries them and the benchmarks time them: a change here changes all four, so the
estimate cannot drift from what training does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from foxhunt.evaluation.loss import cross_sectional_loss, quantile_loss
from foxhunt.models.ensemble import members_of

Batch = dict[str, torch.Tensor]


@runtime_checkable
class ChunkRunner(Protocol):
    """What the training asks of a memory plug-in that splits steps into micro-batches
    (foxhunt.memory.OOMBackoff): call fn(start, stop) over [0, n) in pieces that fit."""

    keep_effective_batch: bool

    def run_chunks(
        self, n: int, kind: str, fn: Callable[[int, int], None], restart: bool
    ) -> None: ...


class Whole:
    """The runner without a plug-in: the batch in one piece."""

    keep_effective_batch = True

    def run_chunks(self, n: int, kind: str, fn: Callable[[int, int], None], restart: bool) -> None:
        fn(0, n)


def rows(batch: Batch, start: int, stop: int) -> Batch:
    """Samples [start, stop) of a batch (views, no copy)."""
    return {k: v[start:stop] for k, v in batch.items()}


def forecast_loss(
    model: nn.Module, batch: Batch, quantiles: torch.Tensor, xs_weight: float = 0.0
) -> torch.Tensor:
    """The model's quantile loss on a batch (forward and loss, autograd on); with `xs_weight`
    (optim.xs_weight) plus that times `cross_sectional_loss` of its median across the names of
    each date in the batch (its windows' `origin`). An ensemble's: the sum of its members'
    (`foxhunt.models.ensemble`), so each member's gradient is the one it would have alone."""
    total = torch.zeros((), device=batch["target"].device)
    ranked = xs_weight and "origin" in batch
    median = int(torch.argmin((quantiles - 0.5).abs())) if ranked else 0  # once, not a member
    for member in members_of(model):
        pred = member(batch)
        total = total + quantile_loss(pred, batch["target"], quantiles)
        if ranked:
            xs = cross_sectional_loss(pred[..., median], batch["target"], batch["origin"])
            total = total + xs_weight * xs
    return total


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    quantiles: torch.Tensor,
    *,
    clip: float | None = None,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    runner: ChunkRunner | None = None,
    before_update: Callable[[], None] | None = None,
    xs_weight: float = 0.0,
) -> torch.Tensor:
    """One training step: zero the gradients, forward, loss, backward, clip the gradient norm
    to `clip`, optimizer step. Returns the batch's mean loss (detached).

    `runner` may run the batch as micro-batches (OOM backoff): with `keep_effective_batch` their
    gradients accumulate into one update equal to the whole batch's (a restarted step zeroes
    them again); without, each micro-batch is its own optimizer step. `backward` is Lightning's
    manual_backward in the module; `before_update` runs before clipping (the DDP gradient
    all-reduce); `xs_weight`: `forecast_loss`'s (a micro-batch's dates: the names in it). An
    ensemble's members are clipped one by one, as each alone would be."""
    runner = runner or Whole()
    n = len(batch["target"])
    accumulate = runner.keep_effective_batch
    total = torch.zeros((), device=batch["target"].device)

    def update() -> None:
        if before_update is not None:
            before_update()
        if clip:  # (Lightning's clip_gradients refuses fused optimizers under bf16-mixed; no
            # precision used here scales gradients, so plain clipping is right)
            for member in members_of(model):  # each member's gradient alone
                nn.utils.clip_grad_norm_(member.parameters(), clip)
        optimizer.step()

    def run(start: int, stop: int) -> None:
        nonlocal total
        if start == 0 or not accumulate:
            optimizer.zero_grad(set_to_none=True)
        if start == 0 and accumulate:
            total = torch.zeros((), device=total.device)
        part = rows(batch, start, stop) if stop - start < n else batch
        loss = forecast_loss(model, part, quantiles, xs_weight)
        backward(loss * ((stop - start) / n) if accumulate and stop - start < n else loss)
        if not accumulate:
            update()
        total = total + loss.detach() * (stop - start)

    runner.run_chunks(n, "train", run, restart=accumulate)
    if accumulate:
        update()
    return total / n / len(members_of(model))  # (an ensemble's: its members' mean)


@torch.no_grad()
def validation_forward(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The validation step's forward: quantile predictions without autograd."""
    return model(batch)
