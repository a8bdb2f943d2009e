"""A foxhunt training on a busy CPU: quiet, and beside k other CPU-bound processes.

    python benchmarks/bench_contention.py [--k 0 1 2] [--policies before after] [--theirs]
                                          [--competitor train|matmul] [--repeats 1]

The measured job is a short default training through the entry point, the way a user runs it
(`scripts/train.py trainer.max_epochs=1 trainer.limit_train_batches=20 ...`: imports, data,
baselines, 20 steps, validation, test), timed by the wall clock. The k competitors start a few
seconds before it and run until it ends: other such trainings in a loop (`--competitor train`,
the default: a sweep's other jobs) or a plain matmul loop. Every process of a row runs under
the row's policy:

    before   FOXHUNT_THREADS=off: torch's thread count and OpenMP's spinning waits as they are
    after    foxhunt's settings (foxhunt.threads: intra-op threads = the CPUs the other
             processes leave free, re-read between batches)
    NAME=ENV more, e.g. passive=OMP_WAIT_POLICY=PASSIVE or spin=GOMP_SPINCOUNT=10000 (each
             with FOXHUNT_THREADS=off to see it alone)

--theirs adds bench_tft's side-by-side step rates (ours and pytorch-forecasting's, config S) in
the same conditions (`pip install -e ".[bench]"`).

A table, then one JSON line. The slowdown is the time over the same policy's quiet time; the
goal is at most k + 1. Run it alone: the quiet rows need a quiet machine (it warns otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=20",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "report=false",
    "trainer.enable_progress_bar=false",
]
POLICIES = {"before": {"FOXHUNT_THREADS": "off"}, "after": {}}
# a competitor: the same training again and again, or a matmul loop
COMPETITOR_LOOP = """
import subprocess, sys
while True:
    subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""
MATMUL_LOOP = """
import torch
a = torch.randn(512, 512)
while True:
    a = torch.tanh(a @ a)
"""
START_S = 4.0  # competitors run this long before the measured job starts


def policy_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a row: the user's, less what the policies change, plus `extra`."""
    keys = ("FOXHUNT_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
    return {k: v for k, v in os.environ.items() if k not in keys} | extra


def train_command(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), *TRAIN, f"hydra.run.dir={out}"]


def start_competitors(k: int, kind: str, env: dict[str, str], tmp: Path) -> list[subprocess.Popen]:
    procs = []
    for i in range(k):
        if kind == "train":
            args = [sys.executable, "-c", COMPETITOR_LOOP, *train_command(tmp / f"rival{i}")]
        else:
            args = [sys.executable, "-c", MATMUL_LOOP]
        procs.append(
            subprocess.Popen(
                args,
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped with its children
            )
        )
    if procs:
        time.sleep(START_S)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def time_training(env: dict[str, str], out: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(train_command(out), env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the measured training failed:\n{done.stderr[-2000:]}")
    return seconds


def step_rates(env: dict[str, str]) -> dict[str, float | None]:
    """bench_tft's training rates (samples/s) of ours and pytorch-forecasting's, config S."""
    args = [sys.executable, str(ROOT / "benchmarks" / "bench_tft.py"), "--config", "S", "--lean"]
    args += ["--steps", "10", "--eval-batches", "5", "--repeats", "1"]
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_tft failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "ours_samples_per_s": result["ours"]["train_samples_per_s"],
        "theirs_samples_per_s": result["theirs"]["train_samples_per_s"],
    }


def parse_policies(names: list[str]) -> dict[str, dict[str, str]]:
    out = {}
    for name in names:
        if name in POLICIES:
            out[name] = POLICIES[name]
            continue
        label, _, spec = name.partition("=")
        if not spec:
            sys.exit(f"--policies: {name!r} is neither before, after nor NAME=VAR=VALUE,...")
        out[label] = dict(kv.split("=", 1) for kv in spec.split(","))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, nargs="+", default=[0, 1, 2], help="competing processes")
    p.add_argument("--policies", nargs="+", default=["before", "after"])
    p.add_argument("--competitor", choices=("train", "matmul"), default="train")
    p.add_argument("--theirs", action="store_true", help="also bench_tft's step rates")
    p.add_argument("--repeats", type=int, default=1, help="timings per busy row (the median)")
    p.add_argument("--quiet-repeats", type=int, default=3, help="timings per quiet row")
    args = p.parse_args(argv)
    policies = parse_policies(args.policies)
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"NOTE: load average {load:.2f} at the start: the quiet rows are not quiet")

    rows = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        # the sample data and Python's caches exist before anything is timed
        time_training(policy_env({}), tmp / "warm")
        for label, extra in policies.items():
            env = policy_env(extra)
            for k in args.k:
                print(f"{label}, k={k} ...", file=sys.stderr, flush=True)
                procs = start_competitors(k, args.competitor, env, tmp)
                try:
                    out = tmp / f"{label}{k}"
                    repeats = args.quiet_repeats if k == 0 else args.repeats
                    runs = [time_training(env, out / str(r)) for r in range(repeats)]
                    rates = step_rates(env) if args.theirs else {}
                finally:
                    stop(procs)
                row = {"policy": label, "k": k, "train_s": statistics.median(runs), "runs_s": runs}
                rows.append(row | rates)
    quiet = {r["policy"]: r["train_s"] for r in rows if r["k"] == 0}
    for r in rows:
        base = quiet.get(r["policy"])
        r["slowdown"] = r["train_s"] / base if base else None
        r["within_goal"] = r["slowdown"] <= r["k"] + 1 if base else None
    first = quiet.get(next(iter(policies)))  # the quiet time of each policy against the first's
    quiet_change = {name: t / first - 1 for name, t in quiet.items()} if first else {}
    result = {
        "cores": cores,
        "competitor": args.competitor,
        "load_avg_start": load,
        "load_avg_end": os.getloadavg()[0],
        "command": "scripts/train.py " + " ".join(TRAIN),
        "policies": policies,
        "quiet_change": quiet_change,  # each policy's quiet time over the first policy's, - 1
        "rows": rows,
    }
    print_table(result)
    print(json.dumps(result))
    return result


def print_table(result: dict[str, Any]) -> None:
    theirs = any("ours_samples_per_s" in r for r in result["rows"])
    head = f"{'policy':<10}{'k':>3}{'train s':>10}{'slowdown':>10}{'goal':>6}"
    if theirs:
        head += f"{'ours/s':>10}{'theirs/s':>10}"
    print(f"{result['cores']} cores; competitors: {result['competitor']} loops")
    print(head)
    for r in result["rows"]:
        slow = f"{r['slowdown']:.2f}x" if r["slowdown"] else "-"
        goal = "-" if r["within_goal"] is None else ("ok" if r["within_goal"] else "MISS")
        line = f"{r['policy']:<10}{r['k']:>3}{r['train_s']:>10.1f}{slow:>10}{goal:>6}"
        if theirs:
            line += f"{r['ours_samples_per_s']:>10.0f}{r['theirs_samples_per_s']:>10.0f}"
        print(line)
    for name, change in result["quiet_change"].items():
        print(f"quiet time of {name}: {change:+.1%} against {next(iter(result['policies']))}")


if __name__ == "__main__":
    main()
