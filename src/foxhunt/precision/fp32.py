"""precision=fp32, and the float32 export (a safetensors state dict) that bf16 writes too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from foxhunt.errors import CheckpointError
from foxhunt.files import read_export, write_export
from foxhunt.models.ensemble import build
from foxhunt.models.tft import TemporalFusionTransformer
from foxhunt.precision.base import BestModel, Precision

FP32_FORMAT = "foxhunt-fp32"  # the `format` in a float32 export's metadata


class FP32(Precision):
    name = "fp32"

    def export(self, best: BestModel) -> dict[str, Any]:
        path = best.run.fp32_export
        export_weights(best.model, best.init, path, best.schema, best.calibration)
        return {"export": str(path)}


def export_weights(
    model: TemporalFusionTransformer,
    init: dict,
    path: Path,
    schema: dict,
    calibration: dict[str, Any] | None = None,
) -> int:
    """The float32 model as a safetensors file (its state dict) with the constructor arguments,
    the data schema and the calibration as JSON metadata: what `foxhunt.load` and any
    safetensors reader need. Returns its size in bytes."""
    meta = {"format": FP32_FORMAT, "init": init, "schema": schema, "calibration": calibration}
    return write_export(path, model.state_dict(), meta)


def load_weights(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """(the float32 model in eval mode, an ensemble's as one, the export's metadata) of
    `export_weights`' file."""
    tensors, meta = read_export(path)
    if meta.get("format") != FP32_FORMAT:
        raise CheckpointError(f"{path} is not a float32 export (format {meta.get('format')!r})")
    model = build(meta["init"])
    model.load_state_dict(tensors)
    return model.eval(), meta


PRECISION = FP32
