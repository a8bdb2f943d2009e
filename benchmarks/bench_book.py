"""The cross-sectional book on a planted panel, as a panel trader would check it: lag 0 and 1,
ranked by forecast and by score, at 10 bp, beside the best baseline's book and the market.

    python benchmarks/bench_book.py [--out DIR] [--names 250] [--days 1500] [--seed 42]
        [--run RUN_DIR] [--cost 10] [override ...]

Writes the planted panel of `benchmarks/planted_panel.py` (a weak alpha, pooled correlation
about 0.1 with the next bar's return) to DIR, trains the default recipe on it (`foxhunt train`,
extra arguments as Hydra overrides) unless --run names a finished run, and books its test
forecasts (test_forecasts.parquet: the model's and the strongest baseline's) every way. Prints
a table, then one JSON line.
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
from types import SimpleNamespace

import pyarrow.parquet as pq

from benchmarks.planted_panel import write_planted_panel
from foxhunt.evaluation.book import book
from foxhunt.evaluation.forecasts import quantile_levels
from foxhunt.evaluation.quality import baseline_table

KEYS = ("sharpe", "gross_sharpe", "turnover", "net_return")
BOOK = {"book_top": 0.2, "book_weights": "equal", "book_min_names": 10}  # the defaults


def train(out: Path, args: argparse.Namespace) -> Path:
    """The default recipe trained on the planted panel in `out`; its run directory."""
    overrides = write_planted_panel(
        out / "panel.parquet", names=args.names, days=args.days, seed=args.seed
    )
    run = out / "run"
    cmd = [str(Path(sys.executable).parent / "foxhunt"), "train", *overrides]
    cmd += [f"data.cache_dir={out / 'cache'}", f"hydra.run.dir={run}", f"seed={args.seed}"]
    cmd += ["trainer.enable_progress_bar=false", *args.overrides]
    began = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=out, stdout=subprocess.DEVNULL)
    print(f"trained in {time.perf_counter() - began:.0f} s: {run}", file=sys.stderr)
    return run


def books(run: Path, cost: float) -> list[dict]:
    """Each lag and ranking's books of the run's test forecasts."""
    summary = json.loads((run / "summary.json").read_text())
    kind = summary.get("target", {}).get("kind") or "return"
    table = pq.read_table(run / "test_forecasts.parquet")
    theirs = baseline_table(table, quantile_levels(table))
    rows = []
    for lag in (0, 1):
        for rank in ("forecast", "score"):
            e = SimpleNamespace(execution_lag=lag, cost_bps=cost, book_rank=rank, **BOOK)
            found = book(table, kind, e, theirs)
            row = {"lag": lag, "rank": rank, "horizon": found["horizon"]}
            for who in ("model", "best_baseline", "market"):
                row[who] = {k: found[who][k] for k in KEYS} if who in found else None
            row["h_rank_ic"] = found["ic_by_horizon"][lag]["rank_ic"]
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--names", type=int, default=250)
    ap.add_argument("--days", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--run", type=Path, default=None)
    ap.add_argument("--cost", type=float, default=10.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_book_"))
    out.mkdir(parents=True, exist_ok=True)
    run = args.run or train(out, args)
    summary = json.loads((run / "summary.json").read_text())
    rows = books(run, args.cost)
    print(f"{'lag':>3} {'rank':<8} {'who':<14} {'net SR':>7} {'gross SR':>8} {'turnover':>8}")
    for r in rows:
        for who in ("model", "best_baseline", "market"):
            b = r[who]
            if b is None:
                continue
            net = "n/a" if b["sharpe"] is None else f"{b['sharpe']:.2f}"
            gross = "n/a" if b["gross_sharpe"] is None else f"{b['gross_sharpe']:.2f}"
            print(
                f"{r['lag']:>3} {r['rank']:<8} {who:<14} {net:>7} {gross:>8} {b['turnover']:>8.3f}"
            )
    m = summary.get("metrics") or {}
    result = {
        "run": str(run),
        "cost_bps": args.cost,
        "best_baseline": m.get("best_baseline"),
        "skill": m.get("skill"),
        "ic": m.get("ic"),
        "books": rows,
        "load_before": round(load, 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
