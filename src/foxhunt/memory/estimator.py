"""Peak memory of a training step and a validation step, predicted before anything is allocated.

`estimate(cfg, batch_size)` builds the configured model, its optimizer state and a batch under
`FakeTensorMode` (tensors with shapes and dtypes but no storage) and runs the real step on them:
forward, loss, backward, gradient clipping, optimizer step; and, separately, a validation
forward. PyTorch's `MemTracker` follows every tensor of that trace, attributes it to parameters,
gradients, optimizer state, activations, temporaries or inputs, and records the peak. Nothing is
allocated and no GPU is needed, so a 4 GB card can be planned from a laptop.

Where a fake kernel differs from the real one, the difference is modelled here:
- CPU LSTM: oneDNN keeps a workspace for backward that its fake kernel reports as empty;
  `onednn_lstm_workspace_bytes` is the real size (exact at realistic sizes, see tests).
- CUDA, planned from a machine without one: the trace runs on CPU with oneDNN off (PyTorch's
  generic LSTM keeps its gates for backward, as cuDNN's reserve space does), then the caching
  allocator's reserve and the CUDA context are added from documented, overridable constants.
  These have not been checked against a GPU yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

from foxhunt.data.datamodule import DataSchema, describe, random_batch
from foxhunt.errors import ConfigError
from foxhunt.memory.budget import MB, counting_suspended
from foxhunt.quantization.qat import bake_weight_fake_quant
from foxhunt.training.metrics import quantile_loss
from foxhunt.training.module import build_model, make_optimizer

# MemTracker's categories, as the parts of a step that the breakdown names
PARTS = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "transient",
    "Other": "inputs",
}
PART_NAMES = tuple(dict.fromkeys(PARTS.values()))
_PAGE = 4096


def onednn_lstm_workspace_bytes(
    seq_len: int, batch: int, hidden: int, input_size: int, dtype: torch.dtype = torch.float32
) -> int:
    """Bytes of the workspace oneDNN's LSTM layer keeps for backward (one layer, one direction).
    From oneDNN's layout: gates [T, B, 4H], one [T, B, H] region and six state regions
    [T+1, B, max(I, H)] with a padded leading dimension, four cell-state regions [T+1, B, H];
    each region page-aligned. fp32: within 1% of the real kernel from a few MB up. bf16
    (autocast): gates, output and cell states in bf16, the six state regions in fp32, a fit
    within 3% (tests/memory)."""
    bf16 = dtype == torch.bfloat16
    half, full = (2, 4) if bf16 else (4, 4)

    def ld(n: int, size: int) -> int:  # oneDNN pads a leading dimension that would alias 1 KiB
        n = -(-n // 16) * 16
        return n + 16 if (n * size) % 1024 == 0 else n

    t, b, h = seq_len, batch, hidden
    regions = [t * b * ld(4 * h, half) * half, t * b * ld(h, half) * half]
    regions += [(t + 1) * b * ld(max(input_size, h), full) * full] * 6
    regions += [(t + 1) * b * h * half] * 4
    return sum(-(-r // _PAGE) * _PAGE for r in regions)


class _OneDnnWorkspace(TorchDispatchMode):
    """Give fake `mkldnn_rnn_layer` calls the workspace the real kernel allocates."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mkldnn_rnn_layer.default:
            names = [a.name for a in func._schema.arguments]
            bound = dict(zip(names, args, strict=False)) | (kwargs or {})
            dtype = bound["input"].dtype
            if bound["train"] and dtype in (torch.float32, torch.bfloat16):
                t, b, i = bound["input"].shape  # time-major inside the kernel
                size = onednn_lstm_workspace_bytes(t, b, bound["hidden_size"], i, dtype)
                workspace = torch.empty(size, dtype=torch.uint8, device=out[3].device)
                out = (*out[:3], workspace)
        return out


class _StepTracker(MemTracker):
    """MemTracker keeping only the global peak. Its per-module peaks walk every module on every
    op: half the trace time at tft_small, and nothing here reads them."""

    def _update_peak_stats(self, peak_state: Any) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)


@dataclass(frozen=True)
class StepMemory:
    """Peak bytes of one step, by part; `total` is their sum at the moment of the peak."""

    batch_size: int
    parts: dict[str, int]

    @property
    def allocated(self) -> int:
        """Tensor bytes: what max_memory_allocated reports on CUDA."""
        return sum(v for k, v in self.parts.items() if k in PART_NAMES)

    @property
    def total(self) -> int:
        """What the device must hold: on CUDA also the allocator's reserve and the context."""
        return sum(self.parts.values())

    def as_mb(self) -> dict[str, float]:
        return {k: round(v / MB, 1) for k, v in self.parts.items()}


@dataclass(frozen=True)
class MemoryEstimate:
    device: str
    params: int  # parameter count
    train: StepMemory
    val: StepMemory
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(self.train.total, self.val.total)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "device": self.device,
            "notes": self.notes,
            "params": self.params,
            "batch_size": self.train.batch_size,
            "val_batch_size": self.val.batch_size,
            "train_peak_mb": round(self.train.allocated / MB, 1),
            "val_peak_mb": round(self.val.allocated / MB, 1),
        }
        if self.device == "cuda":
            d["train_device_mb"] = round(self.train.total / MB, 1)
            d["val_device_mb"] = round(self.val.total / MB, 1)
        return d | {"train_breakdown_mb": self.train.as_mb(), "val_breakdown_mb": self.val.as_mb()}


@dataclass(frozen=True)
class _Plan:
    """What one traced step needs from the composed config."""

    model: dict[str, Any]
    optim: dict[str, Any]
    schema: DataSchema
    clip: float | None
    checkpointing: bool
    precision: dict[str, Any]
    device: str
    cuda_reserve_fraction: float
    cuda_context_mb: float


def resolve_device(name: str | None) -> str:
    """`auto` (or None) is cuda when one is present, else cpu; anything else is an error."""
    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"memory.device must be auto, cpu or cuda, got {name!r}")
    return name


def _plan(cfg: Any, schema: DataSchema | None, device: str | None) -> _Plan:
    mem = cfg.memory
    return _Plan(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        schema=schema if schema is not None else describe(cfg.data),
        clip=cfg.trainer.gradient_clip_val,
        checkpointing=cfg.memory.gradient_checkpointing,
        precision=OmegaConf.to_container(cfg.precision, resolve=True),
        device=resolve_device(device or mem.device),
        cuda_reserve_fraction=mem.cuda_reserve_fraction,
        cuda_context_mb=mem.cuda_context_mb,
    )


def _make_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer state as the first real step does (zero gradients leave the
    parameters as they are but for weight decay)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_step(
    plan: _Plan, batch_size: int, train: bool, fake: bool, device: str | None = None
) -> dict[str, int]:
    """Run one step and return MemTracker's peak bytes by part. With `fake`, under
    FakeTensorMode (no storage at all); otherwise for real on `device` (a measurement)."""
    device = device or "cpu"
    onednn = fake and plan.device == "cpu" and torch.backends.mkldnn.is_available()
    with ExitStack() as stack:
        if fake:
            stack.enter_context(counting_suspended())
            stack.enter_context(FakeTensorMode())
            if plan.device == "cuda":  # generic LSTM: keeps its gates, as cuDNN does
                stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        model = build_model(plan.model, plan.schema, plan.precision, traced=fake)
        if not train and plan.precision["name"] == "int8":
            # MemTracker cannot follow a parametrized weight under no_grad: validate with the
            # fake-quantized weights computed once (their per-forward copies, one weight at a
            # time, are not counted)
            bake_weight_fake_quant(model)
        model.gradient_checkpointing = plan.checkpointing
        if device != "cpu":
            model.to(device)
        optimizer = make_optimizer(model.parameters(), plan.optim)
        _make_optimizer_state(model, optimizer)
        batch = random_batch(plan.schema, batch_size, device)
        quantiles = torch.tensor(plan.model["quantiles"], device=device)
        cuda = not fake and torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        tracker = _StepTracker()
        tracker.track_external(model, optimizer, *batch.values())
        stack.enter_context(tracker)
        if onednn:
            stack.enter_context(_OneDnnWorkspace())
        if plan.precision["name"] == "bf16":  # Lightning's bf16-mixed: autocast to bfloat16
            stack.enter_context(torch.autocast(torch.device(device).type, torch.bfloat16))
        if train:
            model.train()
            loss = quantile_loss(model(batch), batch["target"], quantiles)
            loss.backward()
            if plan.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss
        else:
            model.eval()
            with torch.no_grad():
                quantile_loss(model(batch), batch["target"], quantiles)
    extra = {}
    if cuda:
        torch.cuda.synchronize(device)
        extra["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device)
        extra["cuda_max_reserved"] = torch.cuda.max_memory_reserved(device)
    snapshot = tracker.get_tracker_snapshot("peak")
    peak = next((v for d, v in snapshot.items() if d.type == torch.device(device).type), {})
    parts = dict.fromkeys(PART_NAMES, 0)
    for key, value in peak.items():
        name = PARTS.get(getattr(key, "value", key))
        if name:
            parts[name] += value
    return parts | extra


def _step_memory(plan: _Plan, batch_size: int, train: bool) -> StepMemory:
    parts = run_step(plan, batch_size, train, fake=True)
    if plan.device == "cuda":
        traced = sum(parts.values())
        parts["cuda_allocator_reserve"] = math.ceil(traced * plan.cuda_reserve_fraction)
        parts["cuda_context"] = int(plan.cuda_context_mb * MB)
    return StepMemory(batch_size, parts)


def count_parameters(plan: _Plan) -> int:
    with counting_suspended(), FakeTensorMode():
        model = build_model(plan.model, plan.schema, plan.precision, traced=True)
        return sum(p.numel() for p in model.parameters())


def _precision_note(name: str) -> str:
    return {
        "fp32": "precision fp32",
        "bf16": "precision bf16: traced under bfloat16 autocast; fp32 master weights, gradients "
        "and optimizer state",
        "int8": "precision int8: the quantization-aware training step, fp32 weights, gradients "
        "and optimizer state plus fake-quant observers and activations",
    }[name]


def _batch_sizes(cfg: Any, batch_size: int | None, val_batch_size: int | None) -> tuple[int, int]:
    """The sizes to plan: as given, else data.batch_size and memory.val_batch_size (or the same)."""
    batch_size = batch_size or cfg.data.batch_size
    return batch_size, val_batch_size or fixed_val_batch_size(cfg) or batch_size


def estimate(
    cfg: Any,
    batch_size: int | None = None,
    val_batch_size: int | None = None,
    *,
    schema: DataSchema | None = None,
    device: str | None = None,
) -> MemoryEstimate:
    """Peak memory of one training step (optimizer state already created) at `batch_size` and
    of one validation step at `val_batch_size`, for the composed Hydra config `cfg`."""
    plan = _plan(cfg, schema, device)
    batch_size, val_batch_size = _batch_sizes(cfg, batch_size, val_batch_size)
    notes = [_precision_note(plan.precision["name"])]
    if plan.device == "cuda":
        notes.append(
            "cuda: allocator reserve and context are documented constants "
            "(memory.cuda_reserve_fraction, memory.cuda_context_mb), not yet checked on a GPU"
        )
    return MemoryEstimate(
        device=plan.device,
        params=count_parameters(plan),
        train=_step_memory(plan, batch_size, train=True),
        val=_step_memory(plan, val_batch_size, train=False),
        notes=notes,
    )


def measure(
    cfg: Any,
    batch_size: int | None = None,
    val_batch_size: int | None = None,
    *,
    schema: DataSchema | None = None,
    device: str | None = None,
) -> dict[str, float]:
    """Peak MB of one real training step and one real validation step on `device`: live tensor
    bytes (MemTracker) everywhere, plus the allocator's peaks on CUDA."""
    plan = _plan(cfg, schema, device)
    batch_size, val_batch_size = _batch_sizes(cfg, batch_size, val_batch_size)
    result = {}
    for kind, b, train in (("train", batch_size, True), ("val", val_batch_size, False)):
        parts = run_step(plan, b, train, fake=False, device=plan.device)
        allocated = parts.pop("cuda_max_allocated", None)
        reserved = parts.pop("cuda_max_reserved", None)
        result[f"measured_{kind}_peak_mb"] = round((allocated or sum(parts.values())) / MB, 3)
        if reserved is not None:
            result[f"measured_{kind}_reserved_mb"] = round(reserved / MB, 1)
            result[f"measured_{kind}_tracked_mb"] = round(sum(parts.values()) / MB, 1)
    return result


def largest_fitting(fits: Callable[[int], bool], guess: int, limit: int) -> int:
    """The largest n in [1, limit] with fits(n), for a monotone `fits` that holds at 1: gallop
    from `guess` to bracket the answer (steps 1, 2, 4, ...), then bisect."""
    n, step = max(1, min(guess, limit)), 1
    if fits(n):
        lo, hi = n, limit + 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(lo + step, limit + 1)
    else:
        lo, hi = 0, n
        while hi - step >= 1 and not fits(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(hi - step, 1)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def fixed_val_batch_size(cfg: Any) -> int | None:
    """memory.val_batch_size when it is a number (not null, not auto)."""
    v = cfg.memory.val_batch_size
    return v if isinstance(v, int) else None


def max_batch_size(
    cfg: Any,
    budget_mb: float,
    margin_mb: float | None = None,
    *,
    step: str = "both",
    schema: DataSchema | None = None,
    device: str | None = None,
    limit: int = 1 << 16,
) -> tuple[int, dict[int, int]]:
    """The largest batch size whose steps fit `budget_mb` less `margin_mb` (default
    memory.safety_margin_mb), and the peaks traced on the way {batch size: bytes}. `step`:
    both (training, and validation at memory.val_batch_size or the same size; with
    val_batch_size=auto, training alone), train, or val. Batch 1 not fitting is a ConfigError
    saying what it needs."""
    plan = _plan(cfg, schema, device)
    margin = cfg.memory.safety_margin_mb if margin_mb is None else margin_mb
    budget = (budget_mb - margin) * MB
    fixed_val = fixed_val_batch_size(cfg)
    with_val = step == "val" or (step == "both" and cfg.memory.val_batch_size != "auto")
    peaks: dict[int, int] = {}
    traced: dict[int, StepMemory] = {}

    def peak(b: int) -> int:
        if b not in peaks:
            if step == "val":
                traced[b] = _step_memory(plan, b, train=False)
            else:
                traced[b] = _step_memory(plan, b, train=True)
            peaks[b] = traced[b].total
            if with_val and step != "val" and peaks[b] <= budget:  # only matters if training fits
                peaks[b] = max(peaks[b], _step_memory(plan, fixed_val or b, train=False).total)
        return peaks[b]

    p1 = peak(1)
    if p1 > budget:
        top = sorted(traced[1].parts.items(), key=lambda kv: -kv[1])[:2]
        raise ConfigError(
            f"batch size 1 needs {p1 / MB:.0f} MB but the budget leaves {budget / MB:.0f} MB "
            f"({budget_mb:.0f} MB less a {margin:.0f} MB margin); mostly "
            + ", ".join(f"{k.replace('_', ' ')} {v / MB:.0f} MB" for k, v in top)
            + ": use a smaller model (model.hidden_dim, fewer features) or a shorter "
            "data.encoder_length"
        )
    # the peak is close to affine in the batch size: a second trace gives a good first guess
    p8 = peak(8)
    slope = max((p8 - p1) / 7, 1.0)
    guess = int((budget - p1) / slope) + 1
    return largest_fitting(lambda b: peak(b) <= budget, guess, limit), peaks
