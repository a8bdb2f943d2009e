"""The estimator section's report: what the allocator held between its cases, its table, and
memory.cuda_reserve_fraction and memory.cuda_context_mb fitted to its measurements."""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING, Any

from benchmarks.bench_memory import MODELS, compose_config
from benchmarks.gpu_check.common import cell, cuda_usage, log
from foxhunt.memory.table import format_table

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check

# the reserve fraction alone is reported over the steps whose estimate is at least this large:
# below it the allocator's 2 and 20 MB segments make any fraction large
FIT_FROM_MB = 1024
# what may stay allocated between estimator cases beyond the workspaces (allocator rounding)
LEFTOVER_TOLERANCE_MB = 8.0


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
