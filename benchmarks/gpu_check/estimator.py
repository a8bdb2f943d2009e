"""Section estimator: foxhunt.memory.estimate against the allocator's peaks of real steps
(foxhunt.training.step, after warm-up steps), case by case, each from a freed allocator and
read net of what was allocated before it; the estimates traced by worker processes on CUDA
while the device runs the steps. The tables and the fit of the CUDA constants:
estimator_report."""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.bench_memory import MODELS, compose_config
from benchmarks.gpu_check.common import held_now, log, mb, peaks, rel, warm_libraries
from benchmarks.gpu_check.estimator_report import (
    between_cases,
    fit_constants,
    print_estimator_table,
)
from foxhunt.data.schema import random_batch
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.memory import MB, estimate, measure
from foxhunt.memory.budget import free_memory
from foxhunt.memory.estimator import step_plan
from foxhunt.memory.table import format_table
from foxhunt.precision import name_of
from foxhunt.training.module import build_model, make_optimizer
from foxhunt.training.step import train_step, validation_forward

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check
    from benchmarks.gpu_check.sizes import Sizes

ESTIMATE_WORKERS = 4  # processes tracing the estimates on CUDA while the device runs steps


def real_steps(cfg: Any, batch_size: int, device: torch.device, sizes: Sizes) -> dict[str, Any]:
    """Peaks of real training steps at `batch_size` after `sizes.warmup` steps (the optimizer
    state and the allocator's cache settled), then of one validation step at the same size with
    the gradients released first, as Lightning does; each step under bf16 autocast for
    precision=bf16, as the estimator traces it. On CUDA also what the allocator held before
    (`before`) and after (`after`) the case, everything of it freed: each case starts from the
    same state, and its peaks are read net of what was there."""
    plan = step_plan(cfg, device=device.type)
    bf16 = name_of(plan.precision) == "bf16"
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
