"""One training or validation step, traced for its peak memory without allocating anything.

`run_step` builds the model, its optimizer state and a batch under `FakeTensorMode` (tensors
with shapes and dtypes but no storage) and runs the step training runs
(`foxhunt.training.step`): forward, loss, backward, gradient clipping, optimizer step; or the
validation forward and its loss. PyTorch's `MemTracker` follows every tensor of that trace,
attributes it to parameters, gradients, optimizer state, activations, temporaries or inputs,
and records the peak. Run for real instead (`fake=False`), the same code measures a step.

Where a fake kernel differs from the real one, the difference is modelled here:
- CPU LSTM: oneDNN keeps a workspace for backward that its fake kernel reports as empty;
  `onednn_lstm_workspace_bytes` is the real size (exact at realistic sizes, see tests).
- CUDA, planned from a machine without one: the trace runs on CPU with oneDNN off (PyTorch's
  generic LSTM keeps its gates for backward, as cuDNN's reserve space does), and each LSTM call
  holds the workspace cuDNN allocates inside it (`cudnn_lstm_workspace_bytes`, a bound).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

from foxhunt.data.schema import DataSchema, random_batch
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.memory.budget import MB, counting_suspended
from foxhunt.precision import precision_of
from foxhunt.training.module import build_model, make_optimizer
from foxhunt.training.step import train_step, validation_forward

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


def cudnn_lstm_workspace_bytes(
    seq_len: int, batch: int, hidden: int, layers: int, element_size: int
) -> int:
    """A bound of the workspace cuDNN's LSTM allocates inside a call and frees before it
    returns (no output shows it, so no trace sees it): the gate pre-activations of every step
    and layer, [layers, T, B, 4H] in the compute dtype. Why a bound: the one CUDA run measured
    validation peaks 40-62% above the estimate at tft_small (where the LSTM call is most of a
    validation step) and 0.4-11% at tft_base; cuDNN documents the size only through
    cudnnGetRNNTempSpaceSizes. Unverified on a GPU: benchmarks/gpu_check's estimator section
    measures each validation step with and without cuDNN."""
    return layers * seq_len * batch * 4 * hidden * element_size


@contextmanager
def _cudnn_workspace(model: torch.nn.Module, element_size: int) -> Iterator[None]:
    """Every nn.LSTM of `model` holds `cudnn_lstm_workspace_bytes` while its forward runs."""
    held: list[torch.Tensor] = []

    def pre(lstm: torch.nn.LSTM, args: tuple) -> None:
        batch, seq_len = args[0].shape[:2] if lstm.batch_first else args[0].shape[1::-1]
        size = cudnn_lstm_workspace_bytes(
            seq_len, batch, lstm.hidden_size, lstm.num_layers, element_size
        )
        held.append(torch.empty(size, dtype=torch.uint8, device=args[0].device))

    def post(*_: Any) -> None:
        held.pop()

    lstms = [m for m in model.modules() if isinstance(m, torch.nn.LSTM)]
    handles = [m.register_forward_pre_hook(pre) for m in lstms]
    handles += [m.register_forward_hook(post) for m in lstms]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class _StepTracker(MemTracker):
    """MemTracker keeping only the global peak. Its per-module peaks walk every module on every
    op: half the trace time at tft_small, and nothing here reads them."""

    def _update_peak_stats(self, peak_state: Any) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)


@dataclass(frozen=True)
class StepPlan:
    """What one traced step needs from the composed config."""

    model: dict[str, Any]
    optim: dict[str, Any]
    schema: DataSchema
    clip: float | None  # the training's gradient clipping (trainer.gradient_clip_val)
    checkpointing: bool
    precision: dict[str, Any]
    device: str  # planned for: cpu or cuda


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


def _make_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer state as the first real step does (zero gradients leave the
    parameters as they are but for weight decay)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _release(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Free a measured step's parameters, gradients and optimizer state now: after a training
    step, MemTracker's gradient hooks keep the Parameter objects alive (torch 2.11-2.13: twice
    the parameters' bytes per call stayed allocated, measured on CPU), so their
    storages are emptied rather than left to the garbage collector."""
    optimizer.state.clear()
    for p in model.parameters():
        p.grad = None
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def run_step(
    plan: StepPlan, batch_size: int, train: bool, fake: bool, device: str | None = None
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
        precision = precision_of(plan.precision)
        model = build_model(plan.model, plan.schema, plan.precision, traced=fake)
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
        if fake and plan.device == "cuda":
            bf16 = plan.precision.get("name") == "bf16"
            stack.enter_context(_cudnn_workspace(model, 2 if bf16 else 4))
        stack.enter_context(precision.autocast(torch.device(device).type))  # bf16: bf16-mixed
        model.train(train)
        if train:
            train_step(model, optimizer, batch, quantiles, clip=plan.clip)
        else:  # without autograd, as Lightning's validation loop (inference_mode) runs it
            with torch.no_grad():
                quantile_loss(validation_forward(model, batch), batch["target"], quantiles)
    if not fake:
        _release(model, optimizer)
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
