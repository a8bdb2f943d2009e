"""A trained TFT as an ONNX graph: its named inputs (`onnx_inputs`, what model.json lists), the
model at its precision made exportable (an int8 model: its LSTMs in float32 of their int8
weights, its layers' inputs rounded to their learned int8 grid in ops ONNX has), torch.export
then torch.onnx's translation, and ONNX Runtime checked against PyTorch (`verify`).

`foxhunt.app.predict.export` writes model.onnx and model.json from these; `foxhunt_serve` runs
them."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from foxhunt.data.schema import DataSchema
from foxhunt.errors import FoxhuntError
from foxhunt.precision import precision_of
from foxhunt.quantization.qat import _QuantizeInput, read_int8

OUTPUT = "quantiles"
EXAMPLE_BATCH = 7  # the batch torch.export traces with (1 would be specialized, not dynamic)
CHECK_BATCH_SIZES = (1, 7)  # verified at export
# The largest difference of ONNX Runtime against PyTorch allowed, relative to the largest value.
# int8: float rounding upstream of an input rounded to its int8 grid can move it one step (a
# 255th of its range), which is then no longer rounding noise (measured: up to 2e-3)
PARITY_RTOL = {"fp32": 1e-4, "int8": 1e-2}


class ExportError(FoxhuntError):
    """The model cannot be exported (the op, or the step that failed, and why)."""


# --- the inputs ------------------------------------------------------------------------------


def onnx_inputs(schema: DataSchema, instruments: int | None = None) -> list[dict[str, Any]]:
    """The exported model's inputs: name, dtype, shape (batch first) and the features along the
    last axis. Inputs with no feature are left out (no known inputs: no encoder_known and
    decoder_known; no static reals; no instrument embedding: no instrument). `instruments`:
    the rows of the model's instrument embedding (`TemporalFusionTransformer.instrument_rows`;
    None: one per name of the schema)."""
    e, h = schema.encoder_length, schema.prediction_length
    observed = [schema.target, *schema.observed]
    inputs = [_input("encoder_observed", ["batch", e, len(observed)], observed)]
    if schema.known:
        inputs.append(_input("encoder_known", ["batch", e, len(schema.known)], schema.known))
        inputs.append(_input("decoder_known", ["batch", h, len(schema.known)], schema.known))
    static = schema.static_inputs  # the data's, then the target scale's
    if static:
        inputs.append(_input("static_real", ["batch", len(static)], static))
    if instruments is None:
        instruments = len(schema.groups)
    if instruments:
        inputs.append({"name": "instrument", "dtype": "int64", "shape": ["batch"]})
    return inputs


def _input(name: str, shape: list[Any], features: list[str]) -> dict[str, Any]:
    return {"name": name, "dtype": "float32", "shape": shape, "features": list(features)}


def example_inputs(
    schema: DataSchema, batch: int, seed: int = 0, instruments: int | None = None
) -> dict[str, Tensor]:
    """Random inputs of `batch` windows, by input name: normal features, valid instruments
    (`instruments`: as `onnx_inputs`)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    rows = len(schema.groups) if instruments is None else instruments
    for spec in onnx_inputs(schema, rows):
        shape = [batch, *spec["shape"][1:]]
        if spec["dtype"] == "int64":
            out[spec["name"]] = torch.randint(0, rows, shape, generator=g)
        else:
            out[spec["name"]] = torch.randn(*shape, generator=g)
    return out


def onnx_feed(
    batch: Mapping[str, Tensor], schema: DataSchema, instruments: int | None = None
) -> dict[str, np.ndarray]:
    """A batch of `WindowDataset` windows as the exported model's inputs (`instruments`: as
    `onnx_inputs`)."""
    enc = batch["encoder_cont"]
    observed = 1 + len(schema.observed)
    feed = {"encoder_observed": enc[..., :observed]}
    if schema.known:
        feed |= {"encoder_known": enc[..., observed:], "decoder_known": batch["decoder_known"]}
    if schema.static_inputs:
        feed["static_real"] = batch["static_real"]
    if len(schema.groups) if instruments is None else instruments:
        feed["instrument"] = batch["static_cat"][:, 0]
    return {k: v.contiguous().numpy() for k, v in feed.items()}


class OnnxModel(nn.Module):
    """The TFT with one tensor per input, named as `onnx_inputs` lists them: what is exported
    (the TFT itself takes one dict)."""

    def __init__(self, model: nn.Module, schema: DataSchema) -> None:
        super().__init__()
        self.model = model
        self.instruments = model.instrument_rows
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


def exportable(
    model: nn.Module, schema: DataSchema, precision: Mapping[str, Any], source: Path
) -> tuple[OnnxModel, str]:
    """The model to export, with named inputs, and its precision (fp32 or int8); `precision`:
    its precision config, `source` the checkpoint or export it was loaded from."""
    model = model.eval()
    refusal = precision_of(precision).onnx_refusal(source)
    if refusal:
        raise ExportError(refusal)
    quantized = [  # torch.ao's dynamically quantized LSTMs (foxhunt.quantization.load_int8)
        name
        for name, m in model.named_modules()
        if type(m).__module__.startswith("torch.ao.nn.quantized") and type(m).__name__ == "LSTM"
    ]
    if not quantized:
        return OnnxModel(model, schema).eval(), "fp32"
    _float_lstms(model, quantized, read_int8(source))
    for module in model.modules():  # torch.export has no fake-quantize kernel: plain ops
        hooks = module._forward_pre_hooks
        for key, hook in hooks.items():
            if isinstance(hook, _QuantizeInput):
                hooks[key] = Int8Grid(hook.scale, hook.zero_point)
    return OnnxModel(model, schema).eval(), "int8"


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
    example = example_inputs(schema, EXAMPLE_BATCH, instruments=model.instruments)
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
        x = example_inputs(schema, batch, seed=batch, instruments=model.instruments)
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
        "runtime": f"onnxruntime {package_version('onnxruntime')} CPU",
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


def package_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
