"""ACI's latest forecasts from the state a run stored against a full replay of the file from the
nominal level (#68): the same checkpoint, the same file, `foxhunt predict` of each
instrument's latest window both ways.

    python -m benchmarks.bench_replay CKPT DATA.parquet

Prints a table (each way's time, and how far apart their quantiles are: the largest absolute
difference, and as a share of the outermost interval's width) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import foxhunt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("data")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    predictor = foxhunt.load(a.ckpt)
    began = time.perf_counter()
    resumed = predictor.predict(a.data)
    resumed_s = time.perf_counter() - began
    predictor.calibration.state = None  # as a checkpoint from before the state
    began = time.perf_counter()
    full = predictor.predict(a.data)
    full_s = time.perf_counter() - began
    columns = [c for c in resumed.column_names if c.startswith("q")]
    got, want = (np.column_stack([t[c].to_numpy() for c in columns]) for t in (resumed, full))
    width = want[:, -1] - want[:, 0]
    apart = np.abs(got - want).max(axis=1)
    row = {
        "bench": "replay",
        "rows": resumed.num_rows,
        "resumed_s": round(resumed_s, 2),
        "full_replay_s": round(full_s, 2),
        "max_abs_diff": float(apart.max()),
        "max_share_of_width": float((apart / width).max()),
        "median_share_of_width": float(np.median(apart / width)),
        "p95_share_of_width": float(np.quantile(apart / width, 0.95)),
        "load_before": round(load, 2),
    }
    print(f"{'way':<22} {'seconds':>8}")
    print(f"{'from the stored state':<22} {resumed_s:>8.2f}")
    print(f"{'full replay':<22} {full_s:>8.2f}")
    share, median = row["max_share_of_width"], row["median_share_of_width"]
    print(
        f"quantiles apart: {row['max_abs_diff']:.2g} at most, {share:.2%} of the width "
        f"(median {median:.2%}, 95th percentile {row['p95_share_of_width']:.2%})"
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
