"""Peak memory of a training step and a validation step, predicted before anything is allocated.

`estimate(cfg, batch_size)` traces the step training runs, under `FakeTensorMode`, with
`foxhunt.memory.trace` (nothing is allocated and no GPU is needed, so a 4 GB card can be
planned from a laptop); `max_batch_size(cfg, budget_mb)` finds the largest batch whose traced
steps fit a budget; `measure` runs the same steps for real, to compare.

Planning CUDA from a machine without one, the caching allocator's reserve and the CUDA context
are added to the trace from documented, overridable constants (memory.cuda_reserve_fraction,
memory.cuda_context_mb; the context as measured on an H200, see docs/performance.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode

from foxhunt.data.schema import DataSchema, footer_schema
from foxhunt.errors import ConfigError
from foxhunt.memory.budget import MB, counting_suspended
from foxhunt.memory.gallop import largest_fitting
from foxhunt.memory.trace import StepMemory, StepPlan, run_step
from foxhunt.precision import precision_of
from foxhunt.training.module import build_model, compile_mode


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


def resolve_device(name: str | None) -> str:
    """`auto` (or None) is cuda when one is present, else cpu; anything else is an error."""
    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"memory.device must be auto, cpu or cuda, got {name!r}")
    return name


def step_plan(cfg: Any, schema: DataSchema | None = None, device: str | None = None) -> StepPlan:
    """The step `estimate`, `measure` and `max_batch_size` trace or run for the composed config
    `cfg`: its model, optimizer, precision, gradient clipping and checkpointing, the data's
    schema (`schema`, else described from cfg.data) and the device (`device`, else
    memory.device; auto resolved)."""
    return StepPlan(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        schema=schema if schema is not None else footer_schema(cfg.data),
        clip=cfg.trainer.gradient_clip_val,
        checkpointing=cfg.memory.gradient_checkpointing,
        precision=OmegaConf.to_container(cfg.precision, resolve=True),
        device=resolve_device(device or cfg.memory.device),
    )


def _step_memory(plan: StepPlan, memory: Any, batch_size: int, train: bool) -> StepMemory:
    """The traced step; planning CUDA, plus the allocator's reserve and the context (`memory`:
    the memory config group)."""
    parts = run_step(plan, batch_size, train, fake=True)
    if plan.device == "cuda":
        traced = sum(parts.values())
        parts["cuda_allocator_reserve"] = math.ceil(traced * memory.cuda_reserve_fraction)
        parts["cuda_context"] = int(memory.cuda_context_mb * MB)
    return StepMemory(batch_size, parts)


def count_parameters(plan: StepPlan) -> int:
    with counting_suspended(), FakeTensorMode():
        model = build_model(plan.model, plan.schema, plan.precision, traced=True)
        return sum(p.numel() for p in model.parameters())


def _batch_sizes(cfg: Any, batch_size: int | None, val_batch_size: int | None) -> tuple[int, int]:
    """The sizes to plan: as given, else data.batch_size and memory.val_batch_size (or the same)."""
    batch_size = batch_size or cfg.data.batch_size
    return batch_size, val_batch_size or fixed_val_batch_size(cfg.memory) or batch_size


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
    plan = step_plan(cfg, schema, device)
    batch_size, val_batch_size = _batch_sizes(cfg, batch_size, val_batch_size)
    notes = [precision_of(plan.precision).memory_note(plan.device)]
    mode = compile_mode(plan.model.get("compile"), plan.device)
    if mode is not None:
        notes.append(
            f"model.compile ({mode}): this traces the eager step; the compiled step keeps "
            "and frees its intermediates in its own order (docs/performance.md)"
        )
    if plan.device == "cuda":
        notes.append(
            "cuda: allocator reserve and context are documented constants "
            "(memory.cuda_reserve_fraction, memory.cuda_context_mb: measured on an H200)"
        )
    return MemoryEstimate(
        device=plan.device,
        params=count_parameters(plan),
        train=_step_memory(plan, cfg.memory, batch_size, train=True),
        val=_step_memory(plan, cfg.memory, val_batch_size, train=False),
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
    plan = step_plan(cfg, schema, device)
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


def fixed_val_batch_size(memory: Any) -> int | None:
    """memory.val_batch_size when it is a number (not null, not auto)."""
    v = memory.val_batch_size
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
    plan, memory = step_plan(cfg, schema, device), cfg.memory
    margin = memory.safety_margin_mb if margin_mb is None else margin_mb
    budget = (budget_mb - margin) * MB
    fixed_val = fixed_val_batch_size(memory)
    with_val = step == "val" or (step == "both" and memory.val_batch_size != "auto")
    peaks: dict[int, int] = {}
    traced: dict[int, StepMemory] = {}

    def peak(b: int) -> int:
        if b not in peaks:
            traced[b] = _step_memory(plan, memory, b, train=step != "val")
            peaks[b] = traced[b].total
            if with_val and step != "val" and peaks[b] <= budget:  # only matters if training fits
                val = _step_memory(plan, memory, fixed_val or b, train=False)
                peaks[b] = max(peaks[b], val.total)
        return peaks[b]

    if peak(limit) <= budget:  # the most asked for fits (predict's few windows): one trace
        return limit, peaks
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
