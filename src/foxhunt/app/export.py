"""Serve a trained TFT outside Python: `model.onnx` and `model.json`.

`foxhunt export ckpt_path=/abs/best.ckpt [export.out=DIR] [export.opset=18]`, or
`foxhunt.app.export.export_onnx(path, out_dir)`, writes into the run directory
(outputs/export/<date>/<time>/) or export.out:

- model.onnx: the TFT as an ONNX graph (torch.export, then torch.onnx's translation) with a
  dynamic batch dimension, one named tensor per input (`onnx_inputs`) and one output,
  `quantiles` [batch, H, Q]: normalized target units, in the model's quantile order;
- model.json: what a runtime without foxhunt needs to make those inputs from bars and read the
  output: each input's features in order, where each comes from (a column, a derivation from
  OHLCV bars, a calendar encoding of the time) and its normalization; the instruments, window
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

import contextlib
import hashlib
import io
import json
import logging
import re
import warnings
from collections.abc import Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from foxhunt.app.inference import data_changes, required_checkpoint
from foxhunt.app.predict import Predictor, load
from foxhunt.config import MIN_OPSET, parse_time
from foxhunt.data.columns import OHLCV_FIELDS, OHLCV_TARGET, column_plan, ohlcv_spec_of
from foxhunt.data.features import feature_plan, warmup_of
from foxhunt.data.read import futures_enabled
from foxhunt.data.schema import DataSchema
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.evaluation.forecasts import quantile_column
from foxhunt.files import check_writable, write_atomic, write_json
from foxhunt.precision import precision_of
from foxhunt.quantization.qat import _QuantizeInput, read_int8

FORMAT = "foxhunt-onnx"  # model.json's `format`
FORMAT_VERSION = 1
ONNX_FILE, JSON_FILE = "model.onnx", "model.json"
OUTPUT = "quantiles"
EXAMPLE_BATCH = 7  # the batch torch.export traces with (1 would be specialized, not dynamic)
CHECK_BATCH_SIZES = (1, 7)  # verified at export
# The largest difference of ONNX Runtime against PyTorch allowed, relative to the largest value.
# int8: float rounding upstream of an input rounded to its int8 grid can move it one step (a
# 255th of its range), which is then no longer rounding noise (measured: up to 2e-3)
PARITY_RTOL = {"fp32": 1e-4, "int8": 1e-2}

# How each derived input is computed, for a consumer to implement (foxhunt.data.features has
# the definitions; foxhunt_serve.features implements them in numpy). c close, h high, l low,
# v volume, r_t = log(c_t / c_{t-1}), x_t = log1p(max(v_t, 0)); a window w covers rows t-w+1..t.
DERIVATIONS = {
    "log_return": "r_t = log(c_t / c_{t-1}); NaN at the first row (the target)",
    "logret": "log(c_t / c_{t-w}); NaN for t < w",
    "rvol": "sqrt(max(sum of r^2 over the window, 0) / w), r_0 taken as 0; NaN for t < w",
    "volz": "(x_t - mean(x)) / std(x) over the window (population std; 0 where var <= "
    "1e-10 * max(1, mean^2)); NaN for t < w - 1",
    "range": "log(max h / min l) over the window; NaN for t < w - 1",
    "clv": "(c_t - min l) / (max h - min l) over the window, clipped to [0, 1]; 0.5 where the "
    "range is 0; NaN for t < w - 1",
    "mom": "sum(r) / (sqrt(w) * rvol_w) over the window, r_0 taken as 0; 0 where sqrt(w) * "
    "rvol_w <= 1e-12; NaN for t < w",
    "tod_sin": "sin(2 pi s / 86400), s the seconds since midnight UTC",
    "tod_cos": "cos(2 pi s / 86400)",
    "dow_sin": "sin(2 pi d / 7), d the weekday (Monday 0) of the UTC date",
    "dow_cos": "cos(2 pi d / 7)",
    "to_cash_close": "(((1200 - s / 60 + 720) mod 1440) - 720) / 720: signed minutes to 20:00 UTC",
    "float32": "every derived value (the target too) is rounded to float32 before normalizing",
}


class ExportError(FoxhuntError):
    """The model cannot be exported (the op, or the step that failed, and why)."""


# --- the inputs ------------------------------------------------------------------------------


def onnx_inputs(schema: DataSchema) -> list[dict[str, Any]]:
    """The exported model's inputs: name, dtype, shape (batch first) and the features along the
    last axis. Inputs with no feature are left out (no known inputs: no encoder_known and
    decoder_known; no static reals; one unnamed series: no instrument)."""
    e, h = schema.encoder_length, schema.prediction_length
    observed = [schema.target, *schema.observed]
    inputs = [_input("encoder_observed", ["batch", e, len(observed)], observed)]
    if schema.known:
        inputs.append(_input("encoder_known", ["batch", e, len(schema.known)], schema.known))
        inputs.append(_input("decoder_known", ["batch", h, len(schema.known)], schema.known))
    if schema.static:
        inputs.append(_input("static_real", ["batch", len(schema.static)], schema.static))
    if schema.groups:
        inputs.append({"name": "instrument", "dtype": "int64", "shape": ["batch"]})
    return inputs


def _input(name: str, shape: list[Any], features: list[str]) -> dict[str, Any]:
    return {"name": name, "dtype": "float32", "shape": shape, "features": list(features)}


def example_inputs(schema: DataSchema, batch: int, seed: int = 0) -> dict[str, Tensor]:
    """Random inputs of `batch` windows, by input name: normal features, valid instruments."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for spec in onnx_inputs(schema):
        shape = [batch, *spec["shape"][1:]]
        if spec["dtype"] == "int64":
            out[spec["name"]] = torch.randint(0, len(schema.groups), shape, generator=g)
        else:
            out[spec["name"]] = torch.randn(*shape, generator=g)
    return out


def onnx_feed(batch: Mapping[str, Tensor], schema: DataSchema) -> dict[str, np.ndarray]:
    """A batch of `WindowDataset` windows as the exported model's inputs."""
    enc = batch["encoder_cont"]
    observed = 1 + len(schema.observed)
    feed = {"encoder_observed": enc[..., :observed]}
    if schema.known:
        feed |= {"encoder_known": enc[..., observed:], "decoder_known": batch["decoder_known"]}
    if schema.static:
        feed["static_real"] = batch["static_real"]
    if schema.groups:
        feed["instrument"] = batch["static_cat"][:, 0]
    return {k: v.contiguous().numpy() for k, v in feed.items()}


class OnnxModel(nn.Module):
    """The TFT with one tensor per input, named as `onnx_inputs` lists them: what is exported
    (the TFT itself takes one dict)."""

    def __init__(self, model: nn.Module, schema: DataSchema) -> None:
        super().__init__()
        self.model = model
        self.encoder_length = schema.encoder_length
        self.prediction_length = schema.prediction_length

    def forward(
        self,
        encoder_observed: Tensor,
        encoder_known: Tensor | None = None,
        decoder_known: Tensor | None = None,
        static_real: Tensor | None = None,
        instrument: Tensor | None = None,
    ) -> Tensor:
        """Quantiles [batch, H, Q] in normalized target units."""
        batch = encoder_observed.shape[0]
        if encoder_known is None or decoder_known is None:
            encoder_known = encoder_observed.new_zeros(batch, self.encoder_length, 0)
            decoder_known = encoder_observed.new_zeros(batch, self.prediction_length, 0)
        if static_real is None:
            static_real = encoder_observed.new_zeros(batch, 0)
        if instrument is None:
            static_cat = encoder_observed.new_zeros(batch, 0, dtype=torch.long)
        else:
            static_cat = instrument[:, None]
        x = {
            "encoder_cont": torch.cat([encoder_observed, encoder_known], dim=-1),
            "decoder_known": decoder_known,
            "static_cat": static_cat,
            "static_real": static_real,
        }
        return self.model(x)


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
    model, precision = exportable(predictor, source)
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


def exportable(predictor: Predictor, source: Path) -> tuple[OnnxModel, str]:
    """The model to export, with named inputs, and its precision (fp32 or int8)."""
    model = predictor.model.eval()
    refusal = precision_of(predictor.precision).onnx_refusal(source)
    if refusal:
        raise ExportError(refusal)
    quantized = [  # torch.ao's dynamically quantized LSTMs (foxhunt.quantization.load_int8)
        name
        for name, m in model.named_modules()
        if type(m).__module__.startswith("torch.ao.nn.quantized") and type(m).__name__ == "LSTM"
    ]
    if not quantized:
        return OnnxModel(model, predictor.schema).eval(), "fp32"
    _float_lstms(model, quantized, read_int8(source))
    for module in model.modules():  # torch.export has no fake-quantize kernel: plain ops
        hooks = module._forward_pre_hooks
        for key, hook in hooks.items():
            if isinstance(hook, _QuantizeInput):
                hooks[key] = Int8Grid(hook.scale, hook.zero_point)
    return OnnxModel(model, predictor.schema).eval(), "int8"


def _float_lstms(model: nn.Module, names: list[str], int8: dict[str, Any]) -> None:
    """The int8 export's dynamically quantized LSTMs `names` replaced, in place, by float LSTMs
    of their int8 weights (each row's int8 values times its scale) and float biases."""
    for name in names:
        old = model.get_submodule(name)
        lstm = nn.LSTM(old.input_size, old.hidden_size, old.num_layers, batch_first=old.batch_first)
        state = {}
        for key in lstm.state_dict():
            entry = int8["int8"].get(f"{name}.{key}")
            if entry is None:
                state[key] = int8["float"][f"{name}.{key}"].float()
            else:
                state[key] = entry["q"].float() * entry["scale"].float()[:, None]
        lstm.load_state_dict(state)
        model.set_submodule(name, lstm.eval())


class Int8Grid:
    """Forward pre-hook: a layer's input rounded to its learned uint8 grid as
    `torch.fake_quantize_per_tensor_affine` rounds it (times 1 / scale in float32, to the
    nearest even; clamped to 0..255), in ops ONNX has."""

    def __init__(self, scale: float, zero_point: int) -> None:
        self.scale = float(np.float32(scale))
        self.inv_scale = float(np.float32(1.0) / np.float32(scale))
        self.zero_point = int(zero_point)

    def __call__(self, module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        q = torch.clamp(torch.round(args[0] * self.inv_scale) + self.zero_point, 0, 255)
        return ((q - self.zero_point) * self.scale, *args[1:])


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.export's and torch.onnx's progress lines, warnings and log messages kept off the
    command's output (an error still says what failed)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def to_onnx(model: OnnxModel, schema: DataSchema, opset: int) -> bytes:
    """The serialized ONNX model: torch.export with a dynamic batch dimension, then torch.onnx's
    translation. An ExportError names the step and the op that failed."""
    example = example_inputs(schema, EXAMPLE_BATCH)
    batch = torch.export.Dim("batch")
    dynamic = {name: {0: batch} for name in example}
    with _quiet(), torch.no_grad():
        try:
            program = torch.export.export(
                model, (), kwargs=example, dynamic_shapes=dynamic, strict=False
            )
        except Exception as exc:  # noqa: BLE001 - any failure to capture: one line
            raise ExportError(f"torch.export cannot capture the model: {_cause(exc)}") from exc
        try:
            onnx_program = torch.onnx.export(
                program,
                (),
                kwargs=example,
                dynamo=True,
                opset_version=opset,
                output_names=[OUTPUT],
                # onnxscript's optimizer made ONNX Runtime slower (tft_small at batch 1024:
                # 1.15 s against 0.90 s; tft_base at 1: 40 ms against 27 ms), which optimizes
                # the graph itself when it loads it
                optimize=False,
            )
        except Exception as exc:  # noqa: BLE001 - the translation failed: name the op
            raise ExportError(_translation_failure(exc, opset)) from exc
    return onnx_program.model_proto.SerializeToString()


def _causes(exc: BaseException) -> list[BaseException]:
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    return chain


def _cause(exc: BaseException) -> str:
    """The innermost error of a chain as one line: its type and the first line of its text."""
    inner = _causes(exc)[-1]
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0] if text else ''}"[:300]


def _translation_failure(exc: BaseException, opset: int) -> str:
    """One line naming the op torch.onnx could not translate, from its error's text."""
    text = "\n".join(str(e) for e in _causes(exc))
    found = re.search(r"OpOverload\(op='([^']+)', overload='([^']+)'\)", text)
    op = f"{found[1]}.{found[2]}" if found else None
    if op is None and (found := re.search(r"target=torch\.ops\.([\w.]+)", text)):
        op = found[1]
    if op is not None:
        return (
            f"the model cannot be exported to ONNX: op {op} has no ONNX translation (opset {opset})"
        )
    return f"the model cannot be exported to ONNX (opset {opset}): {_cause(exc)}"


def verify(
    onnx_bytes: bytes,
    model: OnnxModel,
    schema: DataSchema,
    rtol: float = PARITY_RTOL["fp32"],
    batch_sizes: tuple[int, ...] = CHECK_BATCH_SIZES,
) -> dict[str, Any]:
    """ONNX Runtime (CPU) against the PyTorch model on random windows at `batch_sizes`: the
    largest absolute difference of the quantiles, and that relative to the largest quantile;
    an ExportError beyond `rtol`."""
    session = onnx_session(onnx_bytes)
    worst_abs, worst_rel = 0.0, 0.0
    for batch in batch_sizes:
        x = example_inputs(schema, batch, seed=batch)
        got = session.run([OUTPUT], {k: v.numpy() for k, v in x.items()})[0]
        with torch.no_grad():
            want = model(**x).numpy()
        diff_abs, diff_rel = difference(got, want)
        worst_abs, worst_rel = max(worst_abs, diff_abs), max(worst_rel, diff_rel)
        if not diff_rel <= rtol:
            raise ExportError(
                f"the ONNX model's quantiles differ from the PyTorch model's by {diff_rel:.2g} "
                f"(relative; at most {rtol:g} allowed) at batch {batch}"
            )
    return {
        "runtime": f"onnxruntime {_version('onnxruntime')} CPU",
        "inputs": "random normal windows",
        "batch_sizes": list(batch_sizes),
        "max_abs_diff": worst_abs,
        "max_rel_diff": worst_rel,
        "rtol": rtol,
    }


def difference(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(largest absolute difference, that over the largest absolute value of `want`)."""
    diff = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    scale = float(np.abs(want).max()) if want.size else 0.0
    return diff, diff / scale if scale > 0 else diff


def onnx_session(model: bytes | str | Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session of a model (bytes or a path); `threads`: intra-op threads
    (0: ONNX Runtime's choice)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


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
        "foxhunt_version": _version("foxhunt"),
        "torch_version": torch.__version__,
        "source": {"path": str(source), "precision": precision},
        "model_file": ONNX_FILE,
        "opset": opset,
        "encoder_length": schema.encoder_length,
        "prediction_length": schema.prediction_length,
        "quantiles": quantiles,
        "instruments": list(schema.groups),
        "inputs": onnx_inputs(schema),
        "output": {
            "name": OUTPUT,
            "dtype": "float32",
            "shape": ["batch", schema.prediction_length, len(quantiles)],
            "quantiles": quantiles,
            "columns": [quantile_column(q) for q in sorted(quantiles)],
        },
        "target": {
            "name": schema.target,
            "kind": schema.target_kind,
            "mean": schema.target_center,
            "std": schema.target_scale,
        },
        "normalization": (
            "input: float32((value - mean) / std), computed in float64, per feature; "
            "output: the calibration's offsets (below) on each step's quantiles, in float64, "
            "then value * target.std + target.mean"
        ),
        # foxhunt.evaluation.calibration: CQR's offsets per instrument ("*": pooled), horizon
        # step and pair, in normalized units; aci's score quantiles; null: sort each step
        "calibration": predictor.calibration.to_dict() if predictor.calibration else None,
        "features": features(schema, cfg),
        "data": data_section(cfg, schema),
        "derivations": DERIVATIONS,
        "verification": parity,
    }


def features(schema: DataSchema, cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """Every input feature by name: its role, where it comes from (a `column` of the file, a
    `derived` OHLCV feature of a family and window, the `calendar` of the bar's time), and its
    normalization statistics."""
    spec_of = {f"{fam}_{w}": (fam, w) for fam, w in _derived(cfg)}
    calendar = set(_calendar(cfg))
    out: dict[str, dict[str, Any]] = {}
    roles = [("target", schema.target), *(("observed", c) for c in schema.observed)]
    roles += [("known", c) for c in schema.known]
    for (role, name), mean, std in zip(roles, schema.input_mean, schema.input_std, strict=True):
        if role == "target" and cfg.target is None:
            source = {"source": "derived", "family": OHLCV_TARGET}
        elif name in spec_of:
            source = {"source": "derived", "family": spec_of[name][0], "window": spec_of[name][1]}
        elif name in calendar:
            source = {"source": "calendar"}
        else:
            source = {"source": "column", "column": name}
        out[name] = {"role": role, **source, "mean": float(mean), "std": float(std)}
    for name, mean, std in zip(schema.static, schema.static_mean, schema.static_std, strict=True):
        out[name] = {
            "role": "static",
            "source": "column",
            "column": name,
            "mean": float(mean),
            "std": float(std),
        }
    return out


def _derived(cfg: DictConfig) -> list[tuple[str, int]]:
    """(family, window) of every observed feature derived from OHLCV bars (none without)."""
    spec = ohlcv_spec_of(cfg)
    return feature_plan(spec)[0] if spec is not None else []


def _calendar(cfg: DictConfig) -> list[str]:
    spec = ohlcv_spec_of(cfg)
    return feature_plan(spec)[1] if spec is not None else []


def data_section(cfg: DictConfig, schema: DataSchema) -> dict[str, Any]:
    """How predict reads a file for this model: the columns and their roles, the numeric
    columns read (the NaN policy applies to each), the OHLCV columns and the warm-up rows the
    derived features drop, the futures roll."""
    spec = ohlcv_spec_of(cfg)
    ohlcv = None
    if spec is not None:
        ohlcv = {f: str(getattr(cfg.ohlcv, f)) for f in OHLCV_FIELDS}
        ohlcv["warmup_rows"] = warmup_of(spec)
    return {
        "time_column": cfg.time_column,
        "time_unit": None if cfg.time_unit is None else str(cfg.time_unit),
        "group_column": cfg.group_column,
        "target_column": cfg.target,  # None: the log return of the close (derived)
        "known_columns": list(cfg.known_features),  # given in the rows to forecast too
        "nan_policy": str(cfg.nan_policy),
        "columns_read": columns_read(cfg, schema),
        "ohlcv": ohlcv,
        "futures": _futures(cfg) if futures_enabled(cfg) else None,
    }


def columns_read(cfg: DictConfig, schema: DataSchema) -> list[str]:
    """The numeric columns predict reads from a file for this model, from the column plan of a
    stand-in file with the columns the config names (data.features=all: the model's own)."""
    floats = [*cfg.known_features, *cfg.static_features, *cfg.extra_features]
    if cfg.target is not None:
        floats.append(cfg.target)
    if cfg.features == "ohlcv":
        floats += [getattr(cfg.ohlcv, f) for f in OHLCV_FIELDS]
    elif cfg.features == "all":
        floats += [*schema.observed, *(c for c in schema.dropped if c not in schema.known)]
    else:
        floats += list(cfg.features)
    columns = {cfg.time_column: pa.timestamp("ns")}
    if cfg.group_column:
        columns[cfg.group_column] = pa.string()
    if futures_enabled(cfg):
        roll = cfg.futures.roll
        if roll.open_interest_column:
            floats.append(roll.open_interest_column)
        if roll.expiry_column:
            columns[roll.expiry_column] = pa.timestamp("ns")
        if cfg.futures.root_column:
            columns[cfg.futures.root_column] = pa.string()
    columns |= {c: pa.float64() for c in floats if c not in columns}
    stand_in = pa.schema([pa.field(name, kind) for name, kind in columns.items()])
    return list(column_plan(pads.dataset(stand_in.empty_table()), cfg).values)


def _futures(cfg: DictConfig) -> dict[str, Any]:
    """data.futures as the consumer applies it: contract ids to roots, the roll rule, the
    adjustment (`foxhunt.data.futures`); roll dates as int64 ns UTC."""
    f, roll = cfg.futures, cfg.futures.roll
    return {
        "root_column": f.root_column,
        "root_pattern": f.root_pattern,
        "roll": {
            "rule": str(roll.rule),
            "confirm_bars": roll.confirm_bars,
            "days": roll.days,
            "dates_ns": [parse_time("data.futures.roll.dates", d) for d in roll.dates],
            "open_interest_column": roll.open_interest_column,
            "expiry_column": roll.expiry_column,
            "strict": bool(getattr(roll, "strict", False)),
            # foxhunt derives its inputs (ratios of prices) from ratio-adjusted prices whatever
            # roll.adjust says (continuous_table)
            "adjust": "ratio",
        },
    }


# --- the command line ------------------------------------------------------------------------


def export_command(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """foxhunt export: export, print where and the parity, then one JSON line."""
    required_checkpoint(cfg)
    opts = cfg.export
    chosen, changes = data_changes(cfg.data, overrides)
    result = export_onnx(
        cfg.ckpt_path,
        opts.out or run_dir,
        changes,
        opset=opts.opset,
        overwrite=opts.overwrite,
        data_defaults=cfg.data if chosen else None,
    )
    parity = result["verification"]
    print(
        f"wrote {ONNX_FILE} ({result['onnx_bytes'] / 2**20:.1f} MB, opset {result['opset']}, "
        f"{result['precision']}) and {JSON_FILE} to {result['out']}; ONNX Runtime matches "
        f"PyTorch within {parity['max_rel_diff']:.1e} (relative) at batch "
        f"{' and '.join(map(str, parity['batch_sizes']))}"
    )
    print(json.dumps(result))
    return result
