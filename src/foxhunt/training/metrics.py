"""Quantile loss and the forecast metrics, as torchmetrics so they reduce across devices."""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import Metric


class _MeanMetric(Metric):
    """Sum of per-element values over count, reduced by summing across processes."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:  # torchmetrics' options (sync_on_compute, ...)
        super().__init__(**kwargs)
        self.add_state(
            "total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state(
            "count", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )

    def _add(self, values: torch.Tensor) -> None:
        self.total += values.sum(dtype=torch.float64)
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp(min=1)).float()


class QuantileLoss(_MeanMetric):
    """The pinball loss of `quantile_loss`, accumulated over an epoch."""

    def __init__(self, quantiles: list[float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("quantiles", torch.tensor(quantiles), persistent=False)

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        errors = target.unsqueeze(-1) - pred
        self._add(torch.maximum(self.quantiles * errors, (self.quantiles - 1) * errors))


class DirectionalAccuracy(_MeanMetric):
    """Share of steps where the forecast move has the sign of the actual move.

    Moves are measured from `reference` (zero for returns, the last observed value for levels);
    steps whose actual move is exactly zero (common on a tick grid) are not counted."""

    def update(self, pred: torch.Tensor, target: torch.Tensor, reference: torch.Tensor) -> None:
        actual = torch.sign(target - reference)
        hit = (torch.sign(pred - reference) == actual).float()
        self._add(hit[actual != 0])


class Coverage(_MeanMetric):
    """Share of actual values inside the outer quantile interval [q_first, q_last]."""

    def update(self, lower: torch.Tensor, upper: torch.Tensor, target: torch.Tensor) -> None:
        self._add(((target >= lower) & (target <= upper)).float())
