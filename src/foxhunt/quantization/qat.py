"""int8 quantization-aware training and export, on torch.ao.quantization's fake-quant modules
(precision.backend=torch.ao) or torchao's (precision.backend=torchao).

The only file that knows the QAT backends.

Why not torch.ao's eager `prepare_qat`/`convert`: they swap `nn.Linear` modules and quantize
what flows through their `forward`, but the TFT uses most of its weights functionally (the
fused variable selection folds and stacks them), so here:
- every weight matrix of the GRNs, variable selection networks, static encoders and attention
  gets a weight fake-quant (int8, symmetric, per output channel; per variable and channel for the
  stacked ones) as a parametrization, so every use of `.weight` sees the quantized values;
- every `nn.Linear` called as a module also fake-quantizes its input (uint8, per tensor);
- the quantile head (and the highway beside it), the input prescalers and the LSTMs stay float
  during training.
The configs are symmetric with no reduce_range, so the fake-quant ranges are those of the export.

Export (`export_int8`, a safetensors file with JSON metadata: no pickle) stores every
fake-quantized weight, and the LSTMs' weights, as int8 plus per-channel scales in float16, the
learned input ranges, and the few other parameters in float16. The scales are float16 without
rounding anything the fake-quant model does not: when the observers freeze (`set_qat_phase`),
each weight scale is rounded up to a float16 value, and training and the export use that one
(a scale per 16 int8 values of a stacked weight made float32 scales 8% of tft_small's export).
torchao's scales, computed from the weights at run time, stay float32.
`load_int8` rebuilds the model from them: Linear weights dequantized (their outputs are the
fake-quant model's), inputs rounded to the learned int8 grid, the LSTMs dynamically quantized
(int8 kernels).

What stays float, and why (docs/precision.md measures it):
- biases, LayerNorm gains and shifts, the ResampleNorm masks: added or multiplied after a
  matmul, one value per channel; float16 (about a tenth of tft_small's export);
- the input prescalers and embeddings: they make a float vector of a scalar input or a name,
  with no matmul to round into; float16;
- the quantile head (`output_layer`): its outputs are the forecast, with no layer after it to
  absorb an int8 step; its weights are float16 (0.1% of the export);
- the highway: a linear forecast of the raw last inputs, added after the monotone head; its
  input is not bounded as a LayerNorm'd one is (a per-tensor uint8 grid over its range would
  round a typical move away), and its weights are 0.1% of the export; float16;
- the LSTMs' biases (torch.ao's dynamic int8 LSTMs take float biases); float16.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.ao.quantization import (
        FakeQuantize,
        MovingAverageMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
    )

from foxhunt.errors import CheckpointError, ConfigError
from foxhunt.files import load_file, read_export, write_export
from foxhunt.models.blocks import GroupedLinear
from foxhunt.models.tft import UNSAVED_DEFAULTS, TemporalFusionTransformer

INT8_FORMAT = "foxhunt-int8"  # the `format` in an int8 export's metadata
_explained = False


def explain_deprecation() -> None:
    """One line instead of torch.ao's repeated multi-line DeprecationWarning."""
    global _explained
    warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated")
    if not _explained:
        print(
            "note: precision=int8 uses torch.ao.quantization, deprecated upstream in favour of "
            "torchao but present and tested in torch 2.11-2.13; its warnings are silenced"
        )
        _explained = True


def _weight_fake_quant() -> FakeQuantize:
    return FakeQuantize(
        observer=MovingAveragePerChannelMinMaxObserver,
        quant_min=-128,
        quant_max=127,
        dtype=torch.qint8,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
        reduce_range=False,
    )


def _activation_fake_quant() -> FakeQuantize:
    return FakeQuantize(
        observer=MovingAverageMinMaxObserver,
        quant_min=0,
        quant_max=255,
        dtype=torch.quint8,
        qscheme=torch.per_tensor_affine,
        reduce_range=False,
    )


def _torchao() -> Any:
    """torchao's int8 fake quantizers (precision.backend=torchao), or a clear error."""
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA-only kernels fail to load
    try:
        from torchao.quantization import PerToken
        from torchao.quantization.qat import IntxFakeQuantizeConfig
        from torchao.quantization.qat.fake_quantizer import IntxFakeQuantizer
    except ImportError:
        raise ConfigError("precision.backend=torchao needs torchao: pip install torchao") from None

    def weight(in_features: int) -> nn.Module:  # symmetric int8 per row, scale max|w| / 127.5
        return IntxFakeQuantizer(
            IntxFakeQuantizeConfig(torch.int8, group_size=in_features, is_symmetric=True)
        )

    def activation() -> nn.Module:  # asymmetric int8 per token, ranges taken at run time
        return IntxFakeQuantizer(
            IntxFakeQuantizeConfig(torch.int8, granularity=PerToken(), is_symmetric=False)
        )

    return weight, activation


def _is_torchao(module: nn.Module) -> bool:
    return type(module).__name__ == "IntxFakeQuantizer"


class _TracedWeightFakeQuant(nn.Module):
    """For the memory estimator's FakeTensorMode trace: the same fake-quant kernel (same output
    and saved mask) with fixed ranges, since observers need real values. `held`: the real
    fake-quant module it stands in for (torch.ao's), whose buffers it holds as that module
    holds them after its first call, one scale, zero point, minimum and maximum a channel
    (0.11 MB of tft_small's 4.4 MB validation step)."""

    def __init__(self, held: nn.Module | None = None, channels: int = 1) -> None:
        super().__init__()
        self.held = held
        if held is not None:
            for module, names in (
                (held, ("scale", "zero_point")),
                (held.activation_post_process, ("min_val", "max_val")),
            ):
                for name in names:
                    getattr(module, name).resize_(channels)

    def forward(self, w: Tensor) -> Tensor:
        c = w.shape[0]
        zero = torch.zeros(c, dtype=torch.int32, device=w.device)
        return torch.fake_quantize_per_channel_affine(w, w.new_ones(c), zero, 0, -128, 127)


class _TracedActivationFakeQuant(nn.Module):
    def __init__(self, held: nn.Module | None = None) -> None:
        super().__init__()
        self.held = held  # (its buffers: a scale, a zero point, a range)

    def forward(self, x: Tensor) -> Tensor:
        return torch.fake_quantize_per_tensor_affine(x, 1.0, 0, 0, 255)


class WeightFakeQuant(nn.Module):
    """Parametrization: the weight as int8 would store it. Channels are the rows of a Linear
    weight [out, in], and (variable, output) pairs of a stacked weight [n, in, out]."""

    def __init__(self, stacked: bool, fq: nn.Module) -> None:
        super().__init__()
        self.stacked = stacked
        self.fq = fq

    def forward(self, w: Tensor) -> Tensor:
        if not self.stacked:
            return self.fq(w)
        if not torch.is_grad_enabled():  # (a view of a weight made under no_grad needs a grad
            w = w.detach()  # and has no grad_fn: MemTracker's module hooks fail on it; n = 1)
        n, i, o = w.shape
        rows = w.transpose(1, 2).reshape(n * o, i)
        return self.fq(rows).reshape(n, o, i).transpose(1, 2)


def _quantized_weights(model: nn.Module) -> list[tuple[str, nn.Module, bool]]:
    """(name, module, stacked) of every weight QAT covers."""
    out = []
    for name, module in model.named_modules():
        # the heads stay float: the output layer, and the highway beside it (a few weights)
        if name == "output_layer" or name.startswith(("lstm_", "highway")):
            continue
        if isinstance(module, nn.Linear):
            out.append((name, module, False))
        elif isinstance(module, GroupedLinear):
            out.append((name, module, True))
    return out


def _fake_quant_input(module: nn.Linear, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    module.called = True  # as a module: its input is quantized (a folded weight's is not)
    return (module.input_fq(args[0]), *args[1:])


def prepare_qat(
    model: TemporalFusionTransformer, traced: bool = False, backend: str = "torch.ao"
) -> TemporalFusionTransformer:
    """Add the fake quantization described in the module docstring, in place. `traced`: the
    observer-free stand-in for a FakeTensorMode memory trace. `backend`: torch.ao (static
    ranges from observers) or torchao (weight ranges from the weights, input ranges per token
    at run time; no observers)."""
    # each weight's fake quantizer, of its rows' length and its channels
    if traced and backend == "torchao":  # (torchao's quantizers hold no observers)
        weight, activation = (lambda i, c: _TracedWeightFakeQuant()), _TracedActivationFakeQuant
    elif traced:
        explain_deprecation()
        weight = lambda i, c: _TracedWeightFakeQuant(_weight_fake_quant(), c)  # noqa: E731
        activation = lambda: _TracedActivationFakeQuant(_activation_fake_quant())  # noqa: E731
    elif backend == "torchao":
        torchao_weight, activation = _torchao()
        weight = lambda i, c: torchao_weight(i)  # noqa: E731
    else:
        explain_deprecation()
        weight, activation = (lambda i, c: _weight_fake_quant()), _activation_fake_quant
    for _, module, stacked in _quantized_weights(model):
        shape = module.weight.shape  # rows of [out, in], or of stacked [n, in, out]
        fq = weight(shape[1], shape[0] * shape[2] if stacked else shape[0])
        parametrize.register_parametrization(module, "weight", WeightFakeQuant(stacked, fq))
        if isinstance(module, nn.Linear):
            module.input_fq = activation()
            module.register_forward_pre_hook(_fake_quant_input)
    model.qat = True
    return model


def fake_quant_modules(model: nn.Module) -> list[FakeQuantize]:
    return [m for m in model.modules() if isinstance(m, FakeQuantize)]


def set_qat_phase(model: nn.Module, observe: bool, fake_quant: bool) -> None:
    """Observers on/off (off = ranges frozen, weight scales rounded up to float16 values, as
    the export stores them), fake quantization on/off (off = float)."""
    for m in model.modules():
        if _is_torchao(m):  # no observers: ranges come from the values themselves
            m.enabled = fake_quant
        elif isinstance(m, WeightFakeQuant) and not observe and isinstance(m.fq, FakeQuantize):
            with torch.no_grad():  # (idempotent: a resumed run rounds as an uninterrupted one)
                m.fq.scale.copy_(half_scale(m.fq.scale).float())
    for fq in fake_quant_modules(model):
        (fq.enable_observer if observe else fq.disable_observer)()
        (fq.enable_fake_quant if fake_quant else fq.disable_fake_quant)()


def half_scale(scale: Tensor) -> Tensor:
    """The float16 value at or above each scale: rounding a scale up never clips a weight that
    the float32 scale kept in range."""
    half = scale.detach().to(torch.float16)
    below = half.float() < scale
    return torch.where(below, torch.nextafter(half, torch.full_like(half, torch.inf)), half)


# --- export ---------------------------------------------------------------------------------


def _int8(w: Tensor, stacked: bool, fq: nn.Module) -> tuple[Tensor, Tensor]:
    """(int8 rows, their scales): float16 scales (torch.ao's, frozen), float32 (torchao's)."""
    rows = w.transpose(1, 2).reshape(-1, w.shape[1]) if stacked else w
    if _is_torchao(fq):  # its scale is the row's, computed as torchao does
        scale = rows.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).eps) / 127.5
    else:  # the observed scale, frozen as a float16 value by set_qat_phase (a no-op then)
        scale = half_scale(fq.scale)
    q = torch.clamp(torch.round(rows / scale.float()[:, None]), -128, 127).to(torch.int8)
    return q, scale


def _dequant(q: Tensor, scale: Tensor, shape: torch.Size, stacked: bool) -> Tensor:
    rows = q.to(torch.float32) * scale.float()[:, None]
    if not stacked:
        return rows
    n, i, o = shape
    return rows.reshape(n, o, i).transpose(1, 2).contiguous()


def _fake_quant_weights(model: nn.Module) -> dict[str, dict[str, Any]]:
    """{key: {q, scale, shape, stacked}} every fake-quantized weight as int8 and its scales."""
    weights = {}
    for name, module, stacked in _quantized_weights(model):
        w = module.weight.detach()  # computing it makes the scales current
        fq = module.parametrizations.weight[0].fq
        q, scale = _int8(module.parametrizations.weight.original.detach(), stacked, fq)
        weights[f"{name}.weight"] = {
            "q": q,
            "scale": scale,
            "shape": tuple(w.shape),
            "stacked": stacked,
        }
    return weights


def _lstm_weights(model: nn.Module) -> dict[str, dict[str, Any]]:
    """The LSTMs' weights (float in training) as dynamic quantization will run them: int8 per
    row, float16 scales."""
    weights = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.LSTM):
            for pname, w in module.named_parameters():
                if pname.startswith("weight_"):
                    w = w.detach()
                    scale = half_scale(w.abs().amax(dim=1).clamp(min=1e-12) / 127)
                    q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
                    key = f"{name}.{pname}"
                    weights[key] = {"q": q, "scale": scale, "shape": w.shape, "stacked": False}
    return weights


def _input_quantization(model: nn.Module) -> dict[str, Any]:
    """How each Linear's input was quantized, so inference does exactly the same: the learned
    int8 range (torch.ao), or per token at run time (torchao)."""
    activations: dict[str, Any] = {}
    for name, m, _ in _quantized_weights(model):
        fq = getattr(m, "input_fq", None)
        if fq is None:
            continue
        if not _is_torchao(fq):
            activations[name] = (float(fq.scale), int(fq.zero_point))
        elif getattr(m, "called", False):  # (a folded weight's Linear never sees an input)
            activations[name] = "per_token"
    return activations


def export_int8(
    model: TemporalFusionTransformer,
    init: dict[str, Any],
    path: Path,
    schema: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
) -> int:
    """Write the int8 export of a QAT model; returns its size in bytes. `init` are the
    constructor arguments of the TFT (so `load_int8` needs nothing else); `schema`, the data
    schema (`DataSchema.to_dict()`: columns and normalization), and `calibration` (the run's
    `Calibration.to_dict()`) let `foxhunt.load` predict from the export alone; `load_int8`
    ignores them."""
    weights = _fake_quant_weights(model)
    lstms = _lstm_weights(model)
    weights |= lstms
    activations = _input_quantization(model)
    # the rest (biases, norms, prescalers, the float head: ~10% of tft_small) in float16; the
    # fake-quantized weights' float originals are the `.parametrizations.` entries
    floats = {
        k: v.half() if v.is_floating_point() else v
        for k, v in model.state_dict().items()
        if k not in lstms and ".parametrizations." not in k and "input_fq" not in k
    }
    tensors = {f"float/{k}": v for k, v in floats.items()}
    for key, entry in weights.items():
        tensors[f"int8/{key}/q"], tensors[f"int8/{key}/scale"] = entry["q"], entry["scale"]
    meta = {
        "format": INT8_FORMAT,
        "init": init,
        "schema": schema,
        "calibration": calibration,
        "int8": {
            k: {"shape": list(e["shape"]), "stacked": e["stacked"]} for k, e in weights.items()
        },
        "activations": activations,
    }
    return write_export(path, tensors, meta)


class _QuantizeInput:
    """Forward pre-hook: round a Linear's input to the uint8 grid learned in training."""

    def __init__(self, scale: float, zero_point: int) -> None:
        self.scale, self.zero_point = scale, zero_point

    def __call__(self, module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        x = torch.fake_quantize_per_tensor_affine(args[0], self.scale, self.zero_point, 0, 255)
        return (x, *args[1:])


def read_int8(path: str | Path) -> dict[str, Any]:
    """An int8 export as {init, int8: {key: {q, scale, shape, stacked}}, activations, float,
    schema}: the safetensors export, or a legacy `.pt` one (loaded weights-only)."""
    if Path(path).suffix != ".safetensors":
        return load_file(path)
    tensors, meta = read_export(path)
    if meta.get("format") != INT8_FORMAT:
        raise CheckpointError(f"{path} is not an int8 export (format {meta.get('format')!r})")
    floats = {k.removeprefix("float/"): v for k, v in tensors.items() if k.startswith("float/")}
    int8 = {
        key: {**e, "q": tensors[f"int8/{key}/q"], "scale": tensors[f"int8/{key}/scale"]}
        for key, e in meta["int8"].items()
    }
    activations = {
        k: tuple(v) if isinstance(v, list) else v for k, v in meta["activations"].items()
    }
    return {**meta, "int8": int8, "float": floats, "activations": activations}


def load_int8(path: str | Path) -> TemporalFusionTransformer:
    """The exported int8 model, ready for inference: weights dequantized from int8, LSTMs
    dynamically quantized (int8 kernels)."""
    explain_deprecation()
    blob = read_int8(path)
    model = TemporalFusionTransformer(**{**UNSAVED_DEFAULTS, **blob["init"]})
    state = {k: v.float() if v.is_floating_point() else v for k, v in blob["float"].items()}
    for key, entry in blob["int8"].items():
        state[key] = _dequant(entry["q"], entry["scale"], entry["shape"], entry["stacked"])
    model.load_state_dict(state)
    model.eval()
    modules = dict(model.named_modules())
    for name, scheme in blob["activations"].items():
        if scheme == "per_token":
            modules[name].input_fq = _torchao()[1]()
            modules[name].register_forward_pre_hook(_fake_quant_input)
        else:
            modules[name].register_forward_pre_hook(_QuantizeInput(*scheme))
    with warnings.catch_warnings():  # explained once by explain_deprecation()
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.LSTM}, dtype=torch.qint8)
