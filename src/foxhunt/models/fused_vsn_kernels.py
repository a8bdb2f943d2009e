"""The fused variable selection's C-kernel path (float32 on a CPU), with its hand-written backward:
the computation of `fused_vsn`'s module docstring, the elementwise chains in C (`vsn_ops`).

Two ways through it: with a small variable_dim (`row_matmuls`) forward and backward are one C
call each, their matmuls row by row; otherwise the variables go in chunks around MKL's matmuls.
`fused_vsn` decides where the kernels run and hands in the chunks (it owns their sizes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

import foxhunt.models.cpu_kernels as cpu_kernels
import foxhunt.models.vsn_ops as vsn_ops
from foxhunt.models.dropout import keep_scale

# The largest variable_dim for which the kernel path does its matmuls row by row in C: at S
# (variable_dim 16) MKL's batched matmuls with K = 16 mostly write their output.
ROW_MATMUL_MAX_DH = 32

# saved tensors, or the gradients of the tensors `KernelSelectedGRNs.forward` took (in its order)
Tensors = tuple[Tensor | None, ...]


class Selection(NamedTuple):
    """The fused selection's tensors (`fused_vsn`'s module docstring), in the order every
    function, autograd Function and op of it takes them; their gradients come back in it too."""

    x: Tensor  # [n, M] scalar inputs
    s: Tensor  # [n, M] selection weights
    A: Tensor  # [n, dh]: fc1 folded into an affine map of the scalar
    C: Tensor  # [n, dh]
    W2: Tensor  # [n, dh, dh]
    b2: Tensor  # [n, dh]
    Wg: Tensor  # [n, dh, 2h]
    bg: Tensor  # [n, 2h]
    u: Tensor  # [n, M] skip coefficients
    v: Tensor | None  # [n, M]; None: the skip is not layer-normalised
    R0: Tensor  # [n, h] skip vectors
    R1: Tensor
    R2: Tensor | None
    gamma: Tensor  # [n, h] output LayerNorm
    beta: Tensor

    def each(self, f: Any) -> Selection:
        """f of each tensor, None kept."""
        return Selection(*(None if t is None else f(t) for t in self))


def row_matmuls(dh: int) -> bool:
    """Whether the kernel path runs forward and backward in one pass each with their matmuls
    row by row (`torch.ops.foxhunt.vsn_forward`, `vsn_ops.backward_rows`) for variable_dim `dh`,
    rather than in chunks around MKL's matmuls. The backward makes g = f Wg again from f and adds
    up the weights' gradients itself: at S (tft_small) g and its gradient were 34 MB each a step
    that MKL's matmuls wrote and read back, and the backward took 1.5x as long with them."""
    return dh <= ROW_MATMUL_MAX_DH and dh % cpu_kernels.LANES == 0


def chunk_of(c: slice, *tensors: Tensor | None) -> list[Tensor | None]:
    """The variables `c` of each tensor (its first axis), None kept."""
    return [None if t is None else t[c] for t in tensors]


def _chunk_gate(c: slice, g: Tensor, bias: Tensor, scale: float, t: Selection) -> vsn_ops.Gate:
    """The `vsn_ops.Gate` of the variables `c` (g and bias are already theirs)."""
    v_c, R2_c = chunk_of(c, t.v, t.R2)
    return vsn_ops.Gate(
        g, bias, scale, t.s[c], t.u[c], v_c, t.R0[c], t.R1[c], R2_c, t.gamma[c], t.beta[c]
    )


def _like(t: Tensor | None) -> Tensor | None:
    return None if t is None else torch.empty_like(t)


def kernel_forward(
    t: Selection,
    dropout: float,
    seed: Tensor,
    chunks: list[slice],
    f_all: Tensor | None = None,
    g_all: Tensor | None = None,
) -> Tensor:
    """`fused_vsn`'s forward with the elementwise chains in C (`cpu_kernels`), one pass each: ELU;
    fc2's bias with the dropout mask (drawn from `seed`, not kept); everything after the GLU's
    matmul, its bias and the dropout scale included. The matmuls run without their biases."""
    x, s, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, gamma, beta = t
    rows, h = x.shape[1], gamma.shape[-1]
    scale = keep_scale(dropout, x)
    if row_matmuls(W2.shape[-1]):
        f_out = x.new_empty(0) if f_all is None else f_all  # (empty: f not kept)
        weights = (x, A, C, W2, b2, Wg, bg)
        gate = (s, u, v, R0, R1, R2, gamma, beta)
        return torch.ops.foxhunt.vsn_forward(*weights, seed, dropout, scale, *gate, f_out)
    # nothing dropped and f not kept: fc2's bias rides on the gate's,
    # (a W2 + b2) Wg + bg = (a W2) Wg + (b2 Wg + bg)
    fold = not dropout and f_all is None
    out = x.new_zeros(rows, h)
    for c in chunks:
        a = vsn_ops.elu(x[c], A[c], C[c])
        f = torch.bmm(a, W2[c], out=None if f_all is None else f_all[c])
        del a
        if fold:
            bias = torch.baddbmm(bg[c].unsqueeze(1), b2[c].unsqueeze(1), Wg[c]).squeeze(1)
        else:
            vsn_ops.bias_dropout(f, b2[c], c.start, seed, dropout)
            bias = bg[c]
        g = torch.bmm(f, Wg[c], out=None if g_all is None else g_all[c])
        del f
        gate = _chunk_gate(c, g, bias, scale, t)
        vsn_ops.gate_norm_sum(gate, out)
        del g, gate  # (gate holds g: the next chunk's would coexist with it, 4 MB at tft_base)
    return out


class KernelSelectedGRNs(torch.autograd.Function):
    """`fused_vsn._SelectedGRNs` with the elementwise chains in C, for float32 on a CPU; its
    last argument the chunks of the variables, for forward and backward."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> Tensor:
        *tensors, dropout, save, recompute, chunks = args
        t = Selection(*tensors)
        n, rows = t.x.shape
        dh, h = t.W2.shape[-1], t.gamma.shape[-1]
        seed = cpu_kernels.draw_seed(dropout)
        keep = save and not recompute
        f_all = t.x.new_empty(n, rows, dh) if keep else None
        # the row path's backward makes g again from f (`vsn_ops.backward_rows`)
        g_all = t.x.new_empty(n, rows, 2 * h) if keep and not row_matmuls(dh) else None
        out = kernel_forward(t, dropout, seed, chunks, f_all, g_all)
        if save:
            ctx.save_for_backward(*t, f_all, g_all, seed)
            ctx.dropout, ctx.chunks = dropout, chunks
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> Tensors:
        with torch.autocast(d_out.device.type, enabled=False):  # float32, as the forward
            *saved, seed = ctx.saved_tensors
            d_out = d_out.to(saved[0].dtype).contiguous()
            dh = saved[4].shape[-1]  # W2 [n, dh, dh]
            backward = _row_backward if row_matmuls(dh) else _chunk_backward
            return (*backward(ctx, saved, seed, d_out), None, None, None, None)


def _row_backward(ctx: Any, saved: Tensors, seed: Tensor, d_out: Tensor) -> Tensors:
    """A small variable_dim: the whole backward row by row in C, in one call; the gradients
    of the tensors `KernelSelectedGRNs.forward` took, in its order."""
    t = Selection(*saved[:15])
    x, s, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, gamma, beta = t
    f_all = saved[15]
    p = ctx.dropout
    scale = keep_scale(p, x)
    d_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
    d_s, d_u, d_v = _like(s), _like(u), _like(v)
    gate = vsn_ops.Gate(None, bg, scale, s, u, v, R0, R1, R2, gamma, beta)
    sums = vsn_ops.backward_rows(
        gate, d_out, x, A, C, W2, b2, Wg, f_all, seed, p, d_s, d_u, d_v, d_x
    )
    d_Wg, d_W2 = sums["Wg"], sums["W2"]
    if scale != 1:
        d_Wg *= scale
    d_b2, d_A, d_C, d_bg = sums["b2"], sums["A"], sums["C"], sums["bias"]
    d_gamma, d_beta, d_R0, d_R1 = sums["gamma"], sums["beta"], sums["R0"], sums["R1"]
    d_R2 = None if R2 is None else sums["R2"]
    return (d_x, d_s, d_A, d_C, d_W2, d_b2, d_Wg, d_bg, d_u, d_v, d_R0, d_R1, d_R2, d_gamma, d_beta)


def _chunk_backward(ctx: Any, saved: Tensors, seed: Tensor, d_out: Tensor) -> Tensors:
    """The backward in chunks of the variables around MKL's matmuls, the elementwise chains in
    C; the gradients of the tensors `KernelSelectedGRNs.forward` took, in its order."""
    t = Selection(*saved[:15])
    x, s, A, C, W2, b2, Wg, bg, u, v, R0, R1, R2, gamma, beta = t
    f_all, g_all = saved[15:17]
    p = ctx.dropout
    scale = keep_scale(p, x)
    d_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
    d_s, d_u, d_v = _like(s), _like(u), _like(v)
    d_A, d_C, d_W2, d_Wg = _like(A), _like(C), _like(W2), _like(Wg)
    d_R0, d_R1, d_R2 = _like(R0), _like(R1), _like(R2)
    d_gamma, d_beta, d_b2, d_bg = _like(gamma), _like(beta), _like(b2), _like(bg)
    sums_into = {"gamma": d_gamma, "beta": d_beta, "R0": d_R0, "R1": d_R1, "R2": d_R2, "bias": d_bg}
    for c in ctx.chunks:
        if g_all is None:  # recompute mode: f and g as the forward made them
            a = vsn_ops.elu(x[c], A[c], C[c])
            f = torch.bmm(a, W2[c])
            vsn_ops.bias_dropout(f, b2[c], c.start, seed, p)
            g = torch.bmm(f, Wg[c])
        else:
            f, g = f_all[c], g_all[c]
        gate = _chunk_gate(c, g, bg[c], scale, t)
        d_rows = (d_s[c], d_u[c], *chunk_of(c, d_v))
        d_g, sums = vsn_ops.gate_norm_sum_backward(gate, d_out, *d_rows)
        if g_all is not None:  # (after the gate's backward: not held through its peak)
            a = vsn_ops.elu(x[c], A[c], C[c])
        del g, gate
        for key, grad in sums_into.items():
            if grad is not None:
                grad[c] = sums[key]
        torch.bmm(f.transpose(1, 2), d_g, out=d_Wg[c])
        if scale != 1:
            d_Wg[c] *= scale
        del f
        d_f = torch.bmm(d_g, Wg[c].transpose(1, 2))
        # the forward's mask again, the dropout scale with it; fc2's bias gradient
        d_b2[c] = vsn_ops.bias_dropout(d_f, None, c.start, seed, p, scale, True)
        del d_g
        torch.bmm(a.transpose(1, 2), d_f, out=d_W2[c])
        d_a = torch.bmm(d_f, W2[c].transpose(1, 2))
        d_A[c], d_C[c] = vsn_ops.elu_backward(x[c], A[c], a, d_a, None if d_x is None else d_x[c])
        del a, d_a, d_f
    return (d_x, d_s, d_A, d_C, d_W2, d_b2, d_Wg, d_bg, d_u, d_v, d_R0, d_R1, d_R2, d_gamma, d_beta)
