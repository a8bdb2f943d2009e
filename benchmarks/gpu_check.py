"""The GPU check (#18): foxhunt's CUDA paths measured in one command, within minutes.

    bash benchmarks/gpu_check.sh                      # on the GPU machine: wheels, then this
    python benchmarks/gpu_check.py [--device cuda|cpu] [--quick] [--out DIR] [--budget-s 340]

Sections, each with a time budget; one that fails records its error and the next one runs:
  env        the device, driver, versions, and the memory the CUDA context takes
  fused_vsn  the fused variable selection (forward_scalars) against the plain path, forward and
             backward, float64 / float32 / bf16 autocast, and both paths' time and memory
  budget     device_budget's cap (set_per_process_memory_fraction on CUDA) met by allocations
  estimator  foxhunt.memory.estimate against max_memory_allocated / max_memory_reserved of real
             steps (foxhunt.training.step, after warm-up steps) for tft_small and tft_base (225
             features), fp32 and bf16, three batch sizes; fits memory.cuda_reserve_fraction and
             memory.cuda_context_mb
  seed       scripts/train.py memory=gpu_4gb model=tft_base data.ohlcv.num_features=225, one
             epoch cut by trainer.limit_*_batches: exit status, the searched batch sizes, OOM
             backoffs, the allocator's peaks
  bench_S,   benchmarks/bench_tft.py --config S|B against pytorch-forecasting (--skip-theirs
  bench_B    when it is not installed)
After every section the results so far go to OUT/gpu_check.json; each section prints a table,
and the last line of the output is one JSON object with every figure.

--device cpu runs the same code paths on a CPU (CUDA-only figures are null): with --quick, tiny
sizes and steps, a dry run of the whole check in a few minutes.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from foxhunt.data.schema import random_batch
from foxhunt.files import write_json, write_text
from foxhunt.memory import MB, estimate, measure
from foxhunt.memory.budget import LiveTensorBytes, device_budget, free_memory, live_tensors
from foxhunt.memory.estimator import _plan
from foxhunt.memory.search import BatchSizeSearch
from foxhunt.memory.table import format_table
from foxhunt.models.blocks import VariableSelectionNetwork
from foxhunt.training.metrics import quantile_loss
from foxhunt.training.module import build_model, make_optimizer
from foxhunt.training.step import train_step, validation_forward

try:  # Hydra: the GPU machine has it only once gpu_check.sh has installed the carried wheels
    from bench_memory import MODELS, compose_config
    from bench_tft import sync
except ModuleNotFoundError as exc:
    print(f"gpu_check: no module {exc.name!r}: run benchmarks/gpu_check.sh", file=sys.stderr)
    sys.exit(2)

ROOT = Path(__file__).resolve().parents[1]
BENCH_TFT = ROOT / "benchmarks" / "bench_tft.py"
TRAIN_SCRIPT = ROOT / "scripts" / "train.py"

# Norm-wise relative error of the fused path against a float64 reference of the plain path.
# float64: the paths agree to ~1e-8 (the fused selection weights resample the embedding with a
# float32 interpolation weight); float32: ~1e-6, the plain path itself ~1e-5 (measured on CPU);
# bf16 autocast: tests/models/test_fused_vsn.py's bounds (forward 2e-2, backward 4e-2). A case
# also passes when the fused error is no larger than the plain path's in the same precision.
# the reserve fraction is fitted on the steps whose estimate is at least this large
FIT_FROM_MB = 256
VSN_TOLERANCE = {"float64": (1e-6, 1e-6), "float32": (1e-5, 1e-5), "bf16": (2e-2, 4e-2)}


@dataclass(frozen=True)
class Sizes:
    """What a run of the check does: the full check on a GPU, or a quick dry run."""

    batch_sizes: tuple[int, ...]
    warmup: int  # untimed training steps before the measured ones
    steps: int  # measured training steps
    seed_overrides: tuple[str, ...]  # scripts/train.py's, besides the scenario's own
    vsn: tuple[int, int, int, int, int, int]  # variables, variable_dim, hidden, context, B, T
    vsn_repeats: int
    bench_configs: tuple[str, ...]
    bench_args: tuple[str, ...]


FULL = Sizes(
    batch_sizes=(32, 128, 512),
    warmup=2,
    steps=3,
    seed_overrides=(
        "model=tft_base",
        "data.ohlcv.num_features=225",
        # one epoch, cut so that it takes well under 90 s on a GPU
        "trainer.limit_train_batches=60",
        "trainer.limit_val_batches=10",
        "trainer.limit_test_batches=10",
    ),
    vsn=(227, 64, 256, 256, 32, 64),  # tft_base's encoder selection: 225 features, target, time
    vsn_repeats=3,
    bench_configs=("S", "B"),
    bench_args=(),
)
QUICK = Sizes(
    batch_sizes=(2, 4),
    warmup=1,
    steps=1,
    seed_overrides=(
        "model=tft_small",
        "memory.batch_size_search.max_batch_size=32",
        "memory.batch_size_search.max_trials=4",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
    ),
    vsn=(7, 4, 8, 8, 3, 5),
    vsn_repeats=1,
    bench_configs=("S",),  # B: 77M parameters, a TFLOP a step; minutes on a CPU, GPU only
    bench_args=("--steps", "1", "--eval-batches", "1", "--repeats", "1", "--warmup", "0"),
)


def log(message: str) -> None:
    print(message, flush=True)


def mb(n_bytes: float | None) -> float | None:
    return None if n_bytes is None else round(n_bytes / MB, 1)


def cell(value: Any, fmt: str = ".1f") -> str:
    if value is None:
        return "-"
    return format(value, fmt) if isinstance(value, float | int) else str(value)


def rel(got: float | None, want: float | None) -> float | None:
    """(got - want) / want, or None."""
    return None if got is None or not want else (got - want) / want


# --- the device and its context ------------------------------------------------------------


def nvidia_smi() -> dict[str, Any] | None:
    """nvidia-smi's view of GPU 0 (it creates no CUDA context in this process), or None."""
    query = "name,driver_version,memory.used,memory.total"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    name, driver, used, total = (s.strip() for s in out.splitlines()[0].split(","))
    return {"name": name, "driver": driver, "used_mb": float(used), "total_mb": float(total)}


def cuda_usage(device: torch.device, others_mb: float | None) -> dict[str, float | None]:
    """The device's used memory now, the allocator's part of it, and the rest: this process's
    CUDA context (kernels, cuBLAS/cuDNN handles) once what others held (`others_mb`) is taken
    off."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used, reserved = (total - free) / MB, torch.cuda.memory_reserved(device) / MB
    context = None if others_mb is None else round(used - reserved - others_mb, 1)
    return {
        "device_used_mb": round(used, 1),
        "reserved_mb": round(reserved, 1),
        "allocated_mb": round(torch.cuda.memory_allocated(device) / MB, 1),
        "context_mb": context,
    }


def warm_libraries(device: torch.device) -> None:
    """One small call into each library a TFT step loads (cuBLAS fp32 and bf16, cuDNN's LSTM,
    attention, LayerNorm), forward and backward: with CUDA's lazy loading the context grows as
    they load."""
    lstm = nn.LSTM(32, 32, batch_first=True).to(device)
    x = torch.randn(4, 8, 32, device=device, requires_grad=True)
    for bf16 in (False, True):
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            out = lstm(x)[0]
            q = out.unsqueeze(1)
            out = F.scaled_dot_product_attention(q, q, q).squeeze(1) @ torch.randn(
                32, 32, device=device
            )
            loss = F.layer_norm(out, (32,)).float().sum()
        loss.backward()
    sync(device)


# --- the check's state and its sections ------------------------------------------------------


@dataclass
class Check:
    device: torch.device
    sizes: Sizes
    out: Path
    results: dict[str, Any] = field(default_factory=dict)
    others_mb: float | None = None  # device memory in use before this process touched CUDA

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def save(self) -> None:
        write_text(self.out / "gpu_check.json", json.dumps(self.results, indent=1, default=str))


def section_env(check: Check, budget_s: float) -> dict[str, Any]:
    device = check.device
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "lightning": L.__version__,
        "hydra": _version("hydra-core"),
        "omegaconf": _version("omegaconf"),
        "pytorch_forecasting": _version("pytorch-forecasting"),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "threads": torch.get_num_threads(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "device_name": platform.processor() or "cpu",
    }
    usage: dict[str, Any] = {}
    if check.cuda:
        smi = check.results["env"]["nvidia_smi_before"]  # taken before CUDA was touched
        props = torch.cuda.get_device_properties(device)
        env |= {
            "device_name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "total_memory_mb": mb(props.total_memory),
            "driver": smi and smi["driver"],
            "cudnn": torch.backends.cudnn.version(),
            "used_before_mb": check.others_mb,
        }
        torch.zeros(1, device=device)  # the context, nothing else
        usage["after_init"] = cuda_usage(device, check.others_mb)
        warm_libraries(device)
        free_memory(device)
        usage["after_libraries"] = cuda_usage(device, check.others_mb)
        # what stays allocated with no tensor alive: cuBLAS workspaces (the caching allocator
        # holds them), counted in max_memory_allocated but in no traced step
        env["persistent_allocated_mb"] = usage["after_libraries"]["allocated_mb"]
    rows = [[k, cell(v, "")] for k, v in env.items()]
    for k, u in usage.items():
        rows.append(
            [
                f"context {k.replace('_', ' ')}",
                f"{cell(u['context_mb'])} MB (device used {u['device_used_mb']:.0f} MB, "
                f"reserved {u['reserved_mb']:.0f} MB)",
            ]
        )
    log(format_table(["", ""], rows))
    return env | usage


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- (1) the estimator against real steps -----------------------------------------------------


@contextmanager
def peaks(device: torch.device) -> Iterator[Callable[[], dict[str, int | None]]]:
    """Peak memory of what runs inside, read by the yielded function (which also resets it):
    the allocator's peaks on CUDA, the live-tensor peak on CPU (foxhunt's own counter)."""
    counter = None if device.type == "cuda" else LiveTensorBytes()
    sync(device)
    if counter is None:
        torch.cuda.reset_peak_memory_stats(device)

    def read_and_reset() -> dict[str, int | None]:
        sync(device)
        if counter is not None:
            got = {"allocated": counter.peak, "reserved": None}
            counter.reset_peak()
            return got
        got = {
            "allocated": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.max_memory_reserved(device),
        }
        torch.cuda.reset_peak_memory_stats(device)
        return got

    with counter if counter is not None else nullcontext():
        yield read_and_reset


def real_steps(cfg: Any, batch_size: int, device: torch.device, sizes: Sizes) -> dict[str, Any]:
    """Peaks of real training steps at `batch_size` after `sizes.warmup` steps (the optimizer
    state and the allocator's cache settled), then of one validation step at the same size with
    the gradients released first, as Lightning does; each step under bf16 autocast for
    precision=bf16, as the estimator traces it."""
    plan = _plan(cfg, None, device.type)
    persistent = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    bf16 = plan.precision["name"] == "bf16"

    def amp() -> torch.autocast:
        return torch.autocast(device.type, torch.bfloat16, enabled=bf16)

    with peaks(device) as read:
        model = build_model(plan.model, plan.schema, plan.precision).to(device)
        model.gradient_checkpointing = plan.checkpointing
        optimizer = make_optimizer(model.parameters(), plan.optim)
        batch = random_batch(plan.schema, batch_size, device)
        quantiles = torch.tensor(plan.model["quantiles"], device=device)
        model.train()
        for _ in range(sizes.warmup):
            with amp():
                train_step(model, optimizer, batch, quantiles, clip=plan.clip)
        read()
        start = time.perf_counter()
        for _ in range(sizes.steps):
            with amp():
                train_step(model, optimizer, batch, quantiles, clip=plan.clip)
        train = read()
        step_s = (time.perf_counter() - start) / sizes.steps
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        read()
        with amp():
            quantile_loss(validation_forward(model, batch), batch["target"], quantiles)
        val = read()
        del model, optimizer, batch
    free_memory(device)
    return {"train": train, "val": val, "step_s": step_s, "persistent": persistent}


def estimator_case(check: Check, model: str, precision: str, batch_size: int) -> dict[str, Any]:
    cfg = compose_config([*MODELS[model], f"precision={precision}"])
    device = check.device
    start = time.perf_counter()
    est = estimate(cfg, batch_size, batch_size, device=device.type)  # before any allocation
    row: dict[str, Any] = {
        "model": model,
        "precision": precision,
        "batch_size": batch_size,
        "params": est.params,
        "estimate_s": round(time.perf_counter() - start, 2),
    }
    real = real_steps(cfg, batch_size, device, check.sizes)
    row["persistent_allocated_mb"] = mb(real["persistent"])
    row["train_step_ms"] = round(real["step_s"] * 1000, 2)
    for kind, step in (("train", est.train), ("val", est.val)):
        measured = real[kind]
        row |= {
            f"{kind}_estimate_mb": mb(step.allocated),
            f"{kind}_estimate_device_mb": mb(step.total) if check.cuda else None,
            f"{kind}_allocated_mb": mb(measured["allocated"]),
            f"{kind}_reserved_mb": mb(measured["reserved"]),
            f"{kind}_error": rel(step.allocated, measured["allocated"]),
        }
    # foxhunt.memory.measure: the one-step measurement (MemTracker, and the allocator on CUDA)
    try:
        one = measure(cfg, batch_size, batch_size, device=device.type)
        row["measure_one_step"] = one
        row["one_step_train_mb"] = one["measured_train_peak_mb"]
    except Exception as exc:  # noqa: BLE001 - a figure of its own; the case stands
        row["measure_one_step"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    free_memory(device)
    return row


def section_estimator(check: Check, budget_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + budget_s
    cases = [
        (model, precision, b)
        for model in MODELS
        for precision in ("fp32", "bf16")
        for b in check.sizes.batch_sizes
    ]
    rows, skipped = [], []
    for model, precision, b in cases:
        if time.monotonic() > deadline:
            skipped.append(f"{model}/{precision}/{b}")
            continue
        log(f"[estimator] {model} {precision} batch {b} ...")
        try:
            rows.append(estimator_case(check, model, precision, b))
        except torch.OutOfMemoryError as exc:
            free_memory(check.device)
            rows.append(
                {
                    "model": model,
                    "precision": precision,
                    "batch_size": b,
                    "error": f"OutOfMemoryError: {str(exc)[:200]}",
                }
            )
    table = [
        [
            r["model"],
            r["precision"],
            str(r["batch_size"]),
            *(
                cell(r.get(key), fmt)
                for key, fmt in (
                    ("train_estimate_mb", ".1f"),
                    ("train_allocated_mb", ".1f"),
                    ("train_error", "+.1%"),
                    ("train_reserved_mb", ".1f"),
                    ("train_estimate_device_mb", ".1f"),
                    ("val_estimate_mb", ".1f"),
                    ("val_allocated_mb", ".1f"),
                    ("val_error", "+.1%"),
                    ("one_step_train_mb", ".1f"),
                    ("persistent_allocated_mb", ".1f"),
                    ("train_step_ms", ".1f"),
                    ("estimate_s", ".1f"),
                )
            ),
        ]
        for r in rows
    ]
    header = "model|prec|batch|train est|alloc|error|reserved|plan total|val est|alloc|error"
    header += "|1-step|persistent|step ms|est s"
    log(
        "MB. error: estimate / measured - 1 (the allocator's peak after warm-up steps; live "
        "tensors on CPU); plan total: estimate + reserve + context; 1-step: "
        "foxhunt.memory.measure's training step; persistent: allocated before the model "
        "(cuBLAS workspaces)"
    )
    log(format_table(header.split("|"), table, align="lll"))
    result: dict[str, Any] = {"rows": rows, "skipped_cases": skipped}
    errors = [
        abs(r[f"{k}_error"])
        for r in rows
        for k in ("train", "val")
        if r.get(f"{k}_error") is not None
    ]
    result["worst_abs_error"] = max(errors, default=None)
    if check.cuda:
        result["fit"] = fit_constants(check, rows)
        log(format_table(["constant", "current", "fitted", ""], result["fit"]["table"], "lrrl"))
    if skipped:
        log(f"skipped (time budget): {', '.join(skipped)}")
    return result


def fit_constants(check: Check, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """memory.cuda_reserve_fraction and memory.cuda_context_mb from the measurements: the
    fraction of the estimate that reaches every measured reserved peak (estimate x (1 + f) >=
    reserved) of the steps large enough for a budget to matter (FIT_FROM_MB; below it the
    allocator's 2 and 20 MB segments make any fraction large), and the context measured after
    all those steps ran."""
    cfg = compose_config(MODELS["tft_small"])
    current_fraction, current_context = (
        cfg.memory.cuda_reserve_fraction,
        cfg.memory.cuda_context_mb,
    )
    needed, needed_all, allocator, overhead = [], [], [], []
    for r in rows:
        for k in ("train", "val"):
            est, alloc, res = (
                r.get(f"{k}_{s}") for s in ("estimate_mb", "allocated_mb", "reserved_mb")
            )
            if est and alloc and res:
                needed_all.append(res / est - 1)
                overhead.append(res - est)
                if est >= FIT_FROM_MB:
                    needed.append(res / est - 1)
                    allocator.append(res / alloc - 1)
    usage = cuda_usage(check.device, check.others_mb)
    fit = {
        "cuda_reserve_fraction_current": current_fraction,
        "cuda_reserve_fraction_fit": max(needed, default=None),
        "cuda_reserve_fraction_median": statistics.median(needed) if needed else None,
        "cuda_reserve_fraction_fit_all_sizes": max(needed_all, default=None),
        "reserved_over_allocated_max": max(allocator, default=None),
        "reserved_over_allocated_median": statistics.median(allocator) if allocator else None,
        "reserved_minus_estimate_max_mb": max(overhead, default=None),
        "cuda_context_mb_current": current_context,
        "cuda_context_mb_fit": usage["context_mb"],
        "usage_after_steps": usage,
    }
    fit["table"] = [
        [
            "cuda_reserve_fraction",
            cell(current_fraction, ".3f"),
            cell(fit["cuda_reserve_fraction_fit"], ".3f"),
            f"max over steps from {FIT_FROM_MB} MB of reserved / estimate - 1 (median "
            f"{cell(fit['cuda_reserve_fraction_median'], '.3f')}; allocator alone: reserved / "
            f"allocated - 1 up to {cell(fit['reserved_over_allocated_max'], '.3f')})",
        ],
        [
            "cuda_context_mb",
            cell(current_context),
            cell(usage["context_mb"]),
            "device used - reserved - used before this process, after all steps",
        ],
    ]
    return fit


# --- (2a) the budget's cap --------------------------------------------------------------------


def section_budget(check: Check, budget_s: float) -> dict[str, Any]:
    """Allocate 64 MB blocks under device_budget(1024 MB) until the cap answers with an OOM;
    then, outside it, more than the cap must allocate again."""
    device, budget_mb, block = check.device, 1024, 64 * MB
    held: list[Tensor] = []
    error = None
    free_memory(device)
    before = torch.cuda.memory_allocated(device) if check.cuda else 0
    with device_budget(device, budget_mb) as counter:
        try:
            while len(held) * block < 4 * budget_mb * MB:
                held.append(torch.empty(block, dtype=torch.uint8, device=device))
        except torch.OutOfMemoryError as exc:
            error = " ".join(str(exc).split())[:200]
        at_oom = {
            "blocks": len(held),
            "allocated_mb": mb(len(held) * block + before),
            "reserved_mb": mb(torch.cuda.memory_reserved(device)) if check.cuda else None,
            "live_mb": mb(counter.live) if counter is not None else None,
        }
    held.clear()
    free_memory(device)
    restored = torch.empty(2 * budget_mb * MB, dtype=torch.uint8, device=device)
    del restored
    free_memory(device)
    ok = error is not None and at_oom["allocated_mb"] <= budget_mb
    result = {
        "status": "ok" if ok else "fail",
        "budget_mb": budget_mb,
        "oom_error": error,
        "at_oom": at_oom,
        "allocates_beyond_after_exit": True,
    }
    log(
        format_table(
            ["budget MB", "blocks of 64 MB", "allocated MB", "reserved MB", "OOM raised"],
            [
                [
                    str(budget_mb),
                    str(at_oom["blocks"]),
                    cell(at_oom["allocated_mb"]),
                    cell(at_oom["reserved_mb"]),
                    "yes" if error else "NO",
                ]
            ],
            align="rrrrl",
        )
    )
    return result


# --- (2) the seed scenario ------------------------------------------------------------------


class SeedProbe(L.Callback):
    """What the seed scenario's training run did, written to `path` as it goes (gpu_check adds
    it with +callbacks.gpu_check_probe._target_=gpu_check.SeedProbe): the searched batch sizes
    as soon as the search is over, then each phase's peaks (the allocator's on CUDA, the live
    tensors' on CPU) and batches, and at the end this process's CUDA context."""

    def __init__(self, path: str, others_mb: float | None = None) -> None:
        self.path = Path(path)
        self.others_mb = others_mb
        self.data: dict[str, Any] = {"phases": {}}
        self._started = time.perf_counter()
        self._epoch_started = 0.0

    def _write(self) -> None:
        self.data["seconds"] = round(time.perf_counter() - self._started, 1)
        write_json(self.path, self.data)

    def _peak(self, phase: str, device: torch.device) -> None:
        p = self.data["phases"].setdefault(
            phase, {"batches": 0, "peak_allocated_mb": 0.0, "peak_reserved_mb": None}
        )
        p["batches"] += 1
        if device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(device) / MB
            reserved = torch.cuda.max_memory_reserved(device) / MB
            p["peak_reserved_mb"] = round(max(p["peak_reserved_mb"] or 0.0, reserved), 1)
        else:
            counter = live_tensors()
            allocated = counter.peak / MB if counter is not None else 0.0
        p["peak_allocated_mb"] = round(max(p["peak_allocated_mb"], allocated), 1)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after BatchSizeSearch's on_fit_start: the memory callbacks come before configured ones
        search = next((c for c in trainer.callbacks if isinstance(c, BatchSizeSearch)), None)
        if search is not None:
            self.data["search"] = {
                "batch_size": search.batch_size,
                "val_batch_size": search.val_batch_size,
                "trials": search.trials,
                "done_at_s": round(time.perf_counter() - self._started, 1),
            }
        self._write()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        self._peak("train", pl_module.device)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any
    ) -> None:
        self._peak("sanity" if trainer.sanity_checking else "val", pl_module.device)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        self._peak("test", pl_module.device)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.data["epoch_s"] = round(time.perf_counter() - self._epoch_started, 1)
        self.data["global_step"] = trainer.global_step
        self._write()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if pl_module.device.type == "cuda":
            self.data[f"usage_end_{stage}"] = cuda_usage(pl_module.device, self.others_mb)
        self._write()


def section_seed(check: Check, budget_s: float) -> dict[str, Any]:
    """The predecessor's scenario through the real entry point, in its own process."""
    free_memory(check.device)
    others = None
    if check.cuda:  # what this process holds on the device: not the training run's
        free, total = torch.cuda.mem_get_info(check.device)
        others = round((total - free) / MB, 1)
    with tempfile.TemporaryDirectory(prefix="gpu_check_seed_") as tmp:
        run_dir = Path(tmp) / "run"
        probe = Path(tmp) / "probe.json"
        overrides = [
            "memory=gpu_4gb",
            *check.sizes.seed_overrides,
            f"trainer.accelerator={'gpu' if check.cuda else 'cpu'}",
            "trainer.devices=1",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            "report=false",
            f"hydra.run.dir={run_dir}",
            "+callbacks.gpu_check_probe._target_=gpu_check.SeedProbe",
            f"+callbacks.gpu_check_probe.path={probe}",
            f"+callbacks.gpu_check_probe.others_mb={'null' if others is None else others}",
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "benchmarks"), str(ROOT / "src"), env.get("PYTHONPATH")) if p
        )
        cmd = [sys.executable, str(TRAIN_SCRIPT), *overrides]
        log("[seed] " + " ".join(cmd[1:]))
        start = time.perf_counter()
        log_path = check.out / "seed_train.log"
        with open(log_path, "w") as out:
            try:
                code = subprocess.run(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=budget_s,
                ).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        wall_s = round(time.perf_counter() - start, 1)
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        observed = json.loads(probe.read_text()) if probe.is_file() else {}
    # the last lines of the training's output (its last line is the whole summary: cut)
    tail = [line[:300] for line in log_path.read_text().splitlines()[-15:]]
    memory, search = summary.get("memory", {}), observed.get("search") or {}
    phases = observed.get("phases", {})
    peak_reserved = max((p["peak_reserved_mb"] or 0 for p in phases.values()), default=None)
    context = (observed.get("usage_end_fit") or {}).get("context_mb")
    result = {
        "status": "ok" if code == 0 else "fail",
        "overrides": overrides[:-3],
        "limits_note": "one epoch, cut by trainer.limit_train/val/test_batches (see overrides)",
        "exit_code": code,
        "wall_s": wall_s,
        "batch_size": summary.get("batch_size", search.get("batch_size")),
        "val_batch_size": summary.get("val_batch_size", search.get("val_batch_size")),
        "search": search,
        "oom_backoffs": memory.get("oom_backoffs"),
        "micro_batch_size": memory.get("micro_batch_size"),
        "optimizer_state_released_mb": memory.get("optimizer_state_released_mb"),
        "memory_log": memory.get("log"),
        "memory_log_peak_mb": memory.get("peak_mb"),
        "phases": phases,
        "epoch_s": observed.get("epoch_s"),
        "global_step": observed.get("global_step", summary.get("global_step")),
        "peak_reserved_mb": peak_reserved,
        "context_mb": context,
        # a real 4 GB card also holds the context: would the run have fit one?
        "reserved_plus_context_mb": None
        if not peak_reserved or context is None
        else round(peak_reserved + context, 1),
        "num_parameters": summary.get("num_parameters"),
        "metrics": summary.get("metrics"),
        "summary_wall_s": summary.get("wall_s"),
        "log_tail": tail if code != 0 else tail[-3:],
    }
    trials = search.get("trials") or []
    rows = [
        ["exit", str(code)],
        ["batch size (searched)", cell(result["batch_size"], "")],
        ["val batch size (searched)", cell(result["val_batch_size"], "")],
        [
            "search trials: batch (peak MB)",
            ", ".join(
                f"{'val ' if t['kind'] == 'val' else ''}{t['batch_size']} ({t['peak_mb']:.0f}"
                f"{'' if t['fits'] else ', no fit'})"
                for t in trials
            ),
        ],
        ["OOM backoffs", cell(len(result["oom_backoffs"] or []), "d")],
        ["epoch s (train+val)", cell(result["epoch_s"])],
        ["train steps", cell(result["global_step"], "")],
        *[
            [
                f"peak {k} alloc / reserved MB",
                f"{cell(p['peak_allocated_mb'])} / {cell(p['peak_reserved_mb'])} ({p['batches']} "
                "batches)",
            ]
            for k, p in phases.items()
        ],
        ["context MB (training process)", cell(context)],
        ["reserved + context MB (vs 4096)", cell(result["reserved_plus_context_mb"])],
        ["wall s", cell(wall_s)],
    ]
    log(format_table(["seed scenario", ""], rows))
    if code != 0:
        log("\n".join(tail))
    return result


# --- (3) the fused variable selection --------------------------------------------------------


def vsn_problem(
    sizes: Sizes, device: torch.device
) -> tuple[VariableSelectionNetwork, list[Tensor]]:
    """A variable selection network moved off its initial values (so every term matters), its
    inputs (x, the embedding's w and b, the context) and output cotangents, on `device`."""
    n, dim, hidden, context, b, t = sizes.vsn
    g = torch.Generator().manual_seed(0)
    vsn = VariableSelectionNetwork(n, dim, hidden, 0.1, context).eval()
    with torch.no_grad():
        for p in vsn.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    shapes = [(b, t, n), (n, dim), (n, dim), (b, 1, context), (b, t, hidden), (b, t, n)]
    return vsn.to(device), [torch.randn(s, generator=g).to(device) for s in shapes]


def vsn_pass(
    model: nn.Module, data: list[Tensor], fused: bool, bf16: bool
) -> tuple[list[Tensor], list[str]]:
    """Forward (fused: forward_scalars, else the plain embedding path) and backward of
    <out, d_out> + <weights, d_weights> in the model's dtype (under bf16 autocast with `bf16`);
    returns [out, weights, *gradients] and their names."""
    dtype = next(model.parameters()).dtype
    x, w, b = (t.detach().to(dtype).requires_grad_() for t in data[:3])
    context, d_out, d_weights = (t.to(dtype) for t in data[3:])
    with torch.autocast(x.device.type, torch.bfloat16, enabled=bf16):
        if fused:
            out, weights = model.forward_scalars(x, (w, b), context)
        else:
            out, weights = model(x.unsqueeze(-1) * w + b, context)
    loss = (out.to(dtype) * d_out).sum() + (weights.to(dtype) * d_weights).sum()
    names = ["x", "w", "b", *(n for n, _ in model.named_parameters())]
    grads = torch.autograd.grad(loss, [x, w, b, *model.parameters()])
    return [out.detach(), weights.detach(), *grads], ["output", "weights", *names]


def rel_errors(got: list[Tensor], want: list[Tensor], names: list[str]) -> dict[str, Any]:
    """Norm-wise relative errors: the forward's worst (output, weights), the backward's worst
    gradient (and which), and the largest elementwise absolute error."""
    errors = [
        float((g.double() - w).norm() / w.norm().clamp_min(1e-30))
        for g, w in zip(got, want, strict=True)
    ]
    max_abs = max(float((g.double() - w).abs().max()) for g, w in zip(got, want, strict=True))
    worst = max(range(2, len(errors)), key=errors.__getitem__)
    return {
        "forward": max(errors[:2]),
        "backward": errors[worst],
        "worst_gradient": names[worst],
        "max_abs": max_abs,
    }


def time_vsn(
    vsn: nn.Module, data: list[Tensor], fused: bool, bf16: bool, repeats: int
) -> dict[str, float | None]:
    """ms per float32 forward and backward (after one warm-up) and the peak MB above what was
    held."""
    device = data[0].device
    vsn_pass(vsn, data, fused, bf16)
    free_memory(device)
    held = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    with peaks(device) as read:
        read()
        start = time.perf_counter()
        for _ in range(repeats):
            vsn_pass(vsn, data, fused, bf16)
        sync(device)
        ms = (time.perf_counter() - start) * 1000 / repeats
        peak = read()["allocated"]
    return {"ms": round(ms, 2), "peak_mb": mb(peak - held) if peak is not None else None}


def section_fused_vsn(check: Check, budget_s: float) -> dict[str, Any]:
    device = check.device
    vsn, data = vsn_problem(check.sizes, device)
    # fp32 matmuls in full precision for the comparison (TF32 would be a 1e-3 error)
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        vsn64 = copy.deepcopy(vsn).double()
        reference, names = vsn_pass(vsn64, data, fused=False, bf16=False)
        cases: dict[str, Any] = {}
        for label, model, bf16 in (
            ("float64", vsn64, False),
            ("float32", vsn, False),
            ("bf16", vsn, True),
        ):
            fused = rel_errors(vsn_pass(model, data, True, bf16)[0], reference, names)
            plain = rel_errors(vsn_pass(model, data, False, bf16)[0], reference, names)
            free_memory(device)
            tol_forward, tol_backward = VSN_TOLERANCE[label]
            ok = fused["forward"] <= max(tol_forward, plain["forward"]) and fused[
                "backward"
            ] <= max(tol_backward, plain["backward"])
            cases[label] = {
                "fused": fused,
                "plain": plain,
                "tolerance": [tol_forward, tol_backward],
                "pass": ok,
            }
        del reference, vsn64
        free_memory(device)
        timings = {
            f"{'fused' if fused else 'plain'}_{'bf16' if bf16 else 'fp32'}": time_vsn(
                vsn, data, fused, bf16, check.sizes.vsn_repeats
            )
            for bf16 in (False, True)
            for fused in (True, False)
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    n, dim, hidden, context, b, t = check.sizes.vsn
    log(
        f"{n} variables, variable_dim {dim}, hidden {hidden}, context {context}, rows {b}x{t}; "
        "norm-wise relative error against the plain path in float64"
    )
    rows = [
        [
            label,
            cell(c["fused"]["forward"], ".2e"),
            cell(c["plain"]["forward"], ".2e"),
            cell(c["fused"]["backward"], ".2e"),
            cell(c["plain"]["backward"], ".2e"),
            c["fused"]["worst_gradient"],
            f"{c['tolerance'][0]:.0e}/{c['tolerance'][1]:.0e}",
            "pass" if c["pass"] else "FAIL",
        ]
        for label, c in cases.items()
    ]
    log(
        format_table(
            ["", "fwd fused", "plain", "bwd fused", "plain", "worst grad", "tol", ""],
            rows,
            align="lrrrrlrl",
        )
    )
    log(
        format_table(
            ["fwd+bwd", "ms", "peak MB"],
            [[k, cell(v["ms"], ".2f"), cell(v["peak_mb"])] for k, v in timings.items()],
            align="lrr",
        )
    )
    return {
        "status": "ok" if all(c["pass"] for c in cases.values()) else "fail",
        "shape": dict(
            zip(
                ["variables", "variable_dim", "hidden", "context", "batch", "time"],
                check.sizes.vsn,
                strict=True,
            )
        ),
        "cases": cases,
        "timings": timings,
    }


# --- (4) the side-by-side bench ---------------------------------------------------------------


def bench_section(config: str) -> Callable[[Check, float], dict[str, Any]]:
    def run(check: Check, budget_s: float) -> dict[str, Any]:
        if config not in check.sizes.bench_configs:
            return {"status": "skipped", "why": f"config {config} is not run with --quick"}
        deadline = time.monotonic() + budget_s
        theirs = importlib.util.find_spec("pytorch_forecasting") is not None
        result = run_bench(check, config, theirs, deadline)
        if theirs and "pytorch-forecasting:" in result.get("stderr_tail", ""):
            # theirs would not import (bench_tft says so at once): ours alone, on the same time
            log("pytorch-forecasting does not import: ours alone")
            failed = result["stderr_tail"][-500:]
            result = run_bench(check, config, False, deadline) | {"theirs_error": failed}
        return result

    return run


def run_bench(check: Check, config: str, theirs: bool, deadline: float) -> dict[str, Any]:
    """benchmarks/bench_tft.py in its own process; its figures from its last line (JSON)."""
    free_memory(check.device)
    cmd = [sys.executable, str(BENCH_TFT), "--config", config, "--device", check.device.type]
    cmd += [*check.sizes.bench_args, *([] if theirs else ["--skip-theirs"])]
    log("[bench] " + " ".join(cmd[1:]))
    timeout = max(deadline - time.monotonic(), 1)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        log(out)
        return {"status": "timeout", "stdout": out[-2000:], "stderr_tail": err[-2000:]}
    lines = proc.stdout.strip().splitlines()
    log("\n".join(lines[:-1]))
    if proc.returncode != 0 or not lines:
        log(proc.stderr[-3000:])
        return {"status": "fail", "exit_code": proc.returncode, "stderr_tail": proc.stderr[-3000:]}
    bench = json.loads(lines[-1])
    ours, them = bench["ours"], bench["theirs"] or {}
    return {
        "theirs": theirs,
        "train_speedup": bench["train_speedup"],
        "eval_speedup": bench["eval_speedup"],
        "memory_ratio": bench["memory_ratio"],
        "param_ratio": bench["param_ratio"],
        "ours_train_samples_per_s": ours["train_samples_per_s"],
        "theirs_train_samples_per_s": them.get("train_samples_per_s"),
        "ours_peak_mib": ours["peak_mib"],
        "theirs_peak_mib": them.get("peak_mib"),
        "bench": bench,
    }


# --- main -------------------------------------------------------------------------------------

# name, function, most seconds it may take, least it needs to be worth starting
SECTIONS: list[tuple[str, Callable[[Check, float], dict[str, Any]], float, float]] = [
    ("env", section_env, 20, 0),
    ("fused_vsn", section_fused_vsn, 30, 5),
    ("budget", section_budget, 10, 2),
    ("estimator", section_estimator, 95, 20),
    ("seed", section_seed, 140, 45),
    ("bench_S", bench_section("S"), 40, 15),
    ("bench_B", bench_section("B"), 70, 25),
]


def headline(name: str, s: dict[str, Any]) -> str:
    """One line of a section's figures for the closing table."""
    try:
        return _headline(name, s)
    except (KeyError, TypeError, ValueError):  # an unforeseen shape: the JSON has it all
        return "(see the JSON)"


def _headline(name: str, s: dict[str, Any]) -> str:
    if s.get("status") == "timeout":
        return f"timed out after {s.get('budget_s')} s"
    if s.get("status") in ("error", "skipped"):
        return (s.get("error") or s.get("why") or "")[:90]
    if name == "env":
        ctx = (s.get("after_libraries") or {}).get("context_mb")
        return f"{s.get('device_name')}, torch {s['torch']}, CUDA {s['torch_cuda']}, " + (
            f"driver {s.get('driver')}, context {ctx} MB" if ctx is not None else "no CUDA"
        )
    if name == "estimator":
        fit = s.get("fit") or {}
        return (
            f"worst |error| {cell(s.get('worst_abs_error'), '.1%')}; fitted reserve fraction "
            f"{cell(fit.get('cuda_reserve_fraction_fit'), '.3f')}, context "
            f"{cell(fit.get('cuda_context_mb_fit'))} MB"
        )
    if name == "budget":
        return f"OOM at {s['at_oom']['allocated_mb']} MB of {s['budget_mb']} MB"
    if name == "seed":
        return (
            f"exit {s['exit_code']}, batch {s['batch_size']}, val batch {s['val_batch_size']}, "
            f"{len(s.get('oom_backoffs') or [])} backoffs, reserved+context "
            f"{cell(s.get('reserved_plus_context_mb'))} MB, {s['wall_s']} s"
        )
    if name == "fused_vsn":
        return ", ".join(
            f"{k} {'pass' if c['pass'] else 'FAIL'} ({c['fused']['backward']:.1e})"
            for k, c in s["cases"].items()
        )
    if name.startswith("bench"):
        return (
            f"train speedup {cell(s.get('train_speedup'), '.2f')}, eval speedup "
            f"{cell(s.get('eval_speedup'), '.2f')}, memory ratio "
            f"{cell(s.get('memory_ratio'), '.2f')}" + ("" if s.get("theirs") else ", ours only")
        )
    return ""


def run_section(
    check: Check, name: str, fn: Callable[[Check, float], dict[str, Any]], budget_s: float
) -> None:
    log(f"\n=== {name} (budget {budget_s:.0f} s) ===")
    start = time.perf_counter()
    try:
        figures = {"status": "ok"} | fn(check, budget_s)
    except Exception as exc:  # noqa: BLE001 - recorded; the next section runs
        tb = traceback.format_exc().splitlines()
        figures = {
            "status": "error",
            "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}",
            "traceback": tb[-12:],
        }
        log("\n".join(tb[-12:]))
    try:
        free_memory(check.device)
    except Exception:  # noqa: BLE001 - a broken CUDA context: the next section says so
        pass
    figures["seconds"] = round(time.perf_counter() - start, 1)
    figures["budget_s"] = round(budget_s, 1)
    check.results[name] = check.results.get(name, {}) | figures
    check.save()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes and steps: a dry run")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_check")
    p.add_argument("--budget-s", type=float, default=340.0, help="all sections together")
    p.add_argument("--sections", default=",".join(s[0] for s in SECTIONS))
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - {s[0] for s in SECTIONS}
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {[s[0] for s in SECTIONS]}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    # before any CUDA call: what the device holds without this process
    smi = nvidia_smi() if args.device == "cuda" else None
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check: --device cuda, but torch {torch.__version__} sees no CUDA device "
            f"(built for CUDA {torch.version.cuda}); --device cpu --quick is the dry run",
            file=sys.stderr,
        )
        sys.exit(2)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the configs' data paths (the bundled sample) are relative to it
    check = Check(torch.device(args.device), QUICK if args.quick else FULL, args.out)
    check.others_mb = smi["used_mb"] if smi else None
    check.results = {
        "check": "gpu_check",
        "device": args.device,
        "quick": args.quick,
        "argv": sys.argv[1:],
        "env": {"nvidia_smi_before": smi},
    }
    torch.manual_seed(0)
    deadline = started + args.budget_s
    chosen = [s for s in SECTIONS if s[0] in args.sections.split(",")]
    for i, (name, fn, most_s, least_s) in enumerate(chosen):
        later = sum(s[3] for s in chosen[i + 1 :])
        budget_s = min(most_s, deadline - time.perf_counter() - later)
        if budget_s < max(least_s, 1):
            check.results[name] = {"status": "skipped", "why": "out of time (--budget-s)"}
            check.save()
            continue
        run_section(check, name, fn, budget_s)
    check.results["wall_s"] = round(time.perf_counter() - started, 1)
    check.save()

    log("\n=== summary ===")
    rows = [
        [
            name,
            check.results[name]["status"],
            cell(check.results[name].get("seconds")),
            headline(name, check.results[name]),
        ]
        for name, *_ in chosen
    ]
    log(format_table(["section", "status", "s", ""], rows, align="llrl"))
    log(f"total {check.results['wall_s']} s; results in {args.out / 'gpu_check.json'}")
    print(json.dumps(check.results, default=str), flush=True)
    return check.results


if __name__ == "__main__":
    main()
