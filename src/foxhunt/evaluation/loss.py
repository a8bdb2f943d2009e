"""The quantile (pinball) loss, the one definition training minimises and evaluation scores."""

from __future__ import annotations

import torch


def quantile_loss(
    pred: torch.Tensor, target: torch.Tensor, quantiles: torch.Tensor
) -> torch.Tensor:
    """Pinball loss averaged over samples, horizon and quantiles.

    pred [..., Q], target [...], quantiles [Q]: mean of max(q * e, (q - 1) * e), e = y - y_hat."""
    errors = target.unsqueeze(-1) - pred
    return torch.maximum(quantiles * errors, (quantiles - 1) * errors).mean()
