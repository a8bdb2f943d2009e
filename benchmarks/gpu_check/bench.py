"""Sections bench_*: benchmarks/bench_tft.py (its options from `Sizes.bench_args`: the DLE
configuration in TF32 and bf16, ours compiled, configs B and S), ours against pytorch-forecasting
(--theirs none when it is not installed), each in its own process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from benchmarks.gpu_check.common import ROOT, log
from foxhunt.memory.budget import free_memory

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check

BENCH_TFT = ROOT / "benchmarks" / "bench_tft.py"


def bench_section(key: str) -> Callable[[Check, float], dict[str, Any]]:
    """The section that runs bench_tft.py with `Sizes.bench_args[key]`."""

    def run(check: Check, budget_s: float) -> dict[str, Any]:
        if key not in check.sizes.bench_args:
            return {"status": "skipped", "why": f"{key} is not run with --quick"}
        deadline = time.monotonic() + budget_s
        args = check.sizes.bench_args[key]
        theirs = "--skip-theirs" not in args and (
            importlib.util.find_spec("pytorch_forecasting") is not None
        )
        result = run_bench(check, args, theirs, deadline)
        if theirs and "pytorch-forecasting:" in result.get("stderr_tail", ""):
            # theirs would not import (bench_tft says so at once): ours alone, on the same time
            log("pytorch-forecasting does not import: ours alone")
            failed = result["stderr_tail"][-500:]
            result = run_bench(check, args, False, deadline) | {"theirs_error": failed}
        return result

    return run


def run_bench(check: Check, args: tuple[str, ...], theirs: bool, deadline: float) -> dict[str, Any]:
    """benchmarks/bench_tft.py in its own process; its figures from its last line (JSON)."""
    free_memory(check.device)
    cmd = [sys.executable, str(BENCH_TFT), "--device", check.device.type, *args]
    cmd += [] if theirs or "--skip-theirs" in args else ["--skip-theirs"]
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
        "ours_eval_ms_per_batch": ours["eval_ms_per_batch"],
        "theirs_eval_ms_per_batch": them.get("eval_ms_per_batch"),
        "precision": bench.get("precision"),
        "compile": bench.get("compile_mode") or bench.get("compile"),
        "compile_error": bench.get("compile_error"),
        "ours_peak_mib": ours["peak_mib"],
        "theirs_peak_mib": them.get("peak_mib"),
        "bench": bench,
    }
