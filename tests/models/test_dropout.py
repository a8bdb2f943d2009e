"""foxhunt's dropout: its CPU masks keep each element with probability 1 - p, in every one of
the four 16-bit lanes an int64 draw gives (or hashed in C), and the module is nn.Dropout in all
else."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from foxhunt.models import cpu_kernels, dropout
from foxhunt.models.dropout import Dropout, keep_mask, keep_scale


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_each_lane_keeps_at_the_rate_its_scale_undoes(p):
    torch.manual_seed(0)
    x = torch.empty(1 << 20)
    keep = keep_mask(x, p).view(-1, 4).float()
    kept = 1 / keep_scale(p, x)  # the rate the scale assumes: 1 - p rounded to 1/65536
    assert kept == pytest.approx(1 - p, abs=1 / 65536)
    sd = (kept * (1 - kept) / keep.shape[0]) ** 0.5
    # every lane of the int64 draws (a draw over [0, 2**63) would bias the top one to keep)
    for lane in keep.unbind(1):
        assert abs(lane.mean().item() - kept) < 5 * sd


@pytest.mark.parametrize("hashed", [True, False])  # the C kernels' masks, or torch's draws
def test_the_module_is_nn_dropout_in_evaluation_and_unbiased_in_training(monkeypatch, hashed):
    if hashed and cpu_kernels.library() is None:
        pytest.skip("the C kernels are not built here")
    if not hashed:
        monkeypatch.setattr(cpu_kernels, "available", lambda *a: False)
    torch.manual_seed(1)
    d = Dropout(0.3)
    x = torch.randn(64, 72, 64, requires_grad=True)
    assert torch.equal(d.eval()(x), x)
    torch.manual_seed(5)
    y = d.train()(x)
    zeros = y == 0
    assert zeros.float().mean().item() == pytest.approx(0.3, abs=0.01)
    torch.testing.assert_close(y[~zeros], x[~zeros] * keep_scale(0.3, x))
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, (~zeros).float() * keep_scale(0.3, x))
    assert isinstance(d, nn.Dropout) and d.state_dict() == {}
    torch.manual_seed(5)  # the same seed, the same mask
    assert torch.equal(d(x), y)


def test_the_same_seed_draws_the_same_masks():
    x = torch.empty(1000)
    torch.manual_seed(7)
    a = keep_mask(x, 0.2)
    torch.manual_seed(7)
    assert torch.equal(a, keep_mask(x, 0.2))


def test_where_torch_draws_the_masks_the_rate_is_p_exactly(monkeypatch):
    monkeypatch.setattr(dropout, "fast_masks", lambda x: False)  # as on CUDA, or compiled
    x = torch.empty(1 << 18)
    assert keep_scale(0.1, x) == 1 / 0.9
    torch.manual_seed(2)
    assert keep_mask(x, 0.1).float().mean().item() == pytest.approx(0.9, abs=0.005)
