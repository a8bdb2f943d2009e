"""Serve a trained TFT outside Python: `model.onnx` and `model.json`.

`foxhunt export ckpt_path=/abs/best.ckpt [export.out=DIR] [export.opset=18]`, or
`foxhunt.app.predict.export.export_onnx(path, out_dir)`, writes into the run directory
(outputs/export/<date>/<time>/) or export.out:

- model.onnx: the TFT as an ONNX graph (`foxhunt.precision.onnx`: torch.export, then
  torch.onnx's translation) with a dynamic batch dimension, one named tensor per input
  (`onnx_inputs`) and one output, `quantiles` [batch, H, Q]: normalized target units, in the
  model's quantile order;
- model.json: what a runtime without foxhunt needs to make those inputs from bars and read the
  output: each input's features in order, where each comes from (a column, a family and window
  of `foxhunt_serve.features`, the code that computes it, or a calendar encoding of the time
  on the exchange's clock, `data.calendar`)
  and its normalization (`foxhunt.data.serving`); the instruments, window
  lengths, quantiles, the columns read and the NaN policy, the futures roll; the parity of
  ONNX Runtime against the PyTorch model, measured here before anything is written.

The model runs its inference path, the fused variable selection without its autograd Function
(`foxhunt.models.fused_vsn`). An int8 export (model_int8.safetensors) exports with the weights
`foxhunt.load` gives it (dequantized from int8) and its layers' inputs rounded to their learned
int8 grid, as `foxhunt.load` runs it, except the LSTMs: float32 of their int8 weights here, where
`foxhunt.load` also quantizes their activations (torch's dynamic int8 kernels, which ONNX has
no counterpart of). model.onnx is written before model.json, and model.json holds its SHA-256:
a directory with a model.json holds a whole export.

`foxhunt_serve` (serve/, the foxhunt-serve command) is the reference consumer (numpy, pyarrow
and onnxruntime only); docs/export.md describes the inputs for other runtimes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from foxhunt.app.predict.predictor import Predictor, load
from foxhunt.config import MIN_OPSET
from foxhunt.data.serving import features, target_section, trained_section
from foxhunt.errors import ConfigError
from foxhunt.evaluation.forecasts import quantile_column
from foxhunt.files import check_writable, write_atomic, write_json
from foxhunt.precision.onnx import (
    OUTPUT,
    PARITY_RTOL,
    exportable,
    onnx_inputs,
    package_version,
    to_onnx,
    verify,
)
from foxhunt.training.module import forecasts_unseen

FORMAT = "foxhunt-onnx"  # model.json's `format`
FORMAT_VERSION = 1
ONNX_FILE, JSON_FILE = "model.onnx", "model.json"


# --- the export ------------------------------------------------------------------------------


def export_onnx(
    path: str | Path,
    out_dir: str | Path,
    data: Mapping[str, Any] | None = None,
    *,
    opset: int = MIN_OPSET,
    overwrite: bool = False,
    data_defaults: DictConfig | None = None,
) -> dict[str, Any]:
    """Write model.onnx and model.json for a checkpoint (.ckpt) or an export
    (model_fp32/model_int8.safetensors) into `out_dir`, after checking ONNX Runtime against the
    PyTorch model. `data`, `data_defaults`: the data config, as `foxhunt.load` takes them (the
    column names and features model.json describes). Returns the files and the parity."""
    if opset < MIN_OPSET:
        raise ConfigError(f"export.opset must be {MIN_OPSET} or later, got {opset}")
    out = export_dir(out_dir, overwrite)
    _require_onnx()
    predictor = load(path, data, device="cpu", batch_size=1, data_defaults=data_defaults)
    source = Path(path).expanduser().resolve()
    model, precision = exportable(predictor.model, predictor.schema, predictor.precision, source)
    onnx_bytes = to_onnx(model, predictor.schema, opset)
    parity = verify(onnx_bytes, model, predictor.schema, PARITY_RTOL[precision])
    description = model_description(predictor, source, precision, opset, parity)
    description["sha256"] = hashlib.sha256(onnx_bytes).hexdigest()
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / ONNX_FILE, lambda f: f.write(onnx_bytes))
    write_json(out / JSON_FILE, description)  # last: its presence says the export is whole
    return {
        "out": str(out),
        "files": [ONNX_FILE, JSON_FILE],
        "onnx_bytes": len(onnx_bytes),
        "opset": opset,
        "precision": precision,
        "verification": parity,
    }


def export_dir(out: str | Path, overwrite: bool) -> Path:
    """Where the export goes, checked before any work: a directory (made if missing) that holds
    no export yet unless `overwrite`."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export.out={out} is a file; give a directory")
    found = [name for name in (ONNX_FILE, JSON_FILE) if (out / name).exists()]
    if found and not overwrite:
        raise ConfigError(
            f"export.out={out} holds {' and '.join(found)} already; give another directory, "
            "or export.overwrite=true to replace them"
        )
    check_writable(out)
    return out


def _require_onnx() -> None:
    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if find_spec(m) is None]
    if missing:
        raise ConfigError(f'the ONNX export needs {", ".join(missing)}: pip install -e ".[export]"')


# --- model.json ------------------------------------------------------------------------------


def model_description(
    predictor: Predictor, source: Path, precision: str, opset: int, parity: dict[str, Any]
) -> dict[str, Any]:
    """model.json: everything a consumer needs besides model.onnx (see docs/export.md)."""
    schema, cfg = predictor.schema, predictor.data_cfg
    quantiles = [float(q) for q in predictor.quantiles]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "foxhunt_version": package_version("foxhunt"),
        "torch_version": torch.__version__,
        "source": {"path": str(source), "precision": precision},
        "model_file": ONNX_FILE,
        "opset": opset,
        "encoder_length": schema.encoder_length,
        "prediction_length": schema.prediction_length,
        "quantiles": quantiles,
        "instruments": list(schema.groups),
        # names outside them are forecast: with the embedding's row after theirs, or with no
        # instrument input (foxhunt.training.module.forecasts_unseen)
        "unseen_instruments": forecasts_unseen(predictor.model, schema),
        # of them, those without a training window: forecast as unseen names
        "untrained_instruments": list(schema.untrained),
        "inputs": onnx_inputs(schema, predictor.model.instrument_rows),
        "output": {
            "name": OUTPUT,
            "dtype": "float32",
            "shape": ["batch", schema.prediction_length, len(quantiles)],
            "quantiles": quantiles,
            "columns": [quantile_column(q) for q in sorted(quantiles)],
        },
        "target": target_section(schema),
        "normalization": (
            "input: float32((value - mean) / std), computed in float64, per feature (the "
            "target with its instrument's target.means/stds where given); output: the "
            "calibration's offsets (below) on each step's quantiles, in float64, then value * "
            "std + mean of the instrument's target"
        ),
        # foxhunt.evaluation.calibration: CQR's offsets per instrument ("*": pooled), horizon
        # step and pair, in normalized units; aci's score quantiles; null: sort each step
        "calibration": predictor.calibration.to_dict() if predictor.calibration else None,
        # each derived feature's family and window: foxhunt_serve.features computes them (and
        # is their definition)
        "features": features(schema, cfg),
        "feature_code": f"foxhunt_serve.features {serve_version()}",
        "data": trained_section(cfg, schema, predictor.clock).as_dict(),
        "verification": parity,
    }


def serve_version() -> str:
    """foxhunt_serve's version: its own distribution's (serve/), else foxhunt's, which ships it."""
    served = package_version("foxhunt-serve")
    return package_version("foxhunt") if served == "unknown" else served
