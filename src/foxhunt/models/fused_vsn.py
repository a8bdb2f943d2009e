"""The per-variable GRNs of a variable selection network (eq. 7) and their weighted sum (eq. 8),
fused, for continuous inputs, with a hand-written backward.

Why not plain autograd: it keeps about eight [rows, variables, hidden] tensors per network for
backward (fc1, ELU, fc2, GLU, add and LayerNorm outputs); with tft_base's 225 variables each of
them is about a gigabyte. This keeps two (the fc2 output and the GLU pre-activation), recomputes
the elementwise parts in backward, and processes the variables in chunks, so the [rows, variables,
hidden] intermediates exist only a chunk at a time. It also skips the fc1 matmul: a continuous
variable's embedding is the scalar x times a vector w plus b, so fc1(x w + b) = x (w W1) +
(b W1 + b1), an elementwise affine map (the caller folds w, b and W1 into A and C).

Per variable j (rows m): h1 = x A_j + C_j; a = ELU(h1); f = dropout(a W2_j + b2_j);
g = f Wg_j + bg_j; z = GLU(g) + r_j(x); y = LayerNorm_j(z); out_m = sum_j s_mj y_mj,
where the skip r_j(x) = x P_j + Q_j, layer-normalised when the caller resampled it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# Elements per intermediate tensor of one chunk: large enough for efficient matmuls, small
# enough that a chunk's temporaries stay in the tens of megabytes.
CHUNK_ELEMENTS = 8 * 1024 * 1024
LN_EPS = 1e-5


def _chunks(n: int, per_variable: int) -> list[slice]:
    size = max(1, CHUNK_ELEMENTS // max(per_variable, 1))
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _rows(c: slice, *tensors: Tensor | None) -> list[Tensor | None]:
    return [None if t is None else t[c] for t in tensors]


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


def _skip(xc: Tensor, P: Tensor, Q: Tensor, gamma: Tensor | None, beta: Tensor | None):
    """The skip x P + Q of a chunk, layer-normalised when gamma is given.

    Returns (r, pre-norm skip, mean, 1/std); the last three are None without the norm."""
    pre = torch.addcmul(Q.unsqueeze(1), xc, P.unsqueeze(1))
    if gamma is None:
        return pre, None, None, None
    xhat, mean, rstd = _normalize(pre)
    return _affine(xhat, gamma, beta), pre, mean, rstd


class _SelectedGRNs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,  # [n, M] scalar inputs
        s: Tensor,  # [n, M] selection weights
        A: Tensor,  # [n, dh]
        C: Tensor,  # [n, dh]
        W2: Tensor,  # [n, dh, dh]
        b2: Tensor,  # [n, dh]
        Wg: Tensor,  # [n, dh, 2h]
        bg: Tensor,  # [n, 2h]
        P: Tensor,  # [n, h]
        Q: Tensor,  # [n, h]
        skip_gamma: Tensor | None,  # [n, h] when the skip is layer-normalised
        skip_beta: Tensor | None,
        gamma: Tensor,  # [n, h]
        beta: Tensor,
        dropout: float,
        save: bool,
    ) -> Tensor:
        n, rows = x.shape
        dh, h = W2.shape[-1], gamma.shape[-1]
        # dropout(f) Wg == (f * keep) (Wg / (1 - p)): the scale rides on the matmul for free
        scale = 1.0 / (1.0 - dropout)
        out = x.new_zeros(rows, h)
        f_all = x.new_empty(n, rows, dh) if save else None
        g_all = x.new_empty(n, rows, 2 * h) if save else None
        keep_all = x.new_empty(n, rows, dh, dtype=torch.bool) if save and dropout else None
        for c in _chunks(n, rows * 2 * h):
            xc = x[c].unsqueeze(-1)
            a = F.elu(torch.addcmul(C[c].unsqueeze(1), xc, A[c].unsqueeze(1)))
            f = torch.baddbmm(b2[c].unsqueeze(1), a, W2[c], out=None if f_all is None else f_all[c])
            if dropout:
                keep = torch.empty_like(f, dtype=torch.bool).bernoulli_(1.0 - dropout)
                f.mul_(keep)
                if keep_all is not None:
                    keep_all[c] = keep
            g = torch.baddbmm(
                bg[c].unsqueeze(1), f, Wg[c], alpha=scale, out=None if g_all is None else g_all[c]
            )
            r = _skip(xc, P[c], Q[c], *_rows(c, skip_gamma, skip_beta))[0]
            y = _affine(_normalize(F.glu(g, dim=-1).add_(r))[0], gamma[c], beta[c])
            out += y.mul_(s[c].unsqueeze(-1)).sum(0)  # (an einsum would copy y to [M, c, h])
        if save:
            ctx.save_for_backward(
                x,
                s,
                A,
                C,
                W2,
                Wg,
                P,
                Q,
                skip_gamma,
                skip_beta,
                gamma,
                beta,
                f_all,
                g_all,
                keep_all,
            )
            ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        (x, s, A, C, W2, Wg, P, Q, skip_gamma, skip_beta, gamma, beta, f_all, g_all, keep_all) = (
            ctx.saved_tensors
        )
        n, rows = x.shape
        h = gamma.shape[-1]
        zeros = {
            name: None if t is None else torch.zeros_like(t)
            for name, t in (
                ("A", A),
                ("C", C),
                ("W2", W2),
                ("Wg", Wg),
                ("P", P),
                ("Q", Q),
                ("skip_gamma", skip_gamma),
                ("skip_beta", skip_beta),
                ("gamma", gamma),
                ("beta", beta),
            )
        }
        grads = zeros
        d_x = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        d_s = torch.empty_like(s)
        d_b2 = x.new_empty(W2.shape[0], W2.shape[-1])
        d_bg = x.new_empty(Wg.shape[0], Wg.shape[-1])
        for c in _chunks(n, rows * 2 * h):
            xc = x[c].unsqueeze(-1)
            g = g_all[c]
            r, skip_pre, skip_mean, skip_rstd = _skip(
                xc, P[c], Q[c], *_rows(c, skip_gamma, skip_beta)
            )
            z = F.glu(g, dim=-1).add_(r)
            xhat, mean, rstd = _normalize(z)

            # the weighted sum and the output LayerNorm
            d_s[c] = (_affine(xhat, gamma[c], beta[c]) * d_out).sum(-1)
            d_y = s[c].unsqueeze(-1) * d_out
            grads["gamma"][c] = (d_y * xhat).sum(1)
            grads["beta"][c] = d_y.sum(1)
            d_z = _normalize_backward(d_y.mul_(gamma[c].unsqueeze(1)), z, mean, rstd)
            del d_y, xhat, z

            # the skip x P + Q, normalised or not
            d_pre = d_z
            if skip_gamma is not None:
                skip_xhat = (skip_pre - skip_mean) * skip_rstd
                grads["skip_gamma"][c] = (d_z * skip_xhat).sum(1)
                grads["skip_beta"][c] = d_z.sum(1)
                d_pre = _normalize_backward(
                    d_z * skip_gamma[c].unsqueeze(1), skip_pre, skip_mean, skip_rstd
                )
            grads["P"][c] = (d_pre * xc).sum(1)
            grads["Q"][c] = d_pre.sum(1)
            if d_x is not None:
                d_x[c] = (d_pre * P[c].unsqueeze(1)).sum(-1)

            # GLU and its projection
            d_g = torch.ops.aten.glu_backward(d_z, g, -1)
            del d_z, d_pre
            f = f_all[c]
            torch.bmm(f.transpose(1, 2), d_g, out=grads["Wg"][c]).mul_(ctx.scale)
            d_bg[c] = d_g.sum(1)
            d_f = torch.bmm(d_g, Wg[c].transpose(1, 2)).mul_(ctx.scale)
            del d_g
            if keep_all is not None:
                d_f.mul_(keep_all[c])

            # fc2, ELU and the folded fc1, recomputed from x
            h1 = torch.addcmul(C[c].unsqueeze(1), xc, A[c].unsqueeze(1))
            a = F.elu(h1)
            torch.bmm(a.transpose(1, 2), d_f, out=grads["W2"][c])
            d_b2[c] = d_f.sum(1)
            d_h1 = torch.ops.aten.elu_backward(
                torch.bmm(d_f, W2[c].transpose(1, 2)), 1.0, 1.0, 1.0, True, a
            )
            grads["A"][c] = (d_h1 * xc).sum(1)
            grads["C"][c] = d_h1.sum(1)
            if d_x is not None:
                d_x[c] += (d_h1 * A[c].unsqueeze(1)).sum(-1)

        return (
            d_x,
            d_s,
            grads["A"],
            grads["C"],
            grads["W2"],
            d_b2,
            grads["Wg"],
            d_bg,
            grads["P"],
            grads["Q"],
            grads["skip_gamma"],
            grads["skip_beta"],
            grads["gamma"],
            grads["beta"],
            None,
            None,
        )


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
) -> Tensor:
    """sum_j s[..., j] * GRN_j(x[..., j]) for scalar inputs x, s: [..., n] -> [..., h]."""
    lead = x.shape[:-1]
    n = x.shape[-1]
    xt = x.reshape(-1, n).t().contiguous()
    st = s.reshape(-1, n).t().contiguous()
    tensors = (xt, st, A, C, W2, b2, Wg, bg, P, Q, *(skip_norm or (None, None)), *norm)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    out = _SelectedGRNs.apply(*tensors, dropout, save)
    return out.reshape(*lead, out.shape[-1])
