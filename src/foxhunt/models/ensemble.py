"""model.ensemble=k: k TFTs trained side by side, forecasting as one model.

Each member is initialized from the run's seeded random stream after the one before it, draws
its own dropout, and learns from its own loss on the same batches (`foxhunt.training.step`
sums the members' losses and clips each member's gradient alone), as if trained by itself:
training on the loss of their mean instead would let the members collude into one wider model
(Jeffares et al., "Joint training of deep ensembles fails due to learner collusion", 2023).
The ensemble forecasts the mean of its members' quantiles (in order when each member's are), so
validation, early stopping, calibration, the checkpoint, the exports and the ONNX graph see one
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from foxhunt.models.tft import UNSAVED_DEFAULTS, TemporalFusionTransformer

MEMBERS = "members"  # the key of the constructor arguments (`build`) that says k


class Ensemble(nn.Module):
    """k TFTs of one architecture; forward: the mean of their quantile forecasts."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: Mapping[str, Tensor]) -> Tensor:
        """Quantile predictions [B, H, Q]: the members' mean."""
        return torch.stack([m(x) for m in self.members]).mean(0)

    def interpret(self, x: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """`TemporalFusionTransformer.interpret`'s keys, each the members' mean (their mean
        weights still sum to one)."""
        parts = [m.interpret(x) for m in self.members]
        return {k: torch.stack([p[k] for p in parts]).mean(0) for k in parts[0]}

    @property
    def instrument_rows(self) -> int:
        return self.members[0].instrument_rows

    @property
    def gradient_checkpointing(self) -> bool:
        return self.members[0].gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, on: bool) -> None:
        for m in self.members:
            m.gradient_checkpointing = on

    def num_parameters(self) -> int:
        return sum(m.num_parameters() for m in self.members)


def members_of(model: nn.Module) -> Sequence[nn.Module]:
    """The models trained each on its own loss: an ensemble's members, or the model alone."""
    return model.members if isinstance(model, Ensemble) else (model,)


def build(init: Mapping[str, Any]) -> nn.Module:
    """The TFT of constructor arguments `init` (`foxhunt.training.module.model_init`'s, an
    export's), or an Ensemble of `init[MEMBERS]` of them; the keys an export made before them
    lacks as it was built."""
    args = {**UNSAVED_DEFAULTS, **init}
    k = int(args.pop(MEMBERS, 1))
    if k == 1:
        return TemporalFusionTransformer(**args)
    return Ensemble([TemporalFusionTransformer(**args) for _ in range(k)])
