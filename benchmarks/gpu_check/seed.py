"""Section seed: the predecessor's scenario (memory=gpu_4gb, tft_base with 225 features)
through scripts/train.py in its own process, one epoch cut by trainer.limit_*_batches, watched
by probe.SeedProbe: exit status, the searched batch sizes, OOM backoffs, the allocator's peaks,
each phase's time, and whether the peak reserved plus the CUDA context fits a real 4 GB
card."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.gpu_check.common import ROOT, cell, log
from foxhunt.memory import MB
from foxhunt.memory.budget import free_memory
from foxhunt.memory.table import format_table

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check

TRAIN_SCRIPT = ROOT / "scripts" / "train.py"
CARD_MB = 4096  # the seed scenario's card: memory=gpu_4gb

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
        "rank 0's evaluation after the test: forecast_split over every test window (not cut by "
        "limit_test_batches), the baselines fit and scored on CPU",
    ),
    ("baselines_logged", "the quality evaluation, the export and the summary"),
    ("summary_written", "finished"),
)
# a Hydra job log line: [2026-11-30 16:54:28,866][foxhunt.app.train.phases][INFO] - message
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
            "+callbacks.gpu_check_probe._target_=benchmarks.gpu_check.probe.SeedProbe",
            f"+callbacks.gpu_check_probe.path={probe}",
            f"+callbacks.gpu_check_probe.others_mb={'null' if others is None else others}",
        ]
        env = dict(os.environ)
        # the probe's package (benchmarks, at the root) and foxhunt for the training process
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH")) if p
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
        "rank 0's evaluation after the test (forecast_split, the baselines) runs over every "
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
