"""The fused continuous-input variable selection path against autograd and the plain path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from foxhunt.memory.budget import LiveTensorBytes
from foxhunt.models import fused_vsn
from foxhunt.models.blocks import VariableSelectionNetwork
from foxhunt.models.dropout import keep_mask
from foxhunt.models.fused_vsn import selected_grns


def fused_inputs(n=5, dh=3, h=4, rows=6, skip_norm=True, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    x = r(rows, n)
    s = torch.softmax(r(rows, n), -1).detach().requires_grad_()
    skip = (r(n, h), r(n, h)) if skip_norm else None
    return (
        x,
        s,
        r(n, dh),
        r(n, dh),
        r(n, dh, dh),
        r(n, dh),
        r(n, dh, 2 * h),
        r(n, 2 * h),
        r(n, h),
        r(n, h),
        skip,
        (r(n, h), r(n, h)),
    )


def autograd_selected_grns(x, s, A, C, W2, b2, Wg, bg, P, Q, skip_norm, norm, keep=None, p=0.0):
    """The same computation written the obvious way, for autograd to differentiate."""
    xv = x.unsqueeze(-1)  # [rows, n, 1]
    f = torch.einsum("mnk,nkl->mnl", F.elu(xv * A + C), W2) + b2
    if keep is not None:
        f = f * keep / (1 - p)
    g = torch.einsum("mnk,nkl->mnl", f, Wg) + bg
    r = xv * P + Q
    if skip_norm is not None:
        r = F.layer_norm(r, r.shape[-1:]) * skip_norm[0] + skip_norm[1]
    z = F.glu(g, dim=-1) + r
    y = F.layer_norm(z, z.shape[-1:]) * norm[0] + norm[1]
    return torch.einsum("mn,mnh->mh", s, y)


def flat(args):
    out = []
    for a in args:
        out.extend(a if isinstance(a, tuple) else (a,))
    return [a for a in out if a is not None]


@pytest.mark.parametrize("skip_norm", [True, False])
@pytest.mark.parametrize("chunk_elements", [1, 10**9])  # one variable per chunk, or all at once
def test_fused_matches_autograd(monkeypatch, skip_norm, chunk_elements):
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", chunk_elements)
    args = fused_inputs(skip_norm=skip_norm)
    out = selected_grns(*args, dropout=0.0)
    expected = autograd_selected_grns(*args)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    d_out = torch.randn_like(out)
    leaves = flat(args)
    got = torch.autograd.grad(out, leaves, d_out)
    want = torch.autograd.grad(expected, leaves, d_out)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_fused_gradcheck(monkeypatch):
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", 20)
    x, s, *rest = fused_inputs(n=3, dh=2, h=3, rows=4)
    skip, norm = rest[-2], rest[-1]
    tensors = [x, s, *rest[:-2], *skip, *norm]

    def f(*t):
        return selected_grns(*t[:10], (t[10], t[11]), (t[12], t[13]), dropout=0.0)

    assert torch.autograd.gradcheck(f, tensors)


def test_fused_dropout_uses_one_mask_forward_and_backward(monkeypatch):
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", 10**9)  # one chunk: one mask drawn
    args = fused_inputs()
    torch.manual_seed(3)
    out = selected_grns(*args, dropout=0.5)
    torch.manual_seed(3)
    x, A = args[0], args[2]
    keep = keep_mask(torch.empty(A.shape[0], x.shape[0], A.shape[1], dtype=x.dtype), 0.5)
    expected = autograd_selected_grns(*args, keep=keep.transpose(0, 1), p=0.5)
    torch.testing.assert_close(out, expected)
    leaves = flat(args)
    for a, b in zip(
        torch.autograd.grad(out.sum(), leaves),
        torch.autograd.grad(expected.sum(), leaves),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("chunk_elements", [1, 10**9])
def test_recompute_mode_gives_the_same_output_and_gradients(monkeypatch, chunk_elements):
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", chunk_elements)
    args = fused_inputs()
    leaves = flat(args)
    results = []
    for recompute in (False, True):
        torch.manual_seed(7)
        out = selected_grns(*args, dropout=0.3, recompute=recompute)
        results.append((out, torch.autograd.grad(out, leaves, torch.ones_like(out))))
    (out_a, grads_a), (out_b, grads_b) = results
    assert torch.equal(out_a, out_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "n, dim, hidden, context",
    [(7, 4, 8, 8), (7, 8, 8, None), (6, 10, 8, 8), (1, 4, 8, 8), (3, 4, 8, None)],
)
def test_forward_scalars_equals_embedding_path(n, dim, hidden, context):
    torch.manual_seed(0)
    vsn = VariableSelectionNetwork(n, dim, hidden, 0.1, context).double().eval()
    for p in vsn.parameters():  # move off the init values so every term matters
        p.data += 0.1 * torch.randn_like(p)
    w = torch.randn(n, dim, dtype=torch.float64, requires_grad=True)
    b = torch.randn(n, dim, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 5, n, dtype=torch.float64, requires_grad=True)
    ctx = torch.randn(3, 1, context, dtype=torch.float64) if context else None

    fast, fast_w = vsn.forward_scalars(x, (w, b), ctx)
    slow, slow_w = vsn(x.unsqueeze(-1) * w + b, ctx)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(fast_w, slow_w, rtol=1e-5, atol=1e-8)

    leaves = [x, w, b, *vsn.parameters()]
    d_out = torch.randn_like(fast)
    got = torch.autograd.grad((fast * d_out).sum() + fast_w.sum(), leaves, allow_unused=True)
    want = torch.autograd.grad((slow * d_out).sum() + slow_w.sum(), leaves, allow_unused=True)
    for a, b_ in zip(got, want, strict=True):
        if a is None or b_ is None:
            assert (a is None or not a.any()) and (b_ is None or not b_.any())
        else:
            torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-8)


# Norm-wise relative error against float32. bf16 keeps 8 significant bits, so each rounding is
# off by up to 2**-8 (0.4%); through the selection weights and the folded fc1 that comes to at
# most 0.6% in the outputs and 2% in the gradients here. The bounds leave 2-3x room, and a weight
# 10% off in the fused path still shows (3-4% in the outputs, over 10% in some gradients).
BF16_FORWARD_TOL, BF16_BACKWARD_TOL = 2e-2, 4e-2


@pytest.mark.parametrize("n, dim, hidden, context", [(7, 4, 8, 8), (7, 8, 8, None)])
def test_forward_scalars_under_bf16_autocast_stays_near_float32(n, dim, hidden, context):
    """precision=bf16 trains under bfloat16 autocast (Lightning's bf16-mixed): the selection
    weights and the folded fc1 come from bf16 matmuls, then the fused kernel runs in float32.
    Forward and backward against the float32 embedding path."""
    torch.manual_seed(0)
    vsn = VariableSelectionNetwork(n, dim, hidden, 0.1, context).eval()
    for p in vsn.parameters():  # move off the init values so every term matters
        p.data += 0.1 * torch.randn_like(p)
    w = torch.randn(n, dim, requires_grad=True)
    b = torch.randn(n, dim, requires_grad=True)
    x = torch.randn(8, 16, n, requires_grad=True)
    ctx = torch.randn(8, 1, context) if context else None

    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, fast_w = vsn.forward_scalars(x, (w, b), ctx)
    slow, slow_w = vsn(x.unsqueeze(-1) * w + b, ctx)

    def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
        got, want = got.detach().float(), want.detach()
        return float((got - want).norm() / want.norm())

    forward = {"output": rel_error(fast, slow), "weights": rel_error(fast_w, slow_w)}
    assert max(forward.values()) < BF16_FORWARD_TOL, forward

    # backward outside autocast, as Lightning runs it
    names = ["x", "w", "b", *(name for name, _ in vsn.named_parameters())]
    leaves = [x, w, b, *vsn.parameters()]
    d_out = torch.randn_like(slow)
    got = torch.autograd.grad((fast * d_out).sum() + fast_w.sum(), leaves)
    want = torch.autograd.grad((slow * d_out).sum() + slow_w.sum(), leaves)
    backward = {name: rel_error(a, b_) for name, a, b_ in zip(names, got, want, strict=True)}
    assert max(backward.values()) < BF16_BACKWARD_TOL, backward


# evaluation and interpretation run under no_grad, predict under inference_mode
@pytest.mark.parametrize("inference", [torch.no_grad, torch.inference_mode])
def test_inference_keeps_no_activations_for_backward(monkeypatch, inference):
    """With grad off, inputs that require grad (the parameters) must not make the fused path
    allocate f and g for all variables, the activations training keeps for backward. Counting
    saved tensors would not see it: with grad off autograd never packs them."""
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", 1)  # one variable a chunk
    n, dh, h, rows = 32, 16, 16, 64
    args = fused_inputs(n=n, dh=dh, h=h, rows=rows)
    # training keeps f [rows, dh] and g [rows, 2h] of every variable; inference needs one
    # chunk's at a time
    chunk_bytes = rows * (dh + 2 * h) * torch.float64.itemsize
    kept_bytes = n * chunk_bytes

    def peak_bytes(mode) -> tuple[torch.Tensor, int]:
        with mode(), LiveTensorBytes() as counter:
            out = selected_grns(*args, dropout=0.0)
        return out, counter.peak

    train_out, train_peak = peak_bytes(torch.enable_grad)
    out, inference_peak = peak_bytes(inference)
    assert train_out.grad_fn is not None and out.grad_fn is None
    assert inference_peak <= train_peak - kept_bytes + chunk_bytes, (inference_peak, train_peak)
