"""The GPU check (#18): foxhunt's CUDA paths measured in one command, within minutes.

    bash benchmarks/gpu_check.sh                      # on the GPU machine: wheels, then this
    python benchmarks/gpu_check.py [--device cuda|cpu] [--quick] [--out DIR] [--budget-s 350]
                                   [--section-budget NAME=SECONDS ...] [--sections a,b,...]

Sections, in this order; one that fails records its error and the next one runs:
  env        the device, driver, versions, and the memory the CUDA context takes
  fused_vsn  the fused variable selection (forward_scalars) against the plain path, forward and
             backward, float64 / float32 / bf16 autocast, and both paths' time and memory
  budget     device_budget's cap (set_per_process_memory_fraction on CUDA) met by allocations
  estimator  foxhunt.memory.estimate against max_memory_allocated / max_memory_reserved of real
             steps (foxhunt.training.step, after warm-up steps) for tft_base (225 features) and
             tft_small, fp32 and bf16; every case starts from a freed allocator and its peaks
             are read net of what was allocated before it (the cuBLAS/cuDNN workspaces,
             recorded apart); fits memory.cuda_reserve_fraction and memory.cuda_context_mb
  seed       scripts/train.py memory=gpu_4gb model=tft_base data.ohlcv.num_features=225, one
             epoch cut by trainer.limit_*_batches: exit status, the searched batch sizes, OOM
             backoffs, the allocator's peaks, each phase's time, and whether the peak reserved
             plus the CUDA context fits a real 4 GB card
  bench_B,   benchmarks/bench_tft.py --config B|S against pytorch-forecasting (--skip-theirs
  bench_S    when it is not installed; B with --lean: no FLOP count, no MemTracker breakdown)
After every section the results so far go to OUT/gpu_check.json; each section prints a table,
and the last line of the output is one JSON object with every figure.

Time plan: each section has a share of --budget-s (TIME_PLAN_S, 350 s in all; scaled when
--budget-s differs, or --sections picks some; --section-budget sets one share in seconds and
the others share the rest). Time a section leaves unspent rolls forward to the next ones (the
last, bench_S, gets what is left); a section whose budget falls under its minimum is skipped.

--device cpu runs the same code paths on a CPU (CUDA-only figures are null): with --quick, tiny
sizes and steps, a dry run of the whole check in a few minutes.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from foxhunt.data.schema import random_batch
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.files import write_json, write_text
from foxhunt.memory import MB, estimate, measure
from foxhunt.memory.budget import LiveTensorBytes, device_budget, free_memory, live_tensors
from foxhunt.memory.estimator import _plan
from foxhunt.memory.search import BatchSizeSearch
from foxhunt.memory.table import format_table
from foxhunt.models.blocks import VariableSelectionNetwork
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
VSN_TOLERANCE = {"float64": (1e-6, 1e-6), "float32": (1e-5, 1e-5), "bf16": (2e-2, 4e-2)}
# the reserve fraction alone is reported over the steps whose estimate is at least this large:
# below it the allocator's 2 and 20 MB segments make any fraction large
FIT_FROM_MB = 1024
# what may stay allocated between estimator cases beyond the workspaces (allocator rounding)
LEFTOVER_TOLERANCE_MB = 8.0
CARD_MB = 4096  # the seed scenario's card: memory=gpu_4gb
ESTIMATE_WORKERS = 4  # processes tracing the estimates on CUDA while the device runs steps


@dataclass(frozen=True)
class Sizes:
    """What a run of the check does: the full check on a GPU, or a quick dry run."""

    estimator_cases: tuple[tuple[str, str, int], ...]  # model, precision, batch size
    warmup: int  # untimed training steps before the measured ones
    steps: int  # measured training steps
    seed_overrides: tuple[str, ...]  # scripts/train.py's, besides the scenario's own
    vsn: tuple[int, int, int, int, int, int]  # variables, variable_dim, hidden, context, B, T
    vsn_repeats: int
    bench_args: dict[str, tuple[str, ...]]  # bench_tft.py's options by config; absent: not run


FULL = Sizes(
    # tft_base first: the seed scenario's model, and what matters if time runs short; tft_small
    # at one size (its small batches are the allocator's segments more than the step)
    estimator_cases=(
        *(("tft_base", p, b) for p in ("fp32", "bf16") for b in (32, 128, 512)),
        ("tft_small", "fp32", 512),
        ("tft_small", "bf16", 512),
    ),
    warmup=2,
    steps=3,
    seed_overrides=(
        "model=tft_base",
        "data.ohlcv.num_features=225",
        # one epoch, cut: ~20 s of training on an H200 after a ~75 s batch-size search
        "trainer.limit_train_batches=60",
        "trainer.limit_val_batches=10",
        "trainer.limit_test_batches=10",
    ),
    vsn=(227, 64, 256, 256, 32, 64),  # tft_base's encoder selection: 225 features, target, time
    vsn_repeats=3,
    # B: FlopCounterMode and MemTracker over pytorch-forecasting's 225 per-variable modules
    # outlasted 55-70 s budgets on an H200: --lean (the FLOP count does not depend on the
    # device; the allocator's peak stands)
    bench_args={"S": (), "B": ("--lean",)},
)
QUICK = Sizes(
    # both models and both precisions once (tft_base's bf16 step alone takes 16 s on a CPU)
    estimator_cases=(("tft_base", "fp32", 2), ("tft_small", "bf16", 4)),
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
    # B: 77M parameters, a TFLOP a step; minutes on a CPU, GPU only. S with --lean, the
    # option B runs with on the GPU
    bench_args={
        "S": ("--steps", "1", "--eval-batches", "1", "--repeats", "1", "--warmup", "0", "--lean")
    },
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
    estimate_workers: int = 0  # the estimator section's tracing processes (0: in this one)

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
    the allocator's peaks on CUDA, the live-tensor peak on CPU (foxhunt's own counter, which
    counts only what is allocated inside: a net figure by itself)."""
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


def held_now(device: torch.device) -> dict[str, int | None]:
    """What the allocator holds now (allocated, reserved); None on CPU."""
    if device.type != "cuda":
        return {"allocated": None, "reserved": None}
    sync(device)
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
    }


def real_steps(cfg: Any, batch_size: int, device: torch.device, sizes: Sizes) -> dict[str, Any]:
    """Peaks of real training steps at `batch_size` after `sizes.warmup` steps (the optimizer
    state and the allocator's cache settled), then of one validation step at the same size with
    the gradients released first, as Lightning does; each step under bf16 autocast for
    precision=bf16, as the estimator traces it. On CUDA also what the allocator held before
    (`before`) and after (`after`) the case, everything of it freed: each case starts from the
    same state, and its peaks are read net of what was there."""
    plan = _plan(cfg, None, device.type)
    bf16 = plan.precision["name"] == "bf16"
    cuda = device.type == "cuda"

    def amp() -> torch.autocast:
        return torch.autocast(device.type, torch.bfloat16, enabled=bf16)

    free_memory(device)
    before = held_now(device)
    val_no_cudnn = None
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
        if cuda:  # else the validation step's reserved peak is the training step's cached pool
            torch.cuda.empty_cache()
        read()
        with amp():
            quantile_loss(validation_forward(model, batch), batch["target"], quantiles)
        val = read()
        if cuda:  # where the validation step's memory goes: the same step without cuDNN
            with amp(), torch.backends.cudnn.flags(enabled=False):
                quantile_loss(validation_forward(model, batch), batch["target"], quantiles)
            val_no_cudnn = read()
        del model, optimizer, batch, quantiles
    free_memory(device)
    return {
        "train": train,
        "val": val,
        "val_no_cudnn": val_no_cudnn,
        "step_s": step_s,
        "before": before,
        "after": held_now(device),
    }


def estimate_case(model: str, precision: str, batch_size: int, device_type: str) -> dict[str, Any]:
    """foxhunt.memory.estimate of one case, as plain numbers: it allocates nothing, so it may run
    in a worker process (the estimator section's pool) while the device runs the real steps."""
    cfg = compose_config([*MODELS[model], f"precision={precision}"])
    start = time.perf_counter()
    est = estimate(cfg, batch_size, batch_size, device=device_type)
    return {
        "params": est.params,
        "estimate_s": round(time.perf_counter() - start, 2),
        "train_allocated": est.train.allocated,
        "train_total": est.train.total,
        "val_allocated": est.val.allocated,
        "val_total": est.val.total,
    }


def estimate_pool(workers: int) -> Any:
    """`workers` spawned processes for estimate_case, or None for none. They see no GPU
    (CUDA_VISIBLE_DEVICES is empty for them): a CUDA context there would take device memory
    and spoil the context figures."""
    if workers <= 0:
        return None
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    os.environ |= {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    try:  # multiprocessing.Pool starts every worker now, with this environment
        return multiprocessing.get_context("spawn").Pool(workers)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def estimator_case(
    check: Check, model: str, precision: str, batch_size: int, get_estimate: Callable[[], dict]
) -> dict[str, Any]:
    """Real steps, then the estimate (from the pool, or computed here); both errors per step:
    raw (against the allocator's peak) and net (against the peak less what was allocated before
    the case: the estimator predicts the step's own peak)."""
    cfg = compose_config([*MODELS[model], f"precision={precision}"])
    real = real_steps(cfg, batch_size, check.device, check.sizes)
    est = get_estimate()
    before, after = real["before"], real["after"]
    row: dict[str, Any] = {
        "model": model,
        "precision": precision,
        "batch_size": batch_size,
        "params": est["params"],
        "estimate_s": est["estimate_s"],
        "allocated_before_mb": mb(before["allocated"]),
        "reserved_before_mb": mb(before["reserved"]),
        "allocated_after_mb": mb(after["allocated"]),
        "train_step_ms": round(real["step_s"] * 1000, 2),
    }
    for kind in ("train", "val"):
        measured, estimated = real[kind], est[f"{kind}_allocated"]
        allocated, reserved = measured["allocated"], measured["reserved"]
        net = allocated - (before["allocated"] or 0)
        row |= {
            f"{kind}_estimate_mb": mb(estimated),
            f"{kind}_estimate_device_mb": mb(est[f"{kind}_total"]) if check.cuda else None,
            f"{kind}_allocated_mb": mb(allocated),
            f"{kind}_net_mb": mb(net),
            f"{kind}_reserved_mb": mb(reserved),
            f"{kind}_reserved_net_mb": None
            if reserved is None
            else mb(reserved - before["reserved"]),
            f"{kind}_error_raw": rel(estimated, allocated),
            f"{kind}_error": rel(estimated, net),
        }
    if real["val_no_cudnn"] is not None:
        row["val_net_no_cudnn_mb"] = mb(real["val_no_cudnn"]["allocated"] - before["allocated"])
    return row


def measure_check(check: Check, case: tuple[str, str, int]) -> dict[str, Any]:
    """foxhunt.memory.measure (the one-step measurement) on one case, once, after the others:
    what the allocator held before and after it shows whether it frees what it built (on CPU
    its MemTracker kept the model's parameters and gradients alive: 2 x params per call)."""
    model, precision, batch_size = case
    cfg = compose_config([*MODELS[model], f"precision={precision}"])
    device = check.device
    free_memory(device)
    before = held_now(device)["allocated"]
    one = measure(cfg, batch_size, batch_size, device=device.type)
    free_memory(device)
    after = held_now(device)["allocated"]
    result: dict[str, Any] = {"case": f"{model}/{precision}/{batch_size}", **one}
    if before is not None and after is not None:
        result |= {
            "allocated_before_mb": mb(before),
            "leaked_mb": mb(after - before),
            "train_net_mb": round(one["measured_train_peak_mb"] - before / MB, 1),
            "val_net_mb": round(one["measured_val_peak_mb"] - before / MB, 1),
        }
    return result


def section_estimator(check: Check, budget_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + budget_s
    device, cases = check.device, check.sizes.estimator_cases
    if check.cuda:  # the libraries' workspaces exist before the first case, as after env
        warm_libraries(device)
    free_memory(device)
    try:
        pool = estimate_pool(check.estimate_workers)
    except Exception as exc:  # noqa: BLE001 - the estimates are traced here instead
        log(f"no estimate pool ({type(exc).__name__}: {exc}): estimates traced in this process")
        pool = None
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    try:
        pending = (
            {c: pool.apply_async(estimate_case, (*c, device.type)) for c in cases} if pool else {}
        )
        for case in cases:
            model, precision, b = case
            name = f"{model}/{precision}/{b}"
            if time.monotonic() > deadline:
                skipped.append(name)
                continue
            log(f"[estimator] {model} {precision} batch {b} ...")

            def get_estimate(case: tuple[str, str, int] = case) -> dict[str, Any]:
                if case in pending:
                    return pending[case].get(timeout=max(deadline - time.monotonic(), 1))
                return estimate_case(*case, device.type)

            try:
                rows.append(estimator_case(check, model, precision, b, get_estimate))
            except torch.OutOfMemoryError as exc:
                free_memory(device)
                rows.append(
                    {
                        "model": model,
                        "precision": precision,
                        "batch_size": b,
                        "error": f"OutOfMemoryError: {str(exc)[:200]}",
                    }
                )
            except multiprocessing.TimeoutError:
                skipped.append(f"{name} (estimate not ready in time)")
            except Exception as exc:  # noqa: BLE001 - recorded; the next case runs
                free_memory(device)
                log(traceback.format_exc())
                rows.append(
                    {
                        "model": model,
                        "precision": precision,
                        "batch_size": b,
                        "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    }
                )
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    measured = [r for r in rows if "error" not in r]
    result: dict[str, Any] = {
        "rows": rows,
        "skipped_cases": skipped,
        "estimate_workers": check.estimate_workers,
    }
    result["state_between_cases"] = between_cases(check, measured)
    if measured and time.monotonic() < deadline:
        first = measured[0]
        try:
            result["measure_check"] = measure_check(
                check, (first["model"], first["precision"], first["batch_size"])
            )
        except Exception as exc:  # noqa: BLE001 - a figure of its own; the rows stand
            result["measure_check"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print_estimator_table(check, rows, result)
    errors = [
        abs(r[f"{k}_error"])
        for r in measured
        for k in ("train", "val")
        if r[f"{k}_error"] is not None
    ]
    result["worst_abs_error"] = max(errors, default=None)
    result["worst_abs_train_error"] = max(
        (abs(r["train_error"]) for r in measured if r["train_error"] is not None), default=None
    )
    if check.cuda:
        result["fit"] = fit_constants(check, measured, result["state_between_cases"])
        for line in result["fit"]["explanation"]:
            log(line)
        log(format_table(["constant", "current", "fitted", ""], result["fit"]["table"], "lrrl"))
    if skipped:
        log(f"skipped (time budget): {', '.join(skipped)}")
    return result


def between_cases(check: Check, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the allocator held between cases: the cuBLAS/cuDNN workspaces (allocated with no
    tensor of ours alive, kept for the process's life and counted by max_memory_allocated, but
    by no traced step) and anything a case left behind (a leftover inflates the raw figures of
    every later case; the net ones take it off)."""
    if not check.cuda or not rows:
        return {"clean": None, "note": "the live-tensor counter on CPU counts each case alone"}
    first = rows[0]
    workspace = first["allocated_after_mb"]  # the libraries' workspaces once a step has run
    leftovers = {
        f"{r['model']}/{r['precision']}/{r['batch_size']}": round(
            r["allocated_before_mb"] - workspace, 1
        )
        for r in rows[1:]
    }
    worst = max(leftovers.values(), default=0.0)
    state = {
        "workspace_mb": workspace,
        "allocated_before_first_case_mb": first["allocated_before_mb"],
        "first_case_growth_mb": round(workspace - first["allocated_before_mb"], 1),
        "leftover_before_case_mb": leftovers,
        "max_leftover_mb": worst,
        "clean": worst <= LEFTOVER_TOLERANCE_MB,
    }
    if not state["clean"]:
        log(
            f"WARNING: up to {worst} MB stayed allocated between estimator cases beyond the "
            f"{workspace} MB of workspaces: the raw errors are contaminated, read the net ones"
        )
    return state


def print_estimator_table(check: Check, rows: list[dict[str, Any]], result: dict) -> None:
    table = [
        [
            r["model"],
            r["precision"],
            str(r["batch_size"]),
            *(
                cell(r.get(key), fmt)
                for key, fmt in (
                    ("train_estimate_mb", ".1f"),
                    ("train_net_mb", ".1f"),
                    ("train_error", "+.1%"),
                    ("train_error_raw", "+.1%"),
                    ("train_reserved_net_mb", ".1f"),
                    ("train_estimate_device_mb", ".1f"),
                    ("val_estimate_mb", ".1f"),
                    ("val_net_mb", ".1f"),
                    ("val_error", "+.1%"),
                    ("val_error_raw", "+.1%"),
                    ("val_net_no_cudnn_mb", ".1f"),
                    ("allocated_before_mb", ".1f"),
                    ("train_step_ms", ".1f"),
                    ("estimate_s", ".1f"),
                )
            ),
        ]
        for r in rows
    ]
    header = "model|prec|batch|train est|net|error|raw|reserved|plan total|val est|net|error|raw"
    header += "|no cuDNN|before|step ms|est s"
    log(
        "MB. net: the allocator's peak after warm-up steps less what was allocated before the "
        "case (on CPU: live tensors, net by themselves); error: estimate / net - 1 (raw: "
        "against the peak itself); reserved: reserved peak less reserved before, the validation "
        "step's from an empty cache; plan total: estimate + reserve + context; no cuDNN: the "
        "validation step again with cuDNN off; before: allocated before the case"
    )
    log(format_table(header.split("|"), table, align="lll"))
    for r in rows:
        if "error" in r:
            log(f"{r['model']}/{r['precision']}/{r['batch_size']}: {r['error']}")
    state = result["state_between_cases"]
    if state.get("workspace_mb") is not None:
        log(
            f"between cases: workspaces {state['workspace_mb']} MB (the first case added "
            f"{state['first_case_growth_mb']} MB), leftovers up to {state['max_leftover_mb']} MB"
            f" ({'clean' if state['clean'] else 'NOT clean'})"
        )
    one = result.get("measure_check")
    if one:
        log(f"foxhunt.memory.measure on {one.get('case')}: {json.dumps(one, default=str)}")


def fit_constants(
    check: Check, rows: list[dict[str, Any]], state: dict[str, Any]
) -> dict[str, Any]:
    """memory.cuda_reserve_fraction and memory.cuda_context_mb from the measurements.

    The reserve is fitted as an affine bound over every step, training and validation:
    reserved_net <= estimate x (1 + f) + a (f by least squares of reserved_net - estimate on
    the estimate, then a raised until every step is covered); the fraction alone only over the
    steps whose estimate is at least FIT_FROM_MB, where the allocator's 2 and 20 MB segments no
    longer dominate. The estimator adds ceil(estimate x cuda_reserve_fraction) +
    cuda_context_mb, so the constants that bound every measured step are f and context +
    workspaces + a."""
    cfg = compose_config(MODELS["tft_small"])
    current_fraction = cfg.memory.cuda_reserve_fraction
    current_context = cfg.memory.cuda_context_mb
    points = [
        (
            r[f"{k}_estimate_mb"],
            r[f"{k}_reserved_net_mb"],
            f"{k} {r['model']}/{r['precision']}/{r['batch_size']}",
        )
        for r in rows
        for k in ("train", "val")
        if r.get(f"{k}_estimate_mb") and r.get(f"{k}_reserved_net_mb") is not None
    ]
    fraction = overhead = typical = None
    if len({e for e, _, _ in points}) >= 2:
        estimates = [e for e, _, _ in points]
        slope, intercept = statistics.linear_regression(
            estimates, [res - e for e, res, _ in points]
        )
        fraction = max(slope, 0.0)
        overhead = max(res - e * (1 + fraction) for e, res, _ in points)
        typical = intercept if slope >= 0 else statistics.mean(res - e for e, res, _ in points)
    large = [(res / e - 1, name) for e, res, name in points if e >= FIT_FROM_MB]
    allocator = [
        r[f"{k}_reserved_net_mb"] / r[f"{k}_net_mb"] - 1
        for r in rows
        for k in ("train", "val")
        if r.get(f"{k}_net_mb")
        and r.get(f"{k}_reserved_net_mb") is not None
        and r[f"{k}_estimate_mb"] >= FIT_FROM_MB
    ]
    usage = cuda_usage(check.device, check.others_mb)
    workspace = state.get("workspace_mb") or 0.0
    context = usage["context_mb"]
    suggested_context = (
        None if context is None or overhead is None else round(context + workspace + overhead, 1)
    )
    fit = {
        "model": "reserved_net_mb <= estimate_mb x (1 + f) + a_mb, over every train and val step",
        "points": [{"step": n, "estimate_mb": e, "reserved_net_mb": res} for e, res, n in points],
        "reserve_fraction_f": fraction,
        "reserve_overhead_a_mb": None if overhead is None else round(overhead, 1),
        # the least-squares line's own intercept: a typical step, not a bound
        "reserve_overhead_lsq_mb": None if typical is None else round(typical, 1),
        f"reserve_fraction_max_from_{FIT_FROM_MB}_mb": max((v for v, _ in large), default=None),
        f"reserve_fraction_median_from_{FIT_FROM_MB}_mb": statistics.median(v for v, _ in large)
        if large
        else None,
        f"reserved_over_allocated_max_from_{FIT_FROM_MB}_mb": max(allocator, default=None),
        "workspace_mb": workspace,
        "context_mb": context,
        "cuda_reserve_fraction_current": current_fraction,
        "cuda_reserve_fraction_fit": fraction,
        "cuda_context_mb_current": current_context,
        "cuda_context_mb_fit": suggested_context,
        "usage_after_steps": usage,
    }
    fit["explanation"] = [
        "reserve fit: reserved_net (the reserved peak less what the allocator reserved before "
        "the case; the validation step's from an empty cache) against the estimate, over every "
        "step: reserved_net <= estimate x (1 + f) + a.",
        f"A fraction alone is degenerate on small steps (2 and 20 MB segments; the previous "
        f"check's 35.4 was a validation step whose reserved peak was the training step's cached "
        f"pool): it is shown only over estimates >= {FIT_FROM_MB} MB.",
        "The estimator adds ceil(estimate x cuda_reserve_fraction) + cuda_context_mb: with "
        "cuda_reserve_fraction = f and cuda_context_mb = context + workspaces + a it bounds "
        "every step measured here.",
    ]
    fit["table"] = [
        [
            "cuda_reserve_fraction",
            cell(current_fraction, ".3f"),
            cell(fraction, ".3f"),
            f"f; the fraction alone from {FIT_FROM_MB} MB: max "
            f"{cell(fit[f'reserve_fraction_max_from_{FIT_FROM_MB}_mb'], '.3f')} (allocator "
            f"alone, reserved / allocated - 1: {cell(max(allocator, default=None), '.3f')})",
        ],
        [
            "cuda_context_mb",
            cell(current_context),
            cell(suggested_context),
            f"context {cell(context)} (device used - reserved - others, after the steps) + "
            f"workspaces {cell(workspace)} + a {cell(fit['reserve_overhead_a_mb'])}",
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
    as soon as the search is over, each phase's peaks (the allocator's on CUDA, the live
    tensors' on CPU) and batches, the wall-clock time (time.time()) of each phase's start and
    end in `events`, and at each teardown this process's CUDA context."""

    def __init__(self, path: str, others_mb: float | None = None) -> None:
        self.path = Path(path)
        self.others_mb = others_mb
        self.data: dict[str, Any] = {"phases": {}, "events": {}}
        self._epoch_started = 0.0
        self._event("callbacks_built")  # before the data is read and the model built

    def _write(self) -> None:
        write_json(self.path, self.data)

    def _event(self, name: str) -> None:
        self.data["events"][name] = time.time()
        self._write()

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
            }
        self._event("search_done")

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("sanity_end")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_started = time.perf_counter()
        self._event("train_epoch_start")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        self._peak("train", pl_module.device)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._event("validation_start")

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any
    ) -> None:
        self._peak("sanity" if trainer.sanity_checking else "val", pl_module.device)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.data["epoch_s"] = round(time.perf_counter() - self._epoch_started, 1)
        self.data["global_step"] = trainer.global_step
        self._event("train_epoch_end")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("fit_end")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("test_start")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        self._peak("test", pl_module.device)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._event("test_end")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        stage = getattr(stage, "value", stage)  # Lightning passes TrainerFn: "fit", "test"
        if pl_module.device.type == "cuda":
            self.data[f"usage_end_{stage}"] = cuda_usage(pl_module.device, self.others_mb)
        self._event(f"teardown_{stage}")


# a scripts/train.py run's events (the probe's, the baselines' log line, summary.json written)
# in order, each with the phase that follows it: a run that stopped is in the phase after the
# last event it reached
SEED_STARTUP = "start-up: imports, Hydra, the config"
SEED_PHASES = (
    ("callbacks_built", "data setup, model and the batch-size search (BatchSizeSearch)"),
    ("search_done", "the sanity validation"),
    ("sanity_end", "the start of the training epoch"),
    ("train_epoch_start", "the training epoch"),
    ("validation_start", "the validation"),
    ("train_epoch_end", "the checkpoint and the end of fit"),
    ("fit_end", "restoring the best checkpoint for the test"),
    ("test_start", "the test (trainer.limit_test_batches)"),
    (
        "test_end",
        "rank 0's evaluation after the test: forecast_test over every test window (not cut by "
        "limit_test_batches), the baselines fit and scored on CPU",
    ),
    ("baselines_logged", "the quality evaluation, the export and the summary"),
    ("summary_written", "finished"),
)
# a Hydra job log line: [2026-11-30 16:54:28,866][foxhunt.app.train][INFO] - message
LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[([^\]]+)\]\[(\w+)\] - (.*)$")
BASELINES_LINE = re.compile(r"baselines: fit and scored in ([\d.]+) s")


def seed_log_events(lines: list[str]) -> dict[str, Any]:
    """From the training's log lines: when the baselines line came (time.time()) and its
    seconds, and the last timestamped line."""
    found: dict[str, Any] = {}
    for line in lines:
        m = LOG_LINE.match(line.strip())
        if not m:
            continue
        stamp = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found["last_log_line"] = {"at": stamp, "logger": m[2], "message": m[4][:200]}
        if b := BASELINES_LINE.search(m[4]):
            found["baselines_logged"] = stamp
            found["baselines_s"] = float(b[1])
    return found


def seed_timeline(
    launched: float, events: dict[str, float], logged: dict[str, Any], summary_at: float | None
) -> tuple[list[list[Any]], str]:
    """[(event, seconds since launch)] in order, and the phase the run was in at its end: the
    one after the last event reached (`summary_at`: when summary.json was written)."""
    at = dict(events)
    if "baselines_logged" in logged:
        at["baselines_logged"] = logged["baselines_logged"]
    if summary_at is not None:
        at["summary_written"] = summary_at
    timeline = sorted(([k, round(v - launched, 1)] for k, v in at.items()), key=lambda e: e[1])
    reached = [i for i, (key, _) in enumerate(SEED_PHASES) if key in at]
    return timeline, SEED_PHASES[max(reached)][1] if reached else SEED_STARTUP


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
        start, launched = time.perf_counter(), time.time()
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
        summary, summary_at = {}, None
        if summary_path.is_file():
            summary, summary_at = json.loads(summary_path.read_text()), summary_path.stat().st_mtime
        observed = json.loads(probe.read_text()) if probe.is_file() else {}
    lines = log_path.read_text().splitlines()
    # the last lines of the training's output (its last line is the whole summary: cut)
    tail = [line[:300] for line in lines[-15:]]
    logged = seed_log_events(lines)
    timeline, phase = seed_timeline(launched, observed.get("events", {}), logged, summary_at)
    memory, search = summary.get("memory", {}), observed.get("search") or {}
    phases = observed.get("phases", {})
    events = {name: s for name, s in timeline}
    result = {
        "status": "ok" if code == 0 else ("timeout" if code == "timeout" else "fail"),
        "overrides": overrides[:-3],
        "limits_note": "one epoch, cut by trainer.limit_train/val/test_batches (see overrides); "
        "rank 0's evaluation after the test (forecast_test, the baselines) runs over every "
        "test window regardless",
        "exit_code": code,
        "wall_s": wall_s,
        "phase_at_end": phase,
        "timeline_s": timeline,
        # from the callbacks' construction: the data setup, the model, the search
        "setup_and_search_s": _span(events, "callbacks_built", "search_done"),
        "epoch_s": observed.get("epoch_s"),
        "test_s": _span(events, "test_start", "test_end"),
        "after_test_s": _span(events, "test_end", "summary_written" if summary else None, wall_s),
        "baselines_s": logged.get("baselines_s"),
        "last_log_line": logged.get("last_log_line"),
        "batch_size": summary.get("batch_size", search.get("batch_size")),
        "val_batch_size": summary.get("val_batch_size", search.get("val_batch_size")),
        "search": search,
        "oom_backoffs": memory.get("oom_backoffs"),
        "micro_batch_size": memory.get("micro_batch_size"),
        "optimizer_state_released_mb": memory.get("optimizer_state_released_mb"),
        "memory_log": memory.get("log"),
        "memory_log_peak_mb": memory.get("peak_mb"),
        "phases": phases,
        "global_step": observed.get("global_step", summary.get("global_step")),
        "num_parameters": summary.get("num_parameters"),
        "metrics": summary.get("metrics"),
        "summary_wall_s": summary.get("wall_s"),
        "log_tail": tail if code != 0 else tail[-3:],
    }
    if check.cuda:
        result["four_gb_card"] = four_gb_card(check, phases, observed)
    if result["last_log_line"]:
        result["last_log_line"]["at_s"] = round(result["last_log_line"].pop("at") - launched, 1)
    print_seed(result, code, phase)
    if code != 0:
        log("\n".join(tail))
    return result


def _span(
    events: dict[str, float], start: str, end: str | None, fallback: float | None = None
) -> float | None:
    """Seconds from one event to another (or to `fallback`, seconds since launch)."""
    if start not in events:
        return None
    stop = events.get(end) if end else fallback
    return None if stop is None else round(stop - events[start], 1)


def four_gb_card(check: Check, phases: dict[str, Any], observed: dict[str, Any]) -> dict:
    """Would the run have fit a real 4 GB card? memory=gpu_4gb caps the caching allocator at
    4096 MB (set_per_process_memory_fraction), but a card also holds the CUDA context, which
    that cap does not count: the peak reserved plus the context must stay under 4096 MB."""
    peak_reserved = max((p["peak_reserved_mb"] or 0 for p in phases.values()), default=0) or None
    usage = observed.get("usage_end_fit") or observed.get("usage_end_test") or {}
    context, source = usage.get("context_mb"), "the training process, at the end of fit"
    if context is None:  # the run ended before its teardown: this process's, measured in env
        context = ((check.results.get("env") or {}).get("after_libraries") or {}).get("context_mb")
        source = "gpu_check's own process after the library warm-up (env)"
    total = None if peak_reserved is None or context is None else round(peak_reserved + context, 1)
    card = {
        "budget_mb": CARD_MB,
        "peak_reserved_mb": peak_reserved,
        "context_mb": context,
        "context_source": source,
        "reserved_plus_context_mb": total,
        "fits": None if total is None else total <= CARD_MB,
        "over_mb": None if total is None else round(total - CARD_MB, 1),
    }
    if card["fits"] is False:
        card["finding"] = (
            f"memory=gpu_4gb would not fit a real 4 GB card: the search's batch peaked at "
            f"{peak_reserved:.0f} MB reserved under the allocator cap of {CARD_MB} MB, and the "
            f"CUDA context ({context:.0f} MB, which the cap does not count) brings the device "
            f"to {total:.0f} MB, {total - CARD_MB:.0f} MB over. The cap (budget_mb) would have "
            f"to leave room for the context (about {CARD_MB - context:.0f} MB for the allocator) "
            "for the searched batch to fit. Not changed here: a finding for foxhunt.memory."
        )
    return card


def print_seed(result: dict[str, Any], code: Any, phase: str) -> None:
    trials = (result["search"] or {}).get("trials") or []
    card = result.get("four_gb_card") or {}
    rows = [
        ["exit", str(code)],
        ["phase at the end", phase],
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
        ["data setup + search s", cell(result["setup_and_search_s"])],
        ["epoch s (train+val)", cell(result["epoch_s"])],
        ["test s", cell(result["test_s"])],
        [
            "after the test s (baselines)",
            f"{cell(result['after_test_s'])} ({cell(result['baselines_s'])})",
        ],
        ["train steps", cell(result["global_step"], "")],
        *[
            [
                f"peak {k} alloc / reserved MB",
                f"{cell(p['peak_allocated_mb'])} / {cell(p['peak_reserved_mb'])} ({p['batches']} "
                "batches)",
            ]
            for k, p in result["phases"].items()
        ],
        ["context MB", f"{cell(card.get('context_mb'))} ({card.get('context_source', '-')})"],
        [
            f"reserved + context MB (vs {CARD_MB})",
            f"{cell(card.get('reserved_plus_context_mb'))}"
            + {True: ": fits", False: ": does NOT fit a 4 GB card", None: ""}[card.get("fits")],
        ],
        ["wall s", cell(result["wall_s"])],
    ]
    log(format_table(["seed scenario", ""], rows))
    log("timeline (s since launch): " + ", ".join(f"{k} {t}" for k, t in result["timeline_s"]))
    if card.get("finding"):
        log("FINDING: " + card["finding"])


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
            # float64: the plain path is the reference itself (error 0), not run again
            plain_out = reference if label == "float64" else vsn_pass(model, data, False, bf16)[0]
            plain = rel_errors(plain_out, reference, names)
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
        del reference, vsn64, plain_out
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
        if config not in check.sizes.bench_args:
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
    args = check.sizes.bench_args[config]
    cmd = [sys.executable, str(BENCH_TFT), "--config", config, "--device", check.device.type]
    cmd += [*args, *([] if theirs else ["--skip-theirs"])]
    log("[bench] " + " ".join(cmd[1:]))
    timeout = max(deadline - time.monotonic(), 1)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        log(out)
        log(err[-2000:])
        # bench_tft's progress lines carry the seconds since its start: the last is the phase
        progress = [line for line in err.splitlines() if line.startswith("[")]
        return {
            "status": "timeout",
            "args": args,
            "phase_at_end": progress[-1] if progress else "start-up (imports)",
            "stdout": out[-2000:],
            "stderr_tail": err[-2000:],
        }
    lines = proc.stdout.strip().splitlines()
    log("\n".join(lines[:-1]))
    if proc.returncode != 0 or not lines:
        log(proc.stderr[-3000:])
        return {"status": "fail", "exit_code": proc.returncode, "stderr_tail": proc.stderr[-3000:]}
    bench = json.loads(lines[-1])
    ours, them = bench["ours"], bench["theirs"] or {}
    return {
        "theirs": theirs,
        "args": args,
        "progress": [line for line in proc.stderr.splitlines() if line.startswith("[")],
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

Section = Callable[[Check, float], dict[str, Any]]
# name, function, least seconds it needs to be worth starting, in the order they run
SECTIONS: list[tuple[str, Section, float]] = [
    ("env", section_env, 0),
    ("fused_vsn", section_fused_vsn, 5),
    ("budget", section_budget, 2),
    ("estimator", section_estimator, 15),
    ("seed", section_seed, 60),
    ("bench_B", bench_section("B"), 30),
    ("bench_S", bench_section("S"), 15),
]
# each section's share of the default --budget-s, their sum: 350 s, so that with the imports
# before the clock starts and gpu_check.sh's wheels the command stays within 6 minutes. As
# measured on an H200 (2026-11-30): env 3 s, fused_vsn 11 s, budget 1 s, estimator 95 s for 12
# cases (now 8, traced by ESTIMATE_WORKERS processes beside the steps: ~30 s expected), seed
# over 140 s (a 74 s search, a 19 s epoch, then the test and rank 0's evaluation, unfinished),
# bench_S 33 s, bench_B over 70 s (in the FLOP count and MemTracker, now --lean). What env,
# fused_vsn, budget and the estimator leave unspent (~30 s) rolls forward: bench_B can expect
# ~120 s, and bench_S what bench_B leaves.
TIME_PLAN_S = {
    "env": 8,
    "fused_vsn": 12,
    "budget": 3,
    "estimator": 45,
    "seed": 170,
    "bench_B": 87,
    "bench_S": 25,
}


def time_plan(
    chosen: list[str], budget_s: float | None, fixed: dict[str, float]
) -> dict[str, float]:
    """Each chosen section's share: `fixed` ones as given, the others TIME_PLAN_S's scaled so
    that all add up to `budget_s` (None: the defaults' sum)."""
    free = [n for n in chosen if n not in fixed]
    default = sum(TIME_PLAN_S[n] for n in free)
    if budget_s is None:
        return {n: fixed.get(n, TIME_PLAN_S[n]) for n in chosen}
    rest = budget_s - sum(fixed.get(n, 0) for n in chosen)
    if rest < 0 or (free and rest <= 0):
        raise ValueError(
            f"--section-budget gives {sum(fixed.values()):.0f} s, more than --budget-s "
            f"{budget_s:.0f} s leaves for {', '.join(free) or 'them'}"
        )
    scale = rest / default if default else 0.0
    return {n: fixed[n] if n in fixed else TIME_PLAN_S[n] * scale for n in chosen}


def headline(name: str, s: dict[str, Any]) -> str:
    """One line of a section's figures for the closing table."""
    try:
        return _headline(name, s)
    except (KeyError, TypeError, ValueError):  # an unforeseen shape: the JSON has it all
        return "(see the JSON)"


def _headline(name: str, s: dict[str, Any]) -> str:
    if s.get("status") == "timeout":
        where = s.get("phase_at_end")
        return f"timed out after {s.get('budget_s')} s" + (f" in: {where}" if where else "")
    if s.get("status") in ("error", "skipped"):
        return (s.get("error") or s.get("why") or "")[:90]
    if name == "env":
        ctx = (s.get("after_libraries") or {}).get("context_mb")
        return f"{s.get('device_name')}, torch {s['torch']}, CUDA {s['torch_cuda']}, " + (
            f"driver {s.get('driver')}, context {ctx} MB" if ctx is not None else "no CUDA"
        )
    if name == "estimator":
        fit = s.get("fit") or {}
        clean = (s.get("state_between_cases") or {}).get("clean")
        return (
            f"worst |net error| train {cell(s.get('worst_abs_train_error'), '.1%')}, all "
            f"{cell(s.get('worst_abs_error'), '.1%')}; reserve f "
            f"{cell(fit.get('reserve_fraction_f'), '.3f')} + "
            f"{cell(fit.get('reserve_overhead_a_mb'))} MB; context fit "
            f"{cell(fit.get('cuda_context_mb_fit'))} MB"
            + {True: "; clean", False: "; LEFTOVERS between cases", None: ""}[clean]
        )
    if name == "budget":
        return f"OOM at {s['at_oom']['allocated_mb']} MB of {s['budget_mb']} MB"
    if name == "seed":
        card = s.get("four_gb_card") or {}
        fits = {True: "fits", False: "does NOT fit", None: "?"}[card.get("fits")]
        return (
            f"exit {s['exit_code']}, batch {s['batch_size']}, val batch {s['val_batch_size']}, "
            f"{len(s.get('oom_backoffs') or [])} backoffs, {s['wall_s']} s"
            + (
                f"; reserved+context {cell(card.get('reserved_plus_context_mb'))} MB: {fits} a "
                f"{CARD_MB} MB card"
                if card
                else ""
            )
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


def run_section(check: Check, name: str, fn: Section, budget_s: float) -> None:
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


def section_budget_arg(text: str) -> tuple[str, float]:
    name, sep, seconds = text.partition("=")
    names = [s[0] for s in SECTIONS]
    if not sep or name not in names:
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=SECONDS with NAME one of {names}")
    try:
        value = float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {seconds!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the seconds must be positive")
    return name, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes and steps: a dry run")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_check")
    p.add_argument(
        "--budget-s",
        type=float,
        help=f"all sections together (default: the plan's sum, {sum(TIME_PLAN_S.values())} s "
        "for all); the plan's shares scale to it",
    )
    p.add_argument(
        "--section-budget",
        type=section_budget_arg,
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="one section's share, in seconds (repeatable); the others share the rest. "
        f"Default shares: {', '.join(f'{k} {v}' for k, v in TIME_PLAN_S.items())}",
    )
    p.add_argument("--sections", default=",".join(s[0] for s in SECTIONS))
    p.add_argument(
        "--estimate-workers",
        type=int,
        help=f"processes tracing the estimator's estimates (default: {ESTIMATE_WORKERS} on "
        "cuda, at most the cores less two; 0 on cpu: in this process)",
    )
    args = p.parse_args(argv)
    names = [s[0] for s in SECTIONS]
    unknown = set(args.sections.split(",")) - set(names)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {names}")
    args.chosen = [n for n in names if n in args.sections.split(",")]
    fixed = dict(args.section_budget)
    try:
        args.plan = time_plan(args.chosen, args.budget_s, fixed)
    except ValueError as exc:
        p.error(str(exc))
    if args.estimate_workers is None:
        cores = os.cpu_count() or 1
        args.estimate_workers = (
            max(min(ESTIMATE_WORKERS, cores - 2), 0) if args.device == "cuda" else 0
        )
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
    check.estimate_workers = args.estimate_workers
    total_s = sum(args.plan.values())
    check.results = {
        "check": "gpu_check",
        "device": args.device,
        "quick": args.quick,
        "argv": sys.argv[1:],
        "time_plan_s": {n: round(s, 1) for n, s in args.plan.items()},
        "env": {"nvidia_smi_before": smi},
    }
    log(
        f"time plan ({total_s:.0f} s; unspent time rolls forward): "
        + ", ".join(f"{n} {s:.0f}" for n, s in args.plan.items())
    )
    torch.manual_seed(0)
    deadline = started + total_s
    chosen = [s for s in SECTIONS if s[0] in args.chosen]
    for i, (name, fn, least_s) in enumerate(chosen):
        # all the time left but the later sections' shares: what earlier ones left unspent
        later = sum(args.plan[s[0]] for s in chosen[i + 1 :])
        budget_s = deadline - time.perf_counter() - later
        if budget_s < max(least_s, 1):
            check.results[name] = {
                "status": "skipped",
                "why": f"out of time: {budget_s:.0f} s left for it, it needs {least_s:.0f} s",
                "budget_s": round(budget_s, 1),
            }
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
            cell(check.results[name].get("budget_s"), ".0f"),
            headline(name, check.results[name]),
        ]
        for name, *_ in chosen
    ]
    log(format_table(["section", "status", "s", "of s", ""], rows, align="llrrl"))
    log(f"total {check.results['wall_s']} s; results in {args.out / 'gpu_check.json'}")
    print(json.dumps(check.results, default=str), flush=True)
    return check.results


if __name__ == "__main__":
    main()
