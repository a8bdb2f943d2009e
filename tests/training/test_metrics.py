"""The quantile loss and forecast metrics against hand computations."""

from __future__ import annotations

import pytest
import torch

from foxhunt.evaluation.loss import quantile_loss
from foxhunt.training.metrics import Coverage, DirectionalAccuracy, QuantileLoss


def test_quantile_loss_by_hand():
    quantiles = torch.tensor([0.1, 0.5, 0.9])
    pred = torch.tensor([[[-1.0, 0.0, 2.0]]])  # one sample, one step
    target = torch.tensor([[1.0]])
    # errors y - y_hat = [2, 1, -1]; pinball = [0.1*2, 0.5*1, (0.9-1)*(-1)] = [0.2, 0.5, 0.1]
    assert quantile_loss(pred, target, quantiles).item() == pytest.approx((0.2 + 0.5 + 0.1) / 3)


def test_quantile_loss_metric_matches_function_over_batches():
    torch.manual_seed(0)
    quantiles = [0.1, 0.5, 0.9]
    metric = QuantileLoss(quantiles)
    preds, targets = torch.randn(2, 5, 4, 3), torch.randn(2, 5, 4)
    for p, t in zip(preds, targets, strict=True):
        metric.update(p, t)
    expected = quantile_loss(preds, targets, torch.tensor(quantiles))
    assert metric.compute().item() == pytest.approx(expected.item(), rel=1e-6)


def test_directional_accuracy_skips_flat_steps():
    metric = DirectionalAccuracy()
    pred = torch.tensor([[0.5, -0.2, 0.3, 0.1]])
    target = torch.tensor([[1.0, 0.4, 0.0, 2.0]])
    metric.update(pred, target, torch.zeros_like(target))
    # steps 0 and 3 agree, step 1 disagrees, step 2 has no actual move
    assert metric.compute().item() == pytest.approx(2 / 3)


def test_directional_accuracy_from_last_level():
    metric = DirectionalAccuracy()
    reference = torch.tensor([[10.0, 10.0]])
    metric.update(torch.tensor([[11.0, 9.0]]), torch.tensor([[12.0, 11.0]]), reference)
    assert metric.compute().item() == pytest.approx(0.5)


def test_coverage():
    metric = Coverage()
    lower, upper = torch.tensor([[0.0, 0.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    metric.update(lower, upper, torch.tensor([[0.5, 1.0, 1.5, -0.1]]))
    assert metric.compute().item() == pytest.approx(0.5)
