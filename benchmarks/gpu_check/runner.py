"""The check's runner: the sections in order with their time plan, each
section run so that a failure is recorded and the next one runs, the closing table, the
options, and main."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import benchmarks.gpu_check
from benchmarks.gpu_check.bench import bench_section
from benchmarks.gpu_check.budget import section_budget
from benchmarks.gpu_check.common import ROOT, Check, cell, log, nvidia_smi
from benchmarks.gpu_check.env import section_env
from benchmarks.gpu_check.estimator import ESTIMATE_WORKERS, section_estimator
from benchmarks.gpu_check.fused_vsn import section_fused_vsn
from benchmarks.gpu_check.seed import CARD_MB, section_seed
from benchmarks.gpu_check.sizes import FULL, QUICK
from foxhunt.memory.budget import free_memory
from foxhunt.memory.table import format_table

# --- the sections and their time plan --------------------------------------------------------

Section = Callable[[Check, float], dict[str, Any]]
# name, function, least seconds it needs to be worth starting, in the order they run
SECTIONS: list[tuple[str, Section, float]] = [
    ("env", section_env, 0),
    ("estimator", section_estimator, 15),
    ("seed", section_seed, 60),
    ("bench_DLE", bench_section("DLE"), 20),
    ("bench_DLE_bf16", bench_section("DLE_bf16"), 20),
    ("bench_DLE_compiled", bench_section("DLE_compiled"), 30),
    ("bench_DLE_graphs", bench_section("DLE_graphs"), 30),
    ("bench_B", bench_section("B"), 30),
    ("fused_vsn", section_fused_vsn, 5),
    ("budget", section_budget, 2),
    ("bench_S", bench_section("S"), 15),
]
# each section's share of the default --budget-s, their sum: 520 s, so that with the imports
# before the clock starts and gpu_check.sh's wheels the command stays within 10 minutes (a
# device command's limit). Order: what the last run (2026-11-30, an H200) left unmeasured first
# (the net estimator errors, the seed scenario under the context-aware cap, config B), with the
# DLE configuration; fused_vsn, budget and bench_S, measured then, last. As measured then: env
# 3 s, estimator 95 s for 12 cases (now 8 and validation's cuDNN attribution, traced by
# ESTIMATE_WORKERS processes beside the steps), seed over 140 s (a 74 s search, a 19 s epoch,
# then the test, unfinished), bench_S 33 s, bench_B over 70 s (now --lean). Unmeasured: the DLE
# sections (a step of batch 1,024 is ~20x config S's work; compiling ours, a minute or more).
# Time a section leaves unspent rolls forward to the next.
TIME_PLAN_S = {
    "env": 8,
    "estimator": 55,
    "seed": 150,
    "bench_DLE": 45,
    "bench_DLE_bf16": 35,
    "bench_DLE_compiled": 60,
    "bench_DLE_graphs": 50,
    "bench_B": 75,
    "fused_vsn": 12,
    "budget": 3,
    "bench_S": 27,
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
        ours = f"ours {cell(s.get('ours_train_samples_per_s'), ',.0f')} samples/s"
        if s.get("compile"):
            ours += f" compiled ({s['compile_error'] or s['compile']})"
        if not s.get("theirs"):
            return ours + ", alone"
        return (
            f"{ours}; train speedup {cell(s.get('train_speedup'), '.2f')}, eval speedup "
            f"{cell(s.get('eval_speedup'), '.2f')}, memory ratio "
            f"{cell(s.get('memory_ratio'), '.2f')}"
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
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=benchmarks.gpu_check.__doc__.splitlines()[0],
    )
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
