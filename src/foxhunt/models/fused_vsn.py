"""The per-variable GRNs of a variable selection network (eq. 7) and their weighted sum (eq. 8),
fused, for continuous inputs, with a hand-written backward.

Why not plain autograd: it keeps about eight [rows, variables, hidden] tensors per network for
backward (fc1, ELU, fc2, GLU, add and LayerNorm outputs); with tft_base's 225 variables each of
them is about a gigabyte. This keeps two (the fc2 output and the GLU pre-activation), recomputes
the elementwise parts in backward, and processes the variables in chunks, so the [rows, variables,
hidden] intermediates exist only a chunk at a time. At inference (nothing needs a gradient) the
same forward runs without the autograd Function, and under torch.export
(`foxhunt.app.predict.export`'s ONNX export) in chunks fixed by the weights' sizes, for a batch
that is symbolic there.

It also uses that a continuous variable's embedding is a scalar x times a vector w plus b:
- fc1(x w + b) = x (w W1) + (b W1 + b1), so fc1 is an elementwise affine map (A and C below);
- the skip x P + Q, layer-normalised when resampled, is R0 + u R1 + v R2 with per-row scalars
  u = x / std, v = 1 / std (std of x P + Q over its features, from a few per-variable moments)
  and vectors R1 = (P - mean P) gamma, R2 = (Q - mean Q) gamma, R0 = beta: no LayerNorm pass.

Per variable j (rows m): h1 = x A_j + C_j; a = ELU(h1); f = dropout(a W2_j + b2_j);
g = f Wg_j + bg_j; z = GLU(g) + r_j; y = LayerNorm_j(z); out_m = sum_j s_mj y_mj.

Two implementations of the same computation: in float32 on a CPU the elementwise chains run in
C (`fused_vsn_kernels` around `cpu_kernels`: each chain one pass instead of about ten, its
dropout mask drawn from a seed in forward and again in backward, not kept), and with a small
variable_dim forward and backward do their matmuls row by row there too, keeping only f
(`row_matmuls`); elsewhere (CUDA, float64, torch.export, a hidden size that is not a multiple of
16, or no C compiler at install) the PyTorch ops below. Each has one backward:
`_SelectedGRNs.backward` here, `KernelSelectedGRNs.backward` there (row by row in one C call for
a small variable_dim, else in chunks around MKL's matmuls). The two agree to float32 rounding
(tests/models/test_cpu_kernels.py). Their dropout masks are drawn differently: the kernels hash
each element's index with a seed drawn from torch's generator, the PyTorch path takes torch's
random bits (`dropout.keep_mask`). Each keeps an element with probability 1 - p (p rounded to
1/65536) and draws the same masks for the same torch.manual_seed, but a run with the kernels
and one without drop other elements (tested); a run's summary says which ran.
This module chooses between them and sizes the chunks of both.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

import foxhunt.models.cpu_kernels as cpu_kernels
from foxhunt.models.dropout import keep_mask, keep_scale
from foxhunt.models.fused_vsn_kernels import (
    KernelSelectedGRNs,
    Selection,
    Tensors,
    chunk_of,
    kernel_forward,
)
from foxhunt.models.fused_vsn_kernels import row_matmuls as row_matmuls  # (re-exported)

# Elements per intermediate tensor of one chunk. Small enough that a chunk's dozen elementwise
# passes run mostly in cache: measured on 2 CPU cores, 1M against 8M made a training step 20%
# faster at bench config S (16 variables) and 15% at B (225), and evaluation 45% / 12% faster.
CHUNK_ELEMENTS = 1024 * 1024
# The chunks of an exported graph (`_export_chunks`) are fixed when it is made, for any batch: at
# most EXPORT_ROW_ELEMENTS per row of an intermediate, unless that makes more than
# EXPORT_MAX_CHUNKS chunks (torch.onnx takes superlinearly longer on a longer graph: tft_base's
# 226 variables in 113 chunks took 5 minutes, in 15 chunks 13 s; measured on 2 CPU cores).
EXPORT_ROW_ELEMENTS = 1024
EXPORT_MAX_CHUNKS = 32
LN_EPS = 1e-5


def _chunks(n: int, rows: int, h: int, x: Tensor) -> list[slice]:
    """Chunks of the n variables whose [chunk, rows, 2 h] intermediates hold about
    CHUNK_ELEMENTS; under torch.compile an exported graph's (from the weights alone): chunks
    from the rows, the batch, would make a graph for each batch size."""
    if torch.compiler.is_compiling():
        return _export_chunks(n, h)
    size = max(1, CHUNK_ELEMENTS // max(rows * 2 * h, 1))
    chunks = [slice(i, min(i + size, n)) for i in range(0, n, size)]
    # Under FakeTensorMode (foxhunt.memory's estimator) each chunk allocates and frees the same
    # temporaries, and the first is the largest: it alone gives the same peak, 225x faster.
    return chunks[:1] if isinstance(x, FakeTensor) else chunks


def _affine(xhat: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    """Per-variable LayerNorm affine: xhat [c, M, h] with gamma, beta [c, h]."""
    return torch.addcmul(beta.unsqueeze(1), xhat, gamma.unsqueeze(1))


def _normalize(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm without affine over the last axis (one native kernel): x_hat, mean, 1/std."""
    return torch.native_layer_norm(z, z.shape[-1:], None, None, LN_EPS)


def _normalize_backward(d_xhat: Tensor, z: Tensor, mean: Tensor, rstd: Tensor) -> Tensor:
    return torch.ops.aten.native_layer_norm_backward(
        d_xhat, z, z.shape[-1:], mean, rstd, None, None, [True, False, False]
    )[0]


def _gated_sum(
    g: Tensor, u: Tensor, R1: Tensor, v: Tensor | None, R2: Tensor | None, R0: Tensor
) -> Tensor:
    """z = GLU(g) + R0 + u R1 (+ v R2) for a chunk, built in place."""
    z = F.glu(g, dim=-1).add_(R0.unsqueeze(1)).addcmul_(u.unsqueeze(-1), R1.unsqueeze(1))
    return z if v is None else z.addcmul_(v.unsqueeze(-1), R2.unsqueeze(1))


def _col(t: Tensor) -> Tensor:
    return t.unsqueeze(-1)


def _row(t: Tensor) -> Tensor:
    return t.unsqueeze(1)


def _forward(
    t: Selection,
    dropout: float,
    chunks: list[slice],
    f_all: Tensor | None = None,
    g_all: Tensor | None = None,
    keep_all: Tensor | None = None,
) -> Tensor:
    """The forward of the module docstring over `chunks` of the variables, plain tensor ops
    (the autograd Function's forward; inference calls it directly). `f_all`, `g_all`,
    `keep_all`: buffers that keep fc2's output, the GLU pre-activation and the dropout mask
    for backward."""
    x, s, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, gamma, beta = t
    rows, h = x.shape[1], gamma.shape[-1]
    # dropout(f) Wg == (f * keep) (Wg / (1 - p)): the scale rides on the matmul for free
    scale = keep_scale(dropout, x)
    out = x.new_zeros(rows, h)
    for c in chunks:
        a = F.elu(torch.addcmul(_row(C[c]), _col(x[c]), _row(A[c])))
        # each temporary is dropped as soon as it is used: the next chunk's then reuse its
        # memory instead of briefly coexisting with it (2 MB less at tft_small, batch 32)
        f = torch.baddbmm(_row(b2[c]), a, W2[c], out=None if f_all is None else f_all[c])
        del a
        if dropout:
            keep = keep_mask(f, dropout)  # (foxhunt.models.dropout: cheaper on a CPU)
            f.mul_(keep)
            if keep_all is not None:
                keep_all[c] = keep
            del keep
        g = torch.baddbmm(
            _row(bg[c]), f, Wg[c], alpha=scale, out=None if g_all is None else g_all[c]
        )
        del f
        z = _gated_sum(g, u[c], R1[c], *chunk_of(c, v, R2), R0[c])
        del g
        y = _affine(_normalize(z)[0], gamma[c], beta[c])
        del z
        out += y.mul_(_col(s[c])).sum(0)  # (an einsum would copy y to [M, c, h])
        del y
    return out


def _export_chunks(n: int, h: int) -> list[slice]:
    """Chunks of the variables for torch.export, from the sizes of the weights alone (the rows
    are a symbolic batch there): an exported graph run on a large batch makes its [variables,
    rows, 2 h] intermediates a chunk at a time."""
    size = max(1, EXPORT_ROW_ELEMENTS // (2 * h), math.ceil(n / EXPORT_MAX_CHUNKS))
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class _SelectedGRNs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, *args: Any) -> Tensor:
        *tensors, dropout, save, recompute = args  # a Selection's tensors, then the options
        t = Selection(*tensors)
        x = t.x
        n, rows = x.shape
        dh, h = t.W2.shape[-1], t.gamma.shape[-1]
        # recompute: keep only the dropout mask; backward rebuilds f and g chunk by chunk
        f_all = x.new_empty(n, rows, dh) if save and not recompute else None
        g_all = x.new_empty(n, rows, 2 * h) if save and not recompute else None
        keep_all = x.new_empty(n, rows, dh, dtype=torch.bool) if save and dropout else None
        chunks = _chunks(n, rows, h, x)
        out = _forward(t, dropout, chunks, f_all, g_all, keep_all)
        if save:
            ctx.save_for_backward(*t, f_all, g_all, keep_all)
            ctx.scale = keep_scale(dropout, x)
            ctx.dtype = x.dtype
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        with torch.autocast(d_out.device.type, enabled=False):  # float32, as the forward
            return _SelectedGRNs._backward(ctx, d_out.to(ctx.dtype))

    @staticmethod
    def _backward(ctx: Any, d_out: Tensor) -> Tensors:
        saved = ctx.saved_tensors
        t = Selection(*saved[:15])
        x, s, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, gamma, beta = t
        n, rows = x.shape
        h = gamma.shape[-1]

        def like(t: Tensor | None) -> Tensor | None:
            return None if t is None else torch.empty_like(t)

        d_x = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        d_s, d_A, d_C, d_W2, d_Wg = like(s), like(A), like(C), like(W2), like(Wg)
        d_u, d_v, d_R0, d_R1, d_R2 = like(u), like(v), like(R0), like(R1), like(R2)
        d_gamma, d_beta = like(gamma), like(beta)
        d_b2 = x.new_empty(W2.shape[0], W2.shape[-1])
        d_bg = x.new_empty(Wg.shape[0], Wg.shape[-1])
        # in the order of the forward's tensors
        grads = (d_x, d_s, d_A, d_C, d_W2, d_b2, d_Wg, d_bg, d_u, d_v, d_R0, d_R1, d_R2,
                 d_gamma, d_beta)  # fmt: skip
        for c in _chunks(n, rows, h, x):
            _backward_chunk(c, saved, grads, d_out, ctx.scale)
        return (*grads, None, None, None)


def _backward_chunk(c: slice, saved: Tensors, grads: Tensors, d_out: Tensor, scale: float) -> None:
    """`_SelectedGRNs`'s backward for the variables `c`: fills in their part of each of `grads`
    (the gradients of its forward's tensors, in their order) from its saved tensors."""
    x, s, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, gamma, beta = Selection(*saved[:15])
    f_all, g_all, keep_all = saved[15:]
    d_x, d_s, d_A, d_C, d_W2, d_b2, d_Wg, d_bg, d_u, d_v, d_R0, d_R1, d_R2, d_gamma, d_beta = grads
    a = F.elu(torch.addcmul(_row(C[c]), _col(x[c]), _row(A[c])))
    if g_all is None:  # recompute mode: f and g again, with the forward's dropout mask
        f = torch.baddbmm(_row(b2[c]), a, W2[c])
        if keep_all is not None:
            f.mul_(keep_all[c])
        g = torch.baddbmm(_row(bg[c]), f, Wg[c], alpha=scale)
    else:
        f, g = f_all[c], g_all[c]
    z = _gated_sum(g, u[c], R1[c], *chunk_of(c, v, R2), R0[c])
    xhat, mean, rstd = _normalize(z)

    # the weighted sum and the output LayerNorm; reductions as matmuls where possible
    e = xhat * d_out
    sc = s[c]
    torch.bmm(_row(sc), e, out=_row(d_gamma[c]))
    torch.mm(sc, d_out, out=d_beta[c])
    d_s[c] = torch.bmm(e, _col(gamma[c])).squeeze(-1) + (d_out @ beta[c].t()).t()
    del e
    d_xhat = (_col(sc) * d_out).mul_(_row(gamma[c]))
    d_z = _normalize_backward(d_xhat, z, mean, rstd)
    del d_xhat, xhat, z

    # the skip R0 + u R1 + v R2
    torch.sum(d_z, 1, out=d_R0[c])
    torch.bmm(_row(u[c]), d_z, out=_row(d_R1[c]))
    torch.bmm(d_z, _col(R1[c]), out=_col(d_u[c]))
    if v is not None:
        torch.bmm(_row(v[c]), d_z, out=_row(d_R2[c]))
        torch.bmm(d_z, _col(R2[c]), out=_col(d_v[c]))

    # GLU and its projection
    d_g = torch.ops.aten.glu_backward(d_z, g, -1)
    del d_z
    torch.bmm(f.transpose(1, 2), d_g, out=d_Wg[c]).mul_(scale)
    torch.sum(d_g, 1, out=d_bg[c])
    d_f = torch.bmm(d_g, Wg[c].transpose(1, 2)).mul_(scale)
    del d_g
    if keep_all is not None:
        d_f.mul_(keep_all[c])

    # fc2, ELU and the folded fc1 (a was recomputed from x above)
    torch.bmm(a.transpose(1, 2), d_f, out=d_W2[c])
    torch.sum(d_f, 1, out=d_b2[c])
    d_h1 = torch.ops.aten.elu_backward(
        torch.bmm(d_f, W2[c].transpose(1, 2)), 1.0, 1.0, 1.0, True, a
    )
    del a, d_f, f, g, mean, rstd
    torch.bmm(_row(x[c]), d_h1, out=_row(d_A[c]))
    torch.sum(d_h1, 1, out=d_C[c])
    if d_x is not None:
        d_x[c] = torch.bmm(d_h1, _col(A[c])).squeeze(-1)
    del d_h1


def selected_grns(
    x: Tensor,
    s: Tensor,
    A: Tensor,
    C: Tensor,
    W2: Tensor,
    b2: Tensor,
    Wg: Tensor,
    bg: Tensor,
    P: Tensor,
    Q: Tensor,
    skip_norm: tuple[Tensor, Tensor] | None,
    norm: tuple[Tensor, Tensor],
    dropout: float,
    recompute: bool = False,
) -> Tensor:
    """sum_j s[..., j] * GRN_j(x[..., j]) for scalar inputs x, s: [..., n] -> [..., h].

    The skip of variable j is x P_j + Q_j, layer-normalised with skip_norm when given. With
    `recompute`, backward rebuilds the per-variable activations instead of keeping them (the
    [variables, rows, 3 x hidden] tensors; 4.8 GB at tft_base batch 128) for a third more
    variable-selection compute."""
    lead = x.shape[:-1]
    n = x.shape[-1]
    xt = x.reshape(-1, n).t().contiguous()
    st = s.reshape(-1, n).t().contiguous()
    if skip_norm is None:
        u, v, R0, R1, R2 = xt, None, Q, P, None
    else:
        # LayerNorm(x P + Q) from the moments of the centred P and Q: no [M, n, h] pass
        Pc, Qc = P - P.mean(-1, keepdim=True), Q - Q.mean(-1, keepdim=True)
        var_p, cov, var_q = (Pc * Pc).mean(-1), (Pc * Qc).mean(-1), (Qc * Qc).mean(-1)
        rstd = torch.rsqrt(xt * xt * _col(var_p) + 2 * xt * _col(cov) + _col(var_q) + LN_EPS)
        gamma_skip, R0 = skip_norm
        u, v, R1, R2 = xt * rstd, rstd, Pc * gamma_skip, Qc * gamma_skip
    t = Selection(xt, st, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, *norm)
    save = torch.is_grad_enabled() and any(w is not None and w.requires_grad for w in t)
    h = norm[0].shape[-1]
    if cpu_kernels.exporting():
        # torch.export (and the ONNX export) sees the forward as plain tensor ops, in chunks
        # fixed by the weights' sizes: its rows are a symbolic batch
        out = _forward(t, dropout, _export_chunks(n, h))
    elif torch.is_autocast_enabled(x.device.type):
        # under bf16 autocast the hand-written kernel runs in float32 (its preallocated
        # buffers and out= matmuls need one dtype); autocast resumes after it
        with torch.autocast(x.device.type, enabled=False):
            out = _select(t.each(Tensor.float), dropout, save, recompute)
    else:
        out = _select(t, dropout, save, recompute)
    return out.reshape(*lead, out.shape[-1])


def _select(t: Selection, dropout: float, save: bool, recompute: bool) -> Tensor:
    """The fused selection with the C kernels where they run (float32 on a CPU), else in
    PyTorch; without the autograd Function when nothing needs a gradient (inference). The
    autograd Functions take the tensors one by one: a gradient flows to each argument."""
    x = t.x
    n, rows, h = x.shape[0], x.shape[1], t.gamma.shape[-1]
    kernel = cpu_kernels.available(x, h)
    if kernel:
        t = t.each(Tensor.contiguous)
    if not save:
        chunks = _chunks(n, rows, h, x)
        if kernel:
            return kernel_forward(t, dropout, cpu_kernels.draw_seed(dropout), chunks)
        return _forward(t, dropout, chunks)
    if kernel:  # (its backward goes over the forward's chunks)
        return KernelSelectedGRNs.apply(*t, dropout, save, recompute, _chunks(n, rows, h, x))
    return _SelectedGRNs.apply(*t, dropout, save, recompute)
