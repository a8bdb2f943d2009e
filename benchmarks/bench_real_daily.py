"""Forecast quality on real daily index data: the TFT against every baseline, per instrument,
on one calendar split and in a 5-fold walk-forward backtest.

    pip install --no-deps arch   # its wheel bundles Yahoo daily bars of the S&P 500 and the NASDAQ
    python benchmarks/bench_real_daily.py [--out DIR] [--folds 5] [override ...]

The data: daily OHLCV of the S&P 500 (^GSPC) and the NASDAQ Composite (^IXIC), 1999-01-04 to
2018-12-31 (5031 days each), from the `arch` package's data files (read as CSV, arch itself is
not imported). They are written to DIR/indices_daily.parquet and trained on with the default
model and features (`data.features=ohlcv`, the next 8 days' log returns of the close); extra
arguments are passed to both scripts as Hydra overrides. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
INDICES = {"sp500": "^GSPC", "nasdaq": "^IXIC"}
OHLCV = ("Open", "High", "Low", "Close", "Volume")


def write_indices(path: Path) -> int:
    """The two indices' daily bars as one Parquet panel; returns its rows."""
    spec = importlib.util.find_spec("arch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "bench_real_daily: needs the arch package's data files: pip install --no-deps arch"
        )
    data = Path(spec.submodule_search_locations[0]) / "data"
    tables = []
    for name, symbol in INDICES.items():
        t = pacsv.read_csv(data / name / f"{name}.csv.gz")
        days = [datetime.strptime(d, "%m/%d/%Y").replace(tzinfo=UTC) for d in t["Date"].to_pylist()]
        tables.append(
            pa.table(
                {
                    "timestamp": pa.array(days, pa.timestamp("ns", tz="UTC")),
                    "symbol": pa.array([symbol] * len(days)),
                    **{
                        c.lower(): t[c].cast(pa.float64()) for c in ("Open", "High", "Low", "Close")
                    },
                    "volume": t["Volume"].cast(pa.float64()),
                }
            )
        )
    panel = pa.concat_tables(tables)
    pq.write_table(panel, path)
    return panel.num_rows


def run(script: str, out: Path, overrides: list[str]) -> float:
    started = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "scripts" / script), *overrides, f"hydra.run.dir={out}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def rows_of(label: str, metrics: dict, baselines: dict) -> list[dict]:
    """One row per instrument and one pooled: the model's loss, each baseline's, the skill."""
    names = [n for n, b in baselines.items() if "test_loss" in b]
    out = []
    for instrument, m in [("pooled", metrics), *metrics.get("by_instrument", {}).items()]:
        per = {n: baselines[n].get("test_by_instrument", {}).get(instrument, {}) for n in names}
        loss = {n: baselines[n]["test_loss"] for n in names}
        if instrument != "pooled":
            loss = {n: per[n].get("test_loss") for n in names}
        out.append(
            {
                "evaluation": label,
                "instrument": instrument,
                "model": m["test_loss"],
                **loss,
                "skill": m.get("skill"),
                "best_baseline": m.get("best_baseline"),
                "direction": m.get("test_directional_accuracy"),
                "up_share": m.get("test_up_share", m.get("up_share")),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_real_daily")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "indices_daily.parquet"
    rows = write_indices(data)
    common = [f"data.path={data}", "data.generate_if_missing=false", "report=false"]
    common += args.overrides
    split_s = run("train.py", out / "split", common)
    backtest_s = run("backtest.py", out / "backtest", [*common, f"backtest.folds={args.folds}"])
    single = json.loads((out / "split" / "summary.json").read_text())
    walk = json.loads((out / "backtest" / "backtest_summary.json").read_text())
    table = rows_of("single split", single["metrics"], single["baselines"])
    table += rows_of(f"{args.folds}-fold walk-forward", walk["metrics"], walk["baselines"])

    head = list(table[0])
    print(" | ".join(head))
    for r in table:
        print(" | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in r.values()))
    print(f"({rows} rows; single split {split_s:.0f} s, walk-forward {backtest_s:.0f} s)")
    print(
        json.dumps(
            {
                "bench": "real_daily",
                "rows": rows,
                "overrides": args.overrides,
                "single_split_s": round(split_s, 1),
                "walk_forward_s": round(backtest_s, 1),
                "folds": len(walk["folds"]),
                "results": table,
            }
        )
    )


if __name__ == "__main__":
    main()
