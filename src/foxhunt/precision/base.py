"""What a precision decides. The defaults are those of float training; each precision overrides
where it differs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch

from foxhunt.models import TemporalFusionTransformer
from foxhunt.run.dir import RunDir


@dataclass(frozen=True)
class BestModel:
    """A run's best model and what its export carries, for its precision's `export`: `init`
    its constructor arguments, `schema` the data schema's dict, `calibration` its
    `Calibration.to_dict()`; int8 scores its export on `test_batches` beside `test_loss`."""

    model: TemporalFusionTransformer
    init: dict[str, Any]
    schema: dict[str, Any]
    run: RunDir
    test_batches: Iterable[dict[str, torch.Tensor]]
    quantiles: torch.Tensor
    test_loss: float
    calibration: dict[str, Any] | None = None


class Precision:
    """A precision with its config group's settings (`conf/precision/<name>.yaml`)."""

    name: ClassVar[str]
    # a checkpoint resumes (or initializes a run) only into its own family: its weights are
    # float ones, or fake-quantized ones with observers
    family: ClassVar[str] = "float"
    # the precision a loaded checkpoint predicts (and is planned) in
    predicts_as: ClassVar[str] = "fp32"

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)
        self.trainer_precision: str = self.settings.get("trainer_precision", "32-true")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings})"

    def same_family(self, other: Precision) -> bool:
        return self.family == other.family

    def check_device(self, device: torch.device) -> None:
        """Refuse, in one ConfigError line, a device this precision cannot train on."""

    def callbacks(self) -> list[L.Callback]:
        """The Trainer callbacks the precision needs."""
        return []

    def prepare_model(
        self, model: TemporalFusionTransformer, traced: bool = False
    ) -> TemporalFusionTransformer:
        """The model made ready to train in this precision, in place (`traced`: for a
        FakeTensorMode memory trace)."""
        return model

    def for_inference(self, model: TemporalFusionTransformer) -> TemporalFusionTransformer:
        """A trained model set to forecast as its test split was scored, in place."""
        return model

    def autocast(self, device_type: str) -> AbstractContextManager:
        """The forward context of the Trainer's precision (what a memory trace runs under)."""
        return nullcontext()

    def memory_note(self, device: str) -> str:
        """How the memory estimate of a step on `device` treats the precision."""
        return f"precision {self.name}"

    def onnx_refusal(self, source: Path) -> str | None:
        """Why a checkpoint of this precision cannot be exported to ONNX as it is (None: it can)."""
        return None

    def export(self, best: BestModel) -> dict[str, Any]:
        """Export the best model into its run (`BestModel`); summary.json's entries about it."""
        raise NotImplementedError
