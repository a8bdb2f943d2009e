"""The fused variable selection's C kernels as torch ops (`torch.ops.foxhunt.vsn_*`, loaded and
checked by `cpu_kernels`): its elementwise chains around MKL's matmuls, and, for a small
variable_dim, its whole forward and backward row by row. `fused_vsn_kernels` strings them
together; each op's fake implementation allocates what its CPU one does (the memory estimator
traces them), and each is `opcheck`ed (tests/models/test_cpu_kernels.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from foxhunt.models.cpu_kernels import define, kernel, threads, threshold, views

# the partial sums of vsn_gate_norm_sum_backward, each `hidden` wide per variable (bias: 2)
GATE_PARTS = ("gamma", "beta", "R0", "R1", "R2", "bias")


def given(t: Tensor) -> Tensor | None:
    """An optional tensor an op writes: None where the caller passed an empty one."""
    return t if t.numel() else None


class Gate(NamedTuple):
    """What turns a chunk's GLU matmul g [c, M, 2h] into its weighted, layer-normalised rows:
    sum_j s_j LayerNorm_j(GLU(scale g_j + bias_j) + R0_j + u_j R1_j + v_j R2_j) with the affine
    gamma_j, beta_j. bias [c, 2h]; s, u, v [c, M]; R0, R1, R2, gamma, beta [c, h]; v and R2 None
    without a resampled skip."""

    g: Tensor
    bias: Tensor
    scale: float
    s: Tensor
    u: Tensor
    v: Tensor | None
    R0: Tensor
    R1: Tensor
    R2: Tensor | None
    gamma: Tensor
    beta: Tensor


define("vsn_elu", "(Tensor x, Tensor A, Tensor C) -> Tensor")


@torch.library.register_fake("foxhunt::vsn_elu")
def _elu_out(x: Tensor, A: Tensor, C: Tensor) -> Tensor:
    return x.new_empty(*x.shape, A.shape[-1])


@torch.library.impl("foxhunt::vsn_elu", "cpu")
def _elu(x: Tensor, A: Tensor, C: Tensor) -> Tensor:
    a = _elu_out(x, A, C)
    kernel("vsn_elu")(*a.shape, *views(x, A, C, a), threads())
    return a


def elu(x: Tensor, A: Tensor, C: Tensor) -> Tensor:
    """ELU(x A + C) per variable: x [c, M], A and C [c, dh] -> [c, M, dh]."""
    return torch.ops.foxhunt.vsn_elu(x, A, C)


define(
    "vsn_bias_dropout",
    "(Tensor(a!) f, Tensor? bias, int first, Tensor seed, float p, float scale, bool sums)"
    " -> Tensor",
)


@torch.library.register_fake("foxhunt::vsn_bias_dropout")
def _bias_dropout_sums(
    f: Tensor, bias: Tensor | None, first: int, seed: Tensor, p: float, scale: float, sums: bool
) -> Tensor:
    c, _, dh = f.shape
    return f.new_empty(threads(), c, dh) if sums else f.new_empty(0)


@torch.library.impl("foxhunt::vsn_bias_dropout", "cpu")
def _bias_dropout(
    f: Tensor, bias: Tensor | None, first: int, seed: Tensor, p: float, scale: float, sums: bool
) -> Tensor:
    out = _bias_dropout_sums(f, bias, first, seed, p, scale, sums)
    b, f_, o = views(bias, f, out if sums else None)
    kernel("vsn_bias_dropout")(*f.shape, first, int(seed), threshold(p), scale, b, f_, o, threads())
    return out


def bias_dropout(
    f: Tensor,
    bias: Tensor | None,
    first: int,
    seed: Tensor,
    p: float,
    scale: float = 1.0,
    column_sums: bool = False,
) -> Tensor | None:
    """f [c, M, dh] = (f + bias) * keep * scale in place, the dropout mask of variables
    first..first+c-1 drawn from `seed` (the same elements in forward and backward; p = 0: none
    dropped). With `column_sums`, also returns the result's sums over the rows [c, dh]."""
    sums = torch.ops.foxhunt.vsn_bias_dropout(f, bias, first, seed, p, scale, column_sums)
    return sums.sum(0) if column_sums else None


GATE = "Tensor bias, float scale, Tensor s, Tensor u, Tensor? v, Tensor R0, Tensor R1, "
GATE += "Tensor? R2, Tensor gamma, Tensor beta"
define("vsn_gate_norm_sum", f"(Tensor g, {GATE}, Tensor(a!) out) -> ()")


@torch.library.register_fake("foxhunt::vsn_gate_norm_sum")
def _gate_norm_sum_fake(*args: Tensor | float | None) -> None:
    return None


@torch.library.impl("foxhunt::vsn_gate_norm_sum", "cpu")
def _gate_norm_sum(g: Tensor, bias: Tensor, scale: float, *rest: Tensor | None) -> None:
    c, M, h2 = g.shape
    kernel("vsn_gate_norm_sum")(c, M, h2 // 2, *views(g, bias), scale, *views(*rest), threads())


def gate_norm_sum(gate: Gate, out: Tensor) -> None:
    """out [M, h] += the chunk's weighted, layer-normalised rows (`Gate`)."""
    torch.ops.foxhunt.vsn_gate_norm_sum(*gate, out)


define(
    "vsn_gate_norm_sum_backward",
    f"(Tensor g, {GATE}, Tensor d_out, Tensor(a!) d_s, Tensor(b!) d_u, Tensor(c!)? d_v) "
    "-> (Tensor, Tensor)",
)


@torch.library.register_fake("foxhunt::vsn_gate_norm_sum_backward")
def _gate_backward_out(g: Tensor, *rest: Tensor | float | None) -> tuple[Tensor, Tensor]:
    c, _, h2 = g.shape
    return torch.empty_like(g), g.new_empty(threads(), c, (len(GATE_PARTS) + 1) * h2 // 2)


@torch.library.impl("foxhunt::vsn_gate_norm_sum_backward", "cpu")
def _gate_backward(g: Tensor, bias: Tensor, scale: float, *rest: Tensor | None) -> tuple:
    d_g, part = _gate_backward_out(g)
    *gate, d_out, d_s, d_u, d_v = rest
    c, M, h2 = g.shape
    kernel("vsn_gate_norm_sum_backward")(
        c,
        M,
        h2 // 2,
        *views(g, bias),
        scale,
        *views(*gate, d_out, d_g, d_s, d_u, d_v, part),
        threads(),
    )
    return d_g, part


def gate_norm_sum_backward(
    gate: Gate, d_out: Tensor, d_s: Tensor, d_u: Tensor, d_v: Tensor | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The backward of `gate_norm_sum`: d_g [c, M, 2h] (the gradient of scale g + bias), d_s,
    d_u and d_v filled in [c, M], and the parameters' gradients summed over the rows
    (GATE_PARTS, each [c, h]; bias [c, 2h])."""
    h = gate.gamma.shape[-1]
    d_g, parts = torch.ops.foxhunt.vsn_gate_norm_sum_backward(*gate, d_out, d_s, d_u, d_v)
    sums = parts.sum(0).split([h] * (len(GATE_PARTS) - 1) + [2 * h], dim=-1)
    return d_g, dict(zip(GATE_PARTS, sums, strict=True))


# an optional tensor that an op writes is empty where not given: inductor (torch 2.13) fails
# on an op whose every written tensor is None ("getitem is not an OpOverload")
define("vsn_elu_backward", "(Tensor x, Tensor A, Tensor a, Tensor d_a, Tensor(a!) d_x) -> Tensor")


@torch.library.register_fake("foxhunt::vsn_elu_backward")
def _elu_backward_out(x: Tensor, A: Tensor, a: Tensor, *rest: Tensor | None) -> Tensor:
    c, _, dh = a.shape
    return a.new_empty(threads(), c, 2 * dh)


@torch.library.impl("foxhunt::vsn_elu_backward", "cpu")
def _elu_backward(x: Tensor, A: Tensor, a: Tensor, d_a: Tensor, d_x: Tensor) -> Tensor:
    part = _elu_backward_out(x, A, a)
    kernel("vsn_elu_backward")(*a.shape, *views(x, A, a, d_a, given(d_x), part), threads())
    return part


def elu_backward(
    x: Tensor, A: Tensor, a: Tensor, d_a: Tensor, d_x: Tensor | None
) -> tuple[Tensor, Tensor]:
    """From d_a [c, M, dh], the gradient of a = ELU(x A + C): d_x [c, M] filled in (if given)
    and (d_A, d_C), each [c, dh]."""
    parts = torch.ops.foxhunt.vsn_elu_backward(x, A, a, d_a, x.new_empty(0) if d_x is None else d_x)
    d_A, d_C = parts.sum(0).split(a.shape[-1], dim=-1)
    return d_A, d_C


# ---- the fused selection row by row, for a small variable_dim ---------------------------

# vsn_forward: the whole fused selection's forward in one pass, its matmuls row by row (for a
# small variable_dim, where MKL's batched matmuls would write g first): sum_j s_j GRN_j(x_j)
# [M, h]. f_out [n, M, dh], when given, receives fc2's output (bias and mask applied), from
# which `backward_rows` makes the rest again.
WEIGHTS = "Tensor x, Tensor A, Tensor C, Tensor W2, Tensor b2, Tensor Wg"
define(
    "vsn_forward",
    f"({WEIGHTS}, Tensor bg, Tensor seed, float p, float scale, Tensor s, Tensor u, Tensor? v, "
    "Tensor R0, Tensor R1, Tensor? R2, Tensor gamma, Tensor beta, Tensor(a!) f_out) -> Tensor",
)


@torch.library.register_fake("foxhunt::vsn_forward")
def _forward_out(x: Tensor, *rest: Tensor | float | int | None) -> Tensor:
    gamma = rest[15]
    return x.new_zeros(x.shape[1], gamma.shape[-1])


@torch.library.impl("foxhunt::vsn_forward", "cpu")
def _forward(
    x: Tensor, A: Tensor, C: Tensor, W2: Tensor, b2: Tensor, Wg: Tensor, bg: Tensor,
    seed: Tensor, p: float, scale: float, *rest: Tensor | None,
) -> Tensor:  # fmt: skip
    out = x.new_zeros(x.shape[1], rest[6].shape[-1])  # (rest[6]: gamma)
    n, M = x.shape
    dh, h = A.shape[-1], out.shape[-1]
    *gate, f_out = rest
    kernel("vsn_forward")(
        n, M, dh, h, *views(x, A, C, W2, b2, Wg, bg), int(seed), threshold(p), scale,
        *views(*gate, out, given(f_out)), threads(),
    )  # fmt: skip
    return out


define(
    "vsn_backward_rows",
    f"({GATE}, Tensor d_out, {WEIGHTS}, Tensor? f, Tensor seed, float p, Tensor(a!) d_s, "
    "Tensor(b!) d_u, Tensor(c!)? d_v, Tensor(d!)? d_x) -> Tensor",
)


def _row_sizes(h: int, dh: int) -> list[int]:
    """The widths of `backward_rows`' partial sums per variable: GATE_PARTS', then b2, A, C, Wg
    and W2's."""
    return [h] * (len(GATE_PARTS) - 1) + [2 * h, dh, dh, dh, dh * 2 * h, dh * dh]


@torch.library.register_fake("foxhunt::vsn_backward_rows")
def _backward_rows_out(bias: Tensor, *rest: Tensor | float | int | None) -> Tensor:
    gamma, x, A = rest[7], rest[10], rest[11]
    n, dh, h = x.shape[0], A.shape[-1], gamma.shape[-1]
    return x.new_empty(threads(), n, sum(_row_sizes(h, dh)))


@torch.library.impl("foxhunt::vsn_backward_rows", "cpu")
def _backward_rows(bias: Tensor, scale: float, *rest: Tensor | float | int | None) -> Tensor:
    part = _backward_rows_out(bias, scale, *rest)
    *gate, d_out, x, A, C, W2, b2, Wg, f, seed, p, d_s, d_u, d_v, d_x = rest
    W2T, WgT = W2.transpose(1, 2).contiguous(), Wg.transpose(1, 2).contiguous()
    n, M = x.shape
    kernel("vsn_backward_rows")(
        n, M, A.shape[-1], gate[6].shape[-1], *views(bias), scale, *views(*gate, d_out),
        *views(x, A, C, W2, b2, Wg, W2T, WgT, f), int(seed), threshold(p),
        *views(d_s, d_u, d_v, d_x, part), threads(),
    )  # fmt: skip
    return part


def backward_rows(
    gate: Gate,
    d_out: Tensor,
    x: Tensor,
    A: Tensor,
    C: Tensor,
    W2: Tensor,
    b2: Tensor,
    Wg: Tensor,
    f: Tensor | None,
    seed: Tensor,
    p: float,
    d_s: Tensor,
    d_u: Tensor,
    d_v: Tensor | None,
    d_x: Tensor | None,
) -> dict[str, Tensor]:
    """The whole backward of `forward` row by row, for a small variable_dim: from f [n, M, dh]
    as `forward` kept it (None: made again from x, recompute mode) it makes g again, and goes
    back through the gate, fc2's mask and ELU, the weights' gradients added up too: no tensor of
    [n, M, 2h] is written. Fills d_s, d_u, d_v, d_x [n, M]; returns the sums over the rows of
    GATE_PARTS (bias [n, 2h]), b2, A, C ([n, dh] each), Wg [n, dh, 2h] and W2 [n, dh, dh]
    (gate.g is not read: None will do)."""
    n, h, dh = x.shape[0], gate.gamma.shape[-1], A.shape[-1]
    parts = torch.ops.foxhunt.vsn_backward_rows(
        *gate[1:], d_out, x, A, C, W2, b2, Wg, f, seed, p, d_s, d_u, d_v, d_x
    )
    names = (*GATE_PARTS, "b2", "A", "C", "Wg", "W2")
    sums = dict(zip(names, parts.sum(0).split(_row_sizes(h, dh), dim=-1), strict=True))
    sums["Wg"] = sums["Wg"].reshape(n, dh, 2 * h)
    sums["W2"] = sums["W2"].reshape(n, dh, dh)
    return sums
