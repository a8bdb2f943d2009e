"""The fused continuous-input variable selection path against autograd and the plain path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from foxhunt.models import fused_vsn
from foxhunt.models.blocks import VariableSelectionNetwork
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
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", 10**9)  # one chunk: one rand_like call
    args = fused_inputs()
    torch.manual_seed(3)
    out = selected_grns(*args, dropout=0.5)
    torch.manual_seed(3)
    x, A = args[0], args[2]
    keep = torch.rand(A.shape[0], x.shape[0], A.shape[1], dtype=x.dtype) >= 0.5
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


def test_inference_saves_nothing_for_backward():
    args = fused_inputs()
    with torch.no_grad():
        out = selected_grns(*args, dropout=0.0)
    assert out.grad_fn is None
