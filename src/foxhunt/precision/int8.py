"""precision=int8: quantization-aware training (fake-quantized weights and activations, fp32
master weights), then the int8 export, scored on the test split beside the fake-quant model."""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L

from foxhunt.errors import ConfigError
from foxhunt.models import TemporalFusionTransformer
from foxhunt.models.tft import UNSAVED_DEFAULTS
from foxhunt.precision.base import BestModel, Precision
from foxhunt.precision.fp32 import export_weights
from foxhunt.quantization.qat import prepare_qat, set_qat_phase
from foxhunt.quantization.schedule import QATSchedule
from foxhunt.quantization.score import export_and_score_int8


class Int8(Precision):
    name = "int8"
    family = "int8"
    predicts_as = "int8"

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.backend: str = self.settings.get("backend", "torch.ao")
        self.qat_start_epoch: int = self.settings.get("qat_start_epoch", 0)
        self.observer_epochs: int = self.settings.get("observer_epochs", 1)
        if self.backend == "torchao" and importlib.util.find_spec("torchao") is None:
            raise ConfigError("precision.backend=torchao needs torchao: pip install torchao")
        if self.qat_start_epoch < 0:
            raise ConfigError(f"precision.qat_start_epoch must be >= 0, got {self.qat_start_epoch}")
        if self.observer_epochs < 1:
            raise ConfigError(f"precision.observer_epochs must be >= 1, got {self.observer_epochs}")

    def callbacks(self) -> list[L.Callback]:
        return [QATSchedule(self.qat_start_epoch, self.observer_epochs)]

    def prepare_model(
        self, model: TemporalFusionTransformer, traced: bool = False
    ) -> TemporalFusionTransformer:
        return prepare_qat(model, traced, self.backend)

    def for_inference(self, model: TemporalFusionTransformer) -> TemporalFusionTransformer:
        set_qat_phase(model, observe=False, fake_quant=True)  # the fake-quant model
        return model

    def memory_note(self, device: str) -> str:
        return (
            "precision int8: the quantization-aware training step, fp32 weights, gradients and "
            "optimizer state plus fake-quant observers and activations"
        )

    def onnx_refusal(self, source: Path) -> str | None:
        return (
            f"{source} is an int8 quantization-aware checkpoint: export the int8 export its "
            f"run wrote beside it instead (ckpt_path={source.parent / 'model_int8.safetensors'})"
        )

    def export(self, best: BestModel) -> dict[str, Any]:
        path, b = best.run.int8_export, best
        scored = export_and_score_int8(
            b.model, b.init, b.schema, b.test_batches, b.quantiles, path, b.calibration
        )
        fp32_bytes = fp32_export_bytes(b.init, b.schema, path.parent, b.calibration)
        return {
            "export": str(path),
            "fp32_equivalent_test_loss": b.test_loss,
            **scored,
            "export_bytes_fp32": fp32_bytes,
        }


def fp32_export_bytes(
    init: dict[str, Any],
    schema: dict[str, Any] | None,
    where: Path,
    calibration: dict[str, Any] | None = None,
) -> int:
    """The size of the float32 export of the same model with the same metadata (schema and
    calibration, which grow with the instruments): the int8 export's yardstick. Written in a
    temporary folder in `where`, then removed."""
    model = TemporalFusionTransformer(**{**UNSAVED_DEFAULTS, **init})
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        return export_weights(model, init, Path(tmp) / "fp32.safetensors", schema, calibration)


PRECISION = Int8
