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


# optim.xs_weight=auto's weight with a cross-sectional target: on real250 it booked better in
# every seed for the same rank IC, on drift250 it changed nothing (docs/panels.md, #69)
XS_WEIGHT = 0.1


def xs_weight_of(setting: float | str, target_transform: str) -> float:
    """The weight of `cross_sectional_loss` that optim.xs_weight=`setting` means for a target
    transformed by `target_transform` (the schema's: none, xs_demean or xs_rank)."""
    if setting == "auto":
        return XS_WEIGHT if target_transform != "none" else 0.0
    return float(setting)


def cross_sectional_loss(
    pred: torch.Tensor, target: torch.Tensor, dates: torch.Tensor, min_names: int = 3
) -> torch.Tensor:
    """1 - the mean, over the dates of a batch with at least `min_names` windows and over the
    horizon's steps, of the Pearson correlation across those windows of `pred` [B, H] (the
    median forecast) with `target` [B, H]; `dates` [B] each window's origin (#69: a term that
    rewards ranking the names of a date, which the pinball loss, name by name, does not see).
    0 where no date has enough windows."""
    _, at = torch.unique(dates, return_inverse=True)
    groups = int(at.max()) + 1 if len(at) else 0

    def by_date(x: torch.Tensor) -> torch.Tensor:  # [G, H] sums over each date's windows
        return torch.zeros(groups, x.shape[1], device=x.device, dtype=x.dtype).index_add_(0, at, x)

    count = by_date(torch.ones_like(pred[:, :1]))[:, 0]
    p = pred - (by_date(pred) / count[:, None])[at]
    t = target - (by_date(target) / count[:, None])[at]
    corr = by_date(p * t) / torch.sqrt(by_date(p * p) * by_date(t * t) + 1e-12)
    kept = corr[count >= min_names]
    return 1 - kept.mean() if kept.numel() else pred.sum() * 0
