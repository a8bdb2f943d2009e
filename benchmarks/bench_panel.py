"""A user's panel at scale: a synthetic daily stock panel (staggered listings, delistings, halts,
a sector static) inspected, then trained, tested, judged beside every baseline and reported by
`scripts/train.py`, each in its own process; wall time per phase and peak RSS.

    python benchmarks/bench_panel.py [--instruments 250] [--days 2000] [--out DIR]
        [override ...]

The defaults: one epoch capped at 50 training batches (the validation and test passes are
whole), the default model and report. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from foxhunt.data.samples import stock_panel_table

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("trainer.max_epochs=1", "trainer.limit_train_batches=50")


def run(script: str, args: list[str], cwd: Path) -> tuple[float, float, str]:
    """(wall s, peak RSS MB of the child, its stdout) of `python scripts/<script> args`."""
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / script), *args],
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS (KiB on Linux)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - began
        stdout.seek(0)
        stderr.seek(0)
        printed, errors = stdout.read(), stderr.read()
    if child.returncode not in (0, 2):
        sys.exit(f"{script} failed ({child.returncode}): {errors[-2000:]}")
    return wall, usage.ru_maxrss / 1024, printed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instruments", type=int, default=250)
    ap.add_argument("--days", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_panel_"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "panel.parquet"
    began = time.perf_counter()
    table = stock_panel_table(args.instruments, days=args.days)
    pq.write_table(table, path)
    made = time.perf_counter() - began
    data = ["data=parquet", f"data.path={path}", "data.group_column=symbol"]
    data += ["data.features=ohlcv", "data.static_features=[sector]", *args.overrides]
    load = os.getloadavg()[0]
    inspect_s, inspect_rss, printed = run("inspect_data.py", data, out)
    facts = json.loads(printed.strip().splitlines()[-1])
    train_args = [*data, *TRAIN, f"hydra.run.dir={out / 'run'}"]
    train_s, train_rss, _ = run("train.py", train_args, out)
    summary = json.loads((out / "run" / "summary.json").read_text())
    phases = dict(summary["phases_s"])
    phases["report"] = round(train_s - summary["wall_s"], 1)  # and the process's start
    result = {
        "instruments": args.instruments,
        "rows": table.num_rows,
        "windows": summary["windows"],
        "generate_s": round(made, 1),
        "inspect_s": round(inspect_s, 1),
        "inspect_rss_mb": round(inspect_rss),
        "train_s": round(train_s, 1),
        "train_rss_mb": round(train_rss),
        "phases_s": phases,
        "inspect_predicted_epoch_s": facts.get("time", {}).get("epoch_s"),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    rows = [
        ("rows", f"{table.num_rows:,}"),
        ("windows train/val/test", "/".join(f"{n:,}" for n in summary["windows"].values())),
        ("generate the panel", f"{made:.1f} s"),
        ("inspect_data.py", f"{inspect_s:.1f} s, peak RSS {inspect_rss:,.0f} MB"),
        ("train.py in all", f"{train_s:.1f} s, peak RSS {train_rss:,.0f} MB"),
        *((f"  {k}", f"{v:.1f} s") for k, v in phases.items()),
        ("load average before / after", f"{load:.2f} / {result['load_after']:.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
