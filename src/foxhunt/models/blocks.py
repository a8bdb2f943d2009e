"""Building blocks of the Temporal Fusion Transformer (Lim et al. 2021).

Parameterisation follows pytorch-forecasting's ``temporal_fusion_transformer.sub_modules`` so
that parameter counts match; the per-variable networks of the variable selection are stacked
into ``Grouped*`` modules that process all variables with one batched matmul.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import foxhunt.models.cpu_kernels as cpu_kernels
import foxhunt.models.fused_vsn as fused_vsn
from foxhunt.models.dropout import Dropout
from foxhunt.models.fused_vsn import selected_grns


def _kaiming_normal_fan_in(weight: Tensor, fan_in: int) -> None:
    # pytorch-forecasting initialises GRN fc layers with kaiming_normal_(nonlinearity="leaky_relu",
    # a=0); torch's helper would misread the fan-in of a stacked [n, in, out] tensor.
    with torch.no_grad():
        weight.normal_(0.0, math.sqrt(2.0 / fan_in))


def _xavier_uniform(weight: Tensor, fan_in: int, fan_out: int) -> None:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        weight.uniform_(-bound, bound)


def _interpolate_features(x: Tensor, size: int) -> Tensor:
    """Linearly resample the last axis of ``x`` to ``size`` points (end points kept)."""
    flat = x.reshape(-1, 1, x.shape[-1])
    out = F.interpolate(flat, size=size, mode="linear", align_corners=True)
    return out.reshape(*x.shape[:-1], size)


# --------------------------------------------------------------------------------------------
# Plain blocks (one network shared by every position)
# --------------------------------------------------------------------------------------------


class GatedLinearUnit(nn.Module):
    """GLU(γ) = σ(W4 γ + b4) ⊙ (W5 γ + b5), eq. (5), with dropout applied to its input."""

    def __init__(self, input_size: int, output_size: int, dropout: float | None) -> None:
        super().__init__()
        self.dropout = Dropout(dropout) if dropout is not None else nn.Identity()
        self.fc = nn.Linear(input_size, 2 * output_size)
        _xavier_uniform(self.fc.weight, input_size, 2 * output_size)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.glu(self.fc(self.dropout(x)), dim=-1)


class GateAddNorm(nn.Module):
    """Gate + Add & Norm of Fig. 2, LayerNorm(skip + GLU(γ)), as in the decoder (sec. 4.5)."""

    def __init__(self, input_size: int, output_size: int, dropout: float | None) -> None:
        super().__init__()
        self.glu = GatedLinearUnit(input_size, output_size, dropout)
        self.norm = nn.LayerNorm(output_size)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        h = self.norm.normalized_shape[0]
        if (
            self.norm.eps == fused_vsn.LN_EPS
            and skip.shape == (*x.shape[:-1], h)
            and skip.dtype == x.dtype
            and cpu_kernels.available(x, h)
            and not torch.is_autocast_enabled(x.device.type)
        ):
            # the GLU, the add and LayerNorm in one C pass each way; the linear as a module, so
            # that its hooks run (int8's input quantization)
            g = self.glu.fc(self.glu.dropout(x)).reshape(-1, 2 * h)
            gamma, beta = self.norm.parameters()
            out = cpu_kernels.gate_add_norm(g, skip.reshape(-1, h).contiguous(), gamma, beta)
            return out.reshape(skip.shape)
        return self.norm(self.glu(x) + skip)


class ResampleNorm(nn.Module):
    """Skip path of a GRN (eq. 2) whose input and output sizes differ (pytorch-forecasting's)."""

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.output_size = output_size
        self.resample = input_size != output_size
        self.mask = nn.Parameter(torch.zeros(output_size))
        self.norm = nn.LayerNorm(output_size)

    def forward(self, x: Tensor) -> Tensor:
        if self.resample:
            x = _interpolate_features(x, self.output_size)
        # 2 * sigmoid(0) == 1: the trainable gate starts as the identity.
        return self.norm(x * torch.sigmoid(self.mask) * 2.0)


class GatedResidualNetwork(nn.Module):
    """GRN(a, c) = LayerNorm(a + GLU(W1 ELU(W2 a + W3 c + b2) + b1)), eqs. (2)-(4)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        dropout: float = 0.1,
        context_size: int | None = None,
        residual: bool = False,
    ) -> None:
        super().__init__()
        # residual=True means the caller supplies a skip of output size, as in pytorch-forecasting.
        self.resample_norm = (
            ResampleNorm(input_size, output_size)
            if input_size != output_size and not residual
            else None
        )
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.context = (
            nn.Linear(context_size, hidden_size, bias=False) if context_size is not None else None
        )
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.gate_norm = GateAddNorm(hidden_size, output_size, dropout)

        _kaiming_normal_fan_in(self.fc1.weight, input_size)
        _kaiming_normal_fan_in(self.fc2.weight, hidden_size)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)
        if self.context is not None:
            _xavier_uniform(self.context.weight, context_size, hidden_size)

    def forward(
        self, x: Tensor, context: Tensor | None = None, residual: Tensor | None = None
    ) -> Tensor:
        """``context`` must broadcast against ``x``'s leading axes ([B, 1, c] for [B, T, i])."""
        if residual is None:
            residual = x if self.resample_norm is None else self.resample_norm(x)
        return self.head(self.fc1(x), residual, context)

    def head(self, hidden: Tensor, residual: Tensor, context: Tensor | None = None) -> Tensor:
        """Everything after fc1, for callers that compute fc1(x) and the skip their own way."""
        if context is not None:
            hidden = hidden + self.context(context)
        return self.gate_norm(self.fc2(F.elu(hidden)), residual)


# --------------------------------------------------------------------------------------------
# Grouped blocks: one independent network per variable, all evaluated at once
# --------------------------------------------------------------------------------------------


class GroupedLinear(nn.Module):
    """``n`` independent Linear(in, out) layers, one per variable of eq. (7), as one einsum."""

    def __init__(self, n: int, input_size: int, output_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, input_size, output_size))
        self.bias = nn.Parameter(torch.zeros(n, output_size))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("...ni,nio->...no", x, self.weight) + self.bias


class GroupedLayerNorm(nn.Module):
    """``n`` independent LayerNorms, one per variable of eq. (7), over the last axis."""

    def __init__(self, n: int, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n, size))
        self.bias = nn.Parameter(torch.zeros(n, size))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * self.weight + self.bias


class GroupedGatedResidualNetwork(nn.Module):
    """Per-variable GRNs ξ̃_t^(j) = GRN_ξ(j)(ξ_t^(j)) of eq. (7), stacked over the variables."""

    def __init__(
        self, n: int, input_size: int, hidden_size: int, output_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.output_size = output_size
        self.resample = input_size != output_size
        if self.resample:
            self.resample_mask = nn.Parameter(torch.zeros(n, output_size))
            self.resample_norm = GroupedLayerNorm(n, output_size)
        self.fc1 = GroupedLinear(n, input_size, hidden_size)
        self.fc2 = GroupedLinear(n, hidden_size, hidden_size)
        self.dropout = Dropout(dropout)
        self.glu = GroupedLinear(n, hidden_size, 2 * output_size)
        self.norm = GroupedLayerNorm(n, output_size)

        _kaiming_normal_fan_in(self.fc1.weight, input_size)
        _kaiming_normal_fan_in(self.fc2.weight, hidden_size)
        _xavier_uniform(self.glu.weight, hidden_size, 2 * output_size)

    def forward(self, x: Tensor) -> Tensor:
        """x: [..., n, input_size] -> [..., n, output_size]."""
        if self.resample:
            residual = _interpolate_features(x, self.output_size)
            residual = self.resample_norm(residual * torch.sigmoid(self.resample_mask) * 2.0)
        else:
            residual = x
        hidden = self.fc2(F.elu(self.fc1(x)))
        gated = F.glu(self.glu(self.dropout(hidden)), dim=-1)
        return self.norm(gated + residual)


class VariableSelectionNetwork(nn.Module):
    """Variable selection network, eqs. (6)-(8): softmax weights times per-variable GRN outputs."""

    def __init__(
        self,
        n_vars: int,
        variable_dim: int,
        hidden_size: int,
        dropout: float,
        context_size: int | None = None,
    ) -> None:
        super().__init__()
        self.recompute = False  # forward_scalars keeps no per-variable activations (fused_vsn)
        if n_vars < 1:
            raise ValueError("a variable selection network needs at least one variable")
        self.n_vars = n_vars
        self.single_variable_grns = GroupedGatedResidualNetwork(
            n_vars, variable_dim, min(variable_dim, hidden_size), hidden_size, dropout
        )
        # With one variable there is nothing to select; pytorch-forecasting builds no weight net.
        self.flattened_grn = (
            GatedResidualNetwork(
                n_vars * variable_dim,
                min(hidden_size, n_vars),
                n_vars,
                dropout,
                context_size,
            )
            if n_vars > 1
            else None
        )
        if n_vars > 1:
            # Where F.interpolate(linear, align_corners=True) samples the flattened embedding of
            # n_vars * variable_dim values at n_vars points: two neighbours and a weight each.
            position = torch.linspace(0, n_vars * variable_dim - 1, n_vars, dtype=torch.float64)
            lo = position.floor().long().clamp(max=n_vars * variable_dim - 2)
            self.register_buffer("resample_lo", lo, persistent=False)
            self.register_buffer("resample_frac", (position - lo).float(), persistent=False)
            # which variable each neighbour belongs to, one-hot [variable, point]
            points = torch.arange(n_vars)
            for name, index in (("resample_from_lo", lo), ("resample_from_hi", lo + 1)):
                onehot = torch.zeros(n_vars, n_vars)
                onehot[index // variable_dim, points] = 1.0
                self.register_buffer(name, onehot, persistent=False)

    def forward_scalars(
        self, x: Tensor, prescaler: tuple[Tensor, Tensor], context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The same as ``forward(x[..., None] * w + b)`` for continuous inputs, faster and leaner.

        x: [..., n_vars] scalars; prescaler: their embedding (w, b), each [n_vars, variable_dim].
        Every layer that meets the embedding is folded into it (see ``fused_vsn``), so no
        [..., n_vars, variable_dim] tensor is built."""
        w, b = prescaler
        weights = self._selection_weights_from_scalars(x, w, b, context)
        grns = self.single_variable_grns
        W1, b1 = grns.fc1.weight, grns.fc1.bias
        if grns.resample:
            gate = torch.sigmoid(grns.resample_mask) * 2.0
            P = _interpolate_features(w, grns.output_size) * gate
            Q = _interpolate_features(b, grns.output_size) * gate
            skip_norm = (grns.resample_norm.weight, grns.resample_norm.bias)
        else:
            P, Q, skip_norm = w, b, None
        output = selected_grns(
            x,
            weights,
            torch.einsum("nd,ndk->nk", w, W1),
            torch.einsum("nd,ndk->nk", b, W1) + b1,
            grns.fc2.weight,
            grns.fc2.bias,
            grns.glu.weight,
            grns.glu.bias,
            P,
            Q,
            skip_norm,
            (grns.norm.weight, grns.norm.bias),
            grns.dropout.p if self.training else 0.0,
            self.recompute,
        )
        return output, weights

    def _selection_weights_from_scalars(
        self, x: Tensor, w: Tensor, b: Tensor, context: Tensor | None
    ) -> Tensor:
        if self.flattened_grn is None:
            return x.new_ones(x.shape)
        grn = self.flattened_grn
        n, d = w.shape
        # fc1 of the flattened embedding [x_1 w_1 + b_1, ..., x_n w_n + b_n] is x A + c
        W1 = grn.fc1.weight.view(-1, n, d)
        A = torch.einsum("nd,knd->nk", w, W1)
        c = torch.einsum("nd,knd->k", b, W1) + grn.fc1.bias
        # its skip, the flattened embedding linearly resampled to n points from two neighbours
        # each and gated by sigmoid(mask) * 2, is x R + r (a matmul instead of ten elementwise
        # passes; in float32 under bf16 autocast, as the elementwise passes ran)
        lo, hi, frac = self.resample_lo, self.resample_lo + 1, self.resample_frac
        w_flat, b_flat = w.reshape(-1), b.reshape(-1)
        gate = torch.sigmoid(grn.resample_norm.mask) * 2.0
        R = (self.resample_from_lo * ((1 - frac) * w_flat[lo] * gate)) + (
            self.resample_from_hi * (frac * w_flat[hi] * gate)
        )
        r = ((1 - frac) * b_flat[lo] + frac * b_flat[hi]) * gate
        with torch.autocast(x.device.type, enabled=False):
            resampled = F.linear(x.to(R.dtype), R.t(), r)
        residual = grn.resample_norm.norm(resampled)
        hidden = F.linear(x, A.t(), c)
        return torch.softmax(grn.head(hidden, residual, context), dim=-1)

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: [..., n_vars, variable_dim] -> (output [..., hidden], weights [..., n_vars])."""
        var_outputs = self.single_variable_grns(x)
        if self.flattened_grn is None:
            weights = x.new_ones(x.shape[:-1])
            return var_outputs[..., 0, :], weights
        weights = torch.softmax(self.flattened_grn(x.flatten(-2), context), dim=-1)
        output = torch.einsum("...n,...nh->...h", weights, var_outputs)
        return output, weights


class VariablePrescaler(nn.Module):
    """Per-variable Linear(1, variable_dim) embedding of continuous inputs ξ_t^(j) (sec. 4.2)."""

    def __init__(self, n: int, variable_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, variable_dim))
        self.bias = nn.Parameter(torch.empty(n, variable_dim))
        # Same distribution as nn.Linear(1, d)'s default init, which pytorch-forecasting keeps.
        nn.init.uniform_(self.weight, -1.0, 1.0)
        nn.init.uniform_(self.bias, -1.0, 1.0)

    def forward(self, x: Tensor, first: int = 0) -> Tensor:
        """x: [..., k] scalars of variables first..first+k-1 -> [..., k, variable_dim]."""
        k = x.shape[-1]
        return x.unsqueeze(-1) * self.weight[first : first + k] + self.bias[first : first + k]


class InterpretableMultiHeadAttention(nn.Module):
    """Interpretable multi-head attention (sec. 4.4): per-head Q/K, one shared V, heads averaged."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.d_k = hidden_size // num_heads
        self.q_layer = nn.Linear(hidden_size, num_heads * self.d_k)
        self.k_layer = nn.Linear(hidden_size, num_heads * self.d_k)
        self.v_layer = nn.Linear(hidden_size, self.d_k)
        self.w_h = nn.Linear(self.d_k, hidden_size, bias=False)
        self.dropout = Dropout(dropout)

        # Xavier per head, as pytorch-forecasting's separate per-head layers are initialised.
        for layer in (self.q_layer, self.k_layer):
            for head in range(num_heads):
                rows = slice(head * self.d_k, (head + 1) * self.d_k)
                _xavier_uniform(layer.weight[rows], hidden_size, self.d_k)
        _xavier_uniform(self.v_layer.weight, hidden_size, self.d_k)
        _xavier_uniform(self.w_h.weight, self.d_k, hidden_size)
        nn.init.zeros_(self.q_layer.bias)
        nn.init.zeros_(self.k_layer.bias)
        nn.init.zeros_(self.v_layer.bias)

    def forward(
        self, q: Tensor, kv: Tensor, allowed: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """q: [B, Lq, h], kv: [B, Lk, h], allowed: bool [Lq, Lk] (True = may attend).

        Returns the output [B, Lq, h] and, if requested, the head-averaged attention [B, Lq, Lk].
        """
        batch, len_q, _ = q.shape
        len_k = kv.shape[1]
        queries = self.q_layer(q).view(batch, len_q, self.num_heads, self.d_k).transpose(1, 2)
        keys = self.k_layer(kv).view(batch, len_k, self.num_heads, self.d_k).transpose(1, 2)
        # The value projection is shared by all heads, which makes the mean attention meaningful.
        values = self.v_layer(kv).unsqueeze(1).expand(-1, self.num_heads, -1, -1)

        if need_weights:
            scores = queries @ keys.transpose(-2, -1) / math.sqrt(self.d_k)
            attention = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            heads = attention @ values
            mean_attention = attention.mean(dim=1)
        else:
            heads = F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed)
            mean_attention = None

        # pytorch-forecasting drops out each head's output (not the attention probabilities).
        output = self.dropout(heads).mean(dim=1)
        return self.dropout(self.w_h(output)), mean_attention


class Highway(nn.Module):
    """A linear forecast added to the quantile outputs: of the encoder's last row of inputs, one
    weight per horizon step and quantile, plus of each decoder step's known inputs, one weight
    per quantile (LSTNet's autoregressive highway, Lai et al. 2018); num_quantiles=1: one
    forecast for every quantile (after the monotone head). Starts at zero."""

    def __init__(self, num_inputs: int, num_known: int, horizon: int, num_quantiles: int) -> None:
        super().__init__()
        self.horizon = horizon
        self.last_row = nn.Linear(num_inputs, horizon * num_quantiles)
        self.known = nn.Linear(num_known, num_quantiles, bias=False) if num_known else None
        for layer in (self.last_row, self.known):
            if layer is not None:
                nn.init.zeros_(layer.weight)
        nn.init.zeros_(self.last_row.bias)

    def forward(self, last_row: Tensor, decoder_known: Tensor) -> Tensor:
        """last_row [B, inputs], decoder_known [B, H, known] -> [B, H, num_quantiles]."""
        out = self.last_row(last_row).unflatten(-1, (self.horizon, -1))  # no fixed batch
        return out if self.known is None else out + self.known(decoder_known)


class MonotoneQuantiles(nn.Module):
    """Quantile outputs that cannot cross, for any weights: the head's value at the median
    level (the one nearest 0.5) is the median, and each level further out is the one before it
    plus (below: minus) the softplus of the head's own value there, a gap >= 0 (not in Lim et
    al., whose independent heads cross; the model's crossing rate before this is measured in
    docs/evaluation.md). Softplus(0) = 0.69 normalized units apart at initialisation."""

    def __init__(self, num_quantiles: int, median: int) -> None:
        super().__init__()
        self.num_quantiles, self.median = num_quantiles, median

    def forward(self, x: Tensor) -> Tensor:
        """[..., Q] the head's values -> [..., Q] quantiles in increasing order."""
        if self.num_quantiles == 1:
            return x
        m = self.median
        mid = x[..., m : m + 1]
        gaps = F.softplus(x)
        below = mid - gaps[..., :m].flip(-1).cumsum(-1).flip(-1)
        above = mid + gaps[..., m + 1 :].cumsum(-1)
        return torch.cat([below, mid, above], dim=-1)
