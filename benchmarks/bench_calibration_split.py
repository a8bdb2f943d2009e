"""Held-out test coverage with the conformal calibration fitted on the validation windows that
also stopped training and chose the checkpoint (data.calibration_share=0), and on a share of
the validation dates held out of that choice (with the embargo between them), on the bundled
sample and on a planted panel.

    python benchmarks/planted_panel.py /tmp/panel250/panel.parquet --names 250 --days 1500
    python benchmarks/bench_calibration_split.py [--shares 0,0.5] [--panel PARQUET]
        [--out DIR] [override ...]

One training per data set and share, one at a time. Per run and method (the model's own
quantiles, cqr, aci; the delivered one is the configured calibration.method) and interval: its
nominal coverage, the test coverage, the error from nominal, the mean absolute error of each
instrument's coverage (`by_name`), the mean width (normalized units) and the pinball loss.
Prints a table, then one JSON line with the mean absolute coverage error of each method per
share. `--no-train`: read the summaries an earlier run left in --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_real_daily import ROOT, run
from benchmarks.planted_panel import OVERRIDES

LIGHT = ["report=false", "trainer.enable_progress_bar=false"]


def rows_of(data: str, share: float, seconds: float, cal: dict[str, Any]) -> list[dict]:
    """One row per method and interval of a summary's `calibration`."""
    out = []
    for method, figures in {"model": cal["before"], **cal["methods"]}.items():
        for interval in figures["intervals"]:
            by_name = list(interval["coverage_by_instrument"].values())
            out.append(
                {
                    "data": data,
                    "share": share,
                    "method": method,
                    "nominal": interval["nominal"],
                    "coverage": interval["coverage"],
                    "error": interval["coverage"] - interval["nominal"],
                    "by_name": float(np.mean(np.abs(np.subtract(by_name, interval["nominal"])))),
                    "width": interval["width"],
                    "pinball": figures["pinball"],
                    "windows": cal["calibration_windows"],
                    "seconds": seconds,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_calibration_split")
    parser.add_argument("--shares", default="0,0.5")
    parser.add_argument("--panel", type=Path, default=None, help="a planted_panel.py parquet")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    sets = {"sample": []}
    if args.panel is not None:
        sets["panel"] = [*OVERRIDES, f"data.path={args.panel.resolve()}"]
    table = []
    for data, more in sets.items():
        for share in shares:
            where = args.out.resolve() / f"{data}-{share:g}"
            overrides = [*LIGHT, *more, f"data.calibration_share={share}", *args.overrides]
            seconds = 0.0 if args.no_train else run("train.py", where, overrides)
            summary = json.loads((where / "summary.json").read_text())
            table += rows_of(data, share, seconds, summary["calibration"])
            print(f"{data}, share {share:g}: {seconds:.0f} s", flush=True)
    head = ["data", "share", "method", "nominal", "coverage", "error", "by_name", "width"]
    head += ["pinball", "windows", "seconds"]
    print(" | ".join(head))
    for r in table:
        print(" | ".join(f"{r[k]:.4f}" if isinstance(r[k], float) else str(r[k]) for k in head))
    gap: dict[str, dict[str, float]] = {}  # mean |coverage - nominal| over data sets, intervals
    for share in shares:
        for method in ("model", "cqr", "aci"):
            errors = [
                abs(r["error"]) for r in table if r["share"] == share and r["method"] == method
            ]
            gap.setdefault(f"{share:g}", {})[method] = float(np.mean(errors)) if errors else None
        print(f"share {share:g}: mean |coverage - nominal| {gap[f'{share:g}']}")
    result = {"bench": "calibration_split", "overrides": args.overrides, "coverage_gap": gap}
    print(json.dumps(result | {"results": table}))


if __name__ == "__main__":
    main()
