"""Calibration before and after: the model's own quantiles, CQR's and ACI's, on the test windows
of the bundled sample, of real daily index data, and pooled over a 5-fold walk-forward on it.

    pip install --no-deps arch   # the S&P 500 and NASDAQ daily bars (bench_real_daily.py)
    python benchmarks/bench_calibration.py [--out DIR] [--folds 5] [--skip-backtest]
        [--shares 0,0.5] [--seeds 42] [override ...]

Each run calibrates on its own validation windows and reports every method's figures on its
test windows (summary.json's `calibration`); a backtest's folds each on their own, pooled here
by their test windows (the figures are means over windows). Per dataset and method: the outer
interval's coverage per horizon step and overall, its mean width, the pinball loss, CRPS and
Winkler score (normalized units). `--shares`: each run once per data.calibration_share (0: the
calibration fitted on the validation windows that also stopped training and chose the
checkpoint; 0.5: on the later half of the validation dates, held out of that choice), and
`--seeds`: once per seed; then the mean distance of the calibrated outer interval's coverage
from its nominal level per share. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_real_daily import ROOT, run, write_indices
from foxhunt.evaluation.calibration import verdict

KEYS = ("coverage", "width", "winkler")


def rows_of(label: str, cal: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method (the model's own first) of a summary's `calibration`."""
    out = []
    for method, f in {"model": cal["before"], **cal["methods"]}.items():
        outer = f["intervals"][0]
        out.append(
            {
                "data": label,
                "method": method,
                "nominal": outer["nominal"],
                **{k: outer[k] for k in KEYS},
                "pinball": f["pinball"],
                "crps": f["crps"],
                "by_horizon": outer["coverage_by_horizon"],
                "verdict": f.get("verdict", ""),
            }
        )
    return out


def pooled(folds: list[dict[str, Any]]) -> dict[str, Any]:
    """The folds' calibration figures pooled by their test windows."""
    weights = np.array([f["evaluation"]["windows"] for f in folds], dtype=np.float64)

    def mean(values: list) -> Any:
        return np.average(np.asarray(values, dtype=np.float64), axis=0, weights=weights).tolist()

    def pool(figures: list[dict[str, Any]]) -> dict[str, Any]:
        outers = [f["intervals"][0] for f in figures]
        outer = {"nominal": outers[0]["nominal"]}
        outer |= {k: mean([o[k] for o in outers]) for k in (*KEYS, "coverage_by_horizon")}
        return {
            "intervals": [outer],
            **{k: mean([f[k] for f in figures]) for k in ("pinball", "crps")},
        }

    cals = [f["calibration"] for f in folds]
    before = pool([c["before"] for c in cals])
    methods = {m: pool([c["methods"][m] for c in cals]) for m in cals[0]["methods"]}
    for figures in methods.values():
        figures["verdict"] = verdict(before, figures)
    return {"before": before, "methods": methods}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_calibration")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--skip-backtest", action="store_true")
    parser.add_argument("--shares", type=_floats, default=[0.0])
    parser.add_argument("--seeds", type=_ints, default=[42])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "indices_daily.parquet"
    write_indices(data)
    daily = [f"data.path={data}", "data.generate_if_missing=false", "data.futures.enabled=false"]
    common = ["report=false", *args.overrides]
    seconds: dict[str, float] = {}
    table = []
    for share in args.shares:
        for seed in args.seeds:
            tag = f"share {share:g}, seed {seed}"
            extra = [*common, f"data.calibration_share={share}", f"seed={seed}"]
            for label, name, more in (
                ("bundled sample", "sample", []),
                ("daily indices", "daily", daily),
            ):
                where = out / f"{name}-{share:g}-{seed}"
                seconds[f"{name} {tag}"] = run("train.py", where, [*extra, *more])
                summary = json.loads((where / "summary.json").read_text())
                table += [
                    r | {"share": share, "seed": seed}
                    for r in rows_of(label, summary["calibration"])
                ]
    if not args.skip_backtest:
        started = time.perf_counter()
        run("backtest.py", out / "backtest", [*common, *daily, f"backtest.folds={args.folds}"])
        seconds["backtest"] = time.perf_counter() - started
        folds = [
            json.loads((out / "backtest" / f"fold-{k}" / "summary.json").read_text())
            for k in range(args.folds)
        ]
        table += rows_of(f"daily, {args.folds}-fold walk-forward", pooled(folds))
    head = ["data", "share", "seed", "method", "nominal", *KEYS, "pinball", "crps", "verdict"]
    head.append("by_horizon")
    print(" | ".join(head))
    for r in table:
        cells = [r.get(k, "") for k in head[:-1]]
        cells.append(" ".join(f"{c:.3f}" for c in r["by_horizon"]))
        print(" | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in cells))
    print(", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    gap = {}  # the calibrated (aci) interval's mean distance from its nominal coverage
    for share in args.shares:
        rows = [r for r in table if r.get("share") == share and r["method"] == "aci"]
        gap[share] = float(np.mean([abs(r["coverage"] - r["nominal"]) for r in rows]))
        print(f"share {share:g}: aci coverage off nominal by {gap[share]:.4f} on average")
    result = {"bench": "calibration", "overrides": args.overrides, "coverage_gap": gap}
    print(json.dumps(result | {"results": table}))


if __name__ == "__main__":
    main()
