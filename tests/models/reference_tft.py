"""Per-variable reference variable selection network, written the obvious (looping) way.

Used only by tests to check the grouped implementation in ``foxhunt.models.blocks``; it follows
pytorch-forecasting's sub_modules: one GatedResidualNetwork module per variable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from foxhunt.models.blocks import VariableSelectionNetwork


class RefResampleNorm(nn.Module):
    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.mask = nn.Parameter(torch.zeros(output_size))
        self.norm = nn.LayerNorm(output_size)

    def forward(self, x: Tensor) -> Tensor:
        if self.input_size != self.output_size:
            shape = x.shape
            x = F.interpolate(
                x.reshape(-1, 1, shape[-1]), self.output_size, mode="linear", align_corners=True
            ).reshape(*shape[:-1], self.output_size)
        return self.norm(x * torch.sigmoid(self.mask) * 2.0)


class RefGRN(nn.Module):
    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        dropout: float,
        context_size: int | None = None,
    ) -> None:
        super().__init__()
        self.resample_norm = (
            RefResampleNorm(input_size, output_size) if input_size != output_size else None
        )
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.context = (
            nn.Linear(context_size, hidden_size, bias=False) if context_size is not None else None
        )
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.glu = nn.Linear(hidden_size, 2 * output_size)
        self.norm = nn.LayerNorm(output_size)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        residual = x if self.resample_norm is None else self.resample_norm(x)
        hidden = self.fc1(x)
        if context is not None:
            hidden = hidden + self.context(context)
        hidden = self.fc2(F.elu(hidden))
        gated = F.glu(self.glu(self.dropout(hidden)), dim=-1)
        return self.norm(gated + residual)


class RefVariableSelectionNetwork(nn.Module):
    def __init__(
        self,
        n_vars: int,
        variable_dim: int,
        hidden_size: int,
        dropout: float,
        context_size: int | None = None,
    ) -> None:
        super().__init__()
        self.n_vars = n_vars
        self.single_variable_grns = nn.ModuleList(
            RefGRN(variable_dim, min(variable_dim, hidden_size), hidden_size, dropout)
            for _ in range(n_vars)
        )
        self.flattened_grn = (
            RefGRN(n_vars * variable_dim, min(hidden_size, n_vars), n_vars, dropout, context_size)
            if n_vars > 1
            else None
        )

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        outputs = torch.stack(
            [grn(x[..., i, :]) for i, grn in enumerate(self.single_variable_grns)], dim=-2
        )
        if self.flattened_grn is None:
            return outputs[..., 0, :], torch.ones_like(outputs[..., 0])
        flat = x.reshape(*x.shape[:-2], -1)
        weights = torch.softmax(self.flattened_grn(flat, context), dim=-1)
        return (outputs * weights.unsqueeze(-1)).sum(dim=-2), weights


Layout = Callable[[Tensor], Tensor]


def parameter_pairs(
    ref: RefVariableSelectionNetwork, vsn: VariableSelectionNetwork
) -> list[tuple[str, Tensor, Tensor, Layout]]:
    """(name, reference parameter, grouped parameter, grouped -> reference layout) for all weights.

    The layout function maps both a grouped parameter and its gradient to the reference's shape.
    """
    pairs: list[tuple[str, Tensor, Tensor, Layout]] = []
    grouped = vsn.single_variable_grns
    for i, grn in enumerate(ref.single_variable_grns):

        def row(t: Tensor, i: int = i) -> Tensor:
            return t[i]

        def linear(t: Tensor, i: int = i) -> Tensor:
            # Grouped weights are stored [n, in, out]; nn.Linear stores [out, in].
            return t[i].T

        pairs += [
            (f"var{i}.fc1.weight", grn.fc1.weight, grouped.fc1.weight, linear),
            (f"var{i}.fc1.bias", grn.fc1.bias, grouped.fc1.bias, row),
            (f"var{i}.fc2.weight", grn.fc2.weight, grouped.fc2.weight, linear),
            (f"var{i}.fc2.bias", grn.fc2.bias, grouped.fc2.bias, row),
            (f"var{i}.glu.weight", grn.glu.weight, grouped.glu.weight, linear),
            (f"var{i}.glu.bias", grn.glu.bias, grouped.glu.bias, row),
            (f"var{i}.norm.weight", grn.norm.weight, grouped.norm.weight, row),
            (f"var{i}.norm.bias", grn.norm.bias, grouped.norm.bias, row),
        ]
        if grouped.resample:
            resample = grn.resample_norm
            pairs += [
                (f"var{i}.mask", resample.mask, grouped.resample_mask, row),
                (f"var{i}.rnorm.weight", resample.norm.weight, grouped.resample_norm.weight, row),
                (f"var{i}.rnorm.bias", resample.norm.bias, grouped.resample_norm.bias, row),
            ]

    flat, src = ref.flattened_grn, vsn.flattened_grn
    if src is not None:

        def same(t: Tensor) -> Tensor:
            return t

        pairs += [
            ("flat.fc1.weight", flat.fc1.weight, src.fc1.weight, same),
            ("flat.fc1.bias", flat.fc1.bias, src.fc1.bias, same),
            ("flat.fc2.weight", flat.fc2.weight, src.fc2.weight, same),
            ("flat.fc2.bias", flat.fc2.bias, src.fc2.bias, same),
            ("flat.glu.weight", flat.glu.weight, src.gate_norm.glu.fc.weight, same),
            ("flat.glu.bias", flat.glu.bias, src.gate_norm.glu.fc.bias, same),
            ("flat.norm.weight", flat.norm.weight, src.gate_norm.norm.weight, same),
            ("flat.norm.bias", flat.norm.bias, src.gate_norm.norm.bias, same),
        ]
        if src.context is not None:
            pairs.append(("flat.context.weight", flat.context.weight, src.context.weight, same))
        if src.resample_norm is not None:
            r, s = flat.resample_norm, src.resample_norm
            pairs += [
                ("flat.mask", r.mask, s.mask, same),
                ("flat.rnorm.weight", r.norm.weight, s.norm.weight, same),
                ("flat.rnorm.bias", r.norm.bias, s.norm.bias, same),
            ]
    return pairs


def load_from_grouped(ref: RefVariableSelectionNetwork, vsn: VariableSelectionNetwork) -> None:
    """Copy the grouped VSN's weights into the reference, variable by variable."""
    pairs = parameter_pairs(ref, vsn)
    # Every reference parameter must be covered, or the comparison would be vacuous.
    assert {id(p) for _, p, _, _ in pairs} == {id(p) for p in ref.parameters()}
    assert {id(p) for _, _, p, _ in pairs} == {id(p) for p in vsn.parameters()}
    with torch.no_grad():
        for _, ref_param, grouped_param, layout in pairs:
            ref_param.copy_(layout(grouped_param))
