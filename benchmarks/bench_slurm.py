"""foxhunt's many-job workloads on a SLURM cluster against the same commands run here, timed by
the wall clock from the command to its result:

    sweep     a 2x2 sweep of model.hidden_dim and model.num_heads: a job array, against
              Hydra's basic launcher (one job after another, here)
    study     a 4-trial study: its 2 workers as jobs sharing a PostgreSQL study, then the plain
              command (the summary), against `tune.jobs=2` here (two worker processes)
    folds     a 2-fold backtest: its folds as jobs, pooled by the command, against the plain
              `foxhunt backtest` here (one fold after another)

    sudo scripts/slurm-local start
    python benchmarks/bench_slurm.py [--storage postgresql://...] [--only sweep study folds]

Every job is a short training of a small TFT on the bundled sample (SMALL below); each SLURM job
gets 1 CPU of the node (the cluster's default partition, 2 GB, no GPU). The study needs a
PostgreSQL URL (--storage, default $FOXHUNT_TEST_POSTGRES). A table, then one JSON line. Run
it alone: the jobs share the machine's CPUs with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = (
    "model.hidden_dim=16",
    "model.num_heads=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=20",
    "trainer.limit_val_batches=5",
    "trainer.enable_progress_bar=false",
    "report=false",
)
SLURM = (
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.timeout_min=20",
)


def foxhunt(*args: str, cwd: Path) -> float:
    """`foxhunt <args>` run from `cwd` on the sample in its parent: its wall time (s); an
    error if it fails."""
    data = f"data.path={cwd.parent / 'ES_FUT_small.parquet'}"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "foxhunt", *args, data], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"foxhunt {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def sweep(work: Path, storage: str) -> dict[str, float]:
    grid = ("model.hidden_dim=16,24", "model.num_heads=2,4")
    small = [a for a in SMALL if not a.startswith(("model.hidden_dim", "model.num_heads"))]
    return {
        "slurm": foxhunt("train", "-m", *small, *grid, *SLURM, "hydra.sweep.dir=s", cwd=work),
        "here": foxhunt("train", "-m", *small, *grid, "hydra.sweep.dir=h", cwd=work),
    }


def study(work: Path, storage: str) -> dict[str, float]:
    args = [*SMALL, "tune.trials=4", "tune.folds=1", "tune.refit=false", "tune.pruner=none"]
    jobs = [*args, f"tune.storage={storage}", f"tune.study=bench-{uuid.uuid4().hex[:8]}"]
    slurm = foxhunt("tune", "-m", "tune.worker=0,1", *jobs, *SLURM, "hydra.sweep.dir=t", cwd=work)
    slurm += foxhunt("tune", *jobs, cwd=work)  # the plain command: the summary
    here = foxhunt("tune", *args, "tune.jobs=2", f"tune.dir={work / 'studies'}", cwd=work)
    return {"slurm": slurm, "here": here}


def folds(work: Path, storage: str) -> dict[str, float]:
    args = [*SMALL, "backtest.folds=2"]
    return {
        "slurm": foxhunt(
            "backtest", "-m", *args, "backtest.fold=0,1", *SLURM, "hydra.sweep.dir=f", cwd=work
        ),
        "here": foxhunt("backtest", *args, "hydra.run.dir=b", cwd=work),
    }


WORKLOADS = {"sweep": sweep, "study": study, "folds": folds}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=os.environ.get("FOXHUNT_TEST_POSTGRES"))
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    opts = parser.parse_args()
    if "study" in opts.only and not opts.storage:
        parser.error("the study needs --storage postgresql://... (or FOXHUNT_TEST_POSTGRES)")
    load = os.getloadavg()[0]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_slurm_") as tmp:
        sample = [sys.executable, str(ROOT / "scripts" / "make_sample_data.py")]
        subprocess.run([*sample, "--out", f"{tmp}/ES_FUT_small.parquet"], check=True)
        for name in opts.only:
            work = Path(tmp) / name
            work.mkdir()
            results[name] = {k: round(v, 1) for k, v in WORKLOADS[name](work, opts.storage).items()}
    print(f"{'workload':<10}{'SLURM jobs (s)':>16}{'here (s)':>10}")
    for name, times in results.items():
        print(f"{name:<10}{times['slurm']:>16.1f}{times['here']:>10.1f}")
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if "model name" in line), "")
    machine = {"cpus": os.cpu_count(), "cpu": cpu or platform.processor(), "load_before": load}
    print(json.dumps({"bench": "slurm", "results": results, "machine": machine}))


if __name__ == "__main__":
    main()
