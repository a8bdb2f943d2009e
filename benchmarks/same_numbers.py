"""Two deterministic trainings and their forecasts, fingerprinted: a refactor that changes no
output (#70) gives the same row before and after.

Usage: python -m benchmarks.same_numbers [--label before]

It trains `foxhunt train trainer.deterministic=true` on the ES sample and on a generated 60-name
stock panel (`make_stock_panel`, 400 days), then forecasts each run's test file with `foxhunt
predict` (its checkpoint) and with `foxhunt-serve` (its export). The row holds every run's test
loss to every digit, its summary's headline figures, and a SHA-256 of each forecast table's
numbers; the predict and serve tables are also compared to each other. Appends one JSON line to
benchmarks/results/same_numbers.jsonl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.panel_study import commit
from foxhunt.data.samples import make_stock_panel

BIN = Path(sys.executable).parent
RESULTS = Path(__file__).parent / "results"
PANEL_NAMES, PANEL_DAYS = 60, 400


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def floats(path: Path) -> dict[str, np.ndarray]:
    """A forecast table's float columns."""
    table = pq.read_table(path)
    kept = (c for c in table.column_names if table[c].type in ("float", "double"))
    return {c: table[c].to_numpy(zero_copy_only=False).astype(np.float64) for c in sorted(kept)}


def fingerprint(path: Path) -> str:
    columns = floats(path)
    return digest(
        json.dumps(list(columns)).encode() + b"".join(v.tobytes() for v in columns.values())
    )


def run(*args: str | Path) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{args[:2]} failed:\n{done.stderr[-3000:]}")


def case(name: str, work: Path, data: list[str]) -> dict:
    """One deterministic training, its predict and its served forecasts."""
    run_dir = work / name
    run(BIN / "foxhunt", "train", "trainer.deterministic=true", *data,
        f"data.cache_dir={work / 'cache'}", f"hydra.run.dir={run_dir}")  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    test_file = data[0].split("=", 1)[1]
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    predicted, served = work / f"{name}_predict.parquet", work / f"{name}_serve.parquet"
    run(BIN / "foxhunt", "predict", f"ckpt_path={ckpt}", f"predict.out={predicted}",
        f"hydra.run.dir={work / (name + '_predict')}", *data[:1])  # fmt: skip
    run(BIN / "foxhunt", "export", f"ckpt_path={ckpt}", f"export.out={work / (name + '_export')}",
        f"hydra.run.dir={work / (name + '_export_run')}")  # fmt: skip
    run(BIN / "foxhunt-serve", work / f"{name}_export", test_file, served)
    p, s = floats(predicted), floats(served)
    common = [c for c in p if c in s and p[c].shape == s[c].shape]
    figures = {k: summary[k] for k in ("metrics", "evaluation")}
    return {
        "test_loss": repr(summary["metrics"]["test_loss"]),
        "calibrated_test_loss": repr(summary["metrics"].get("calibrated_test_loss")),
        "figures": digest(json.dumps(figures, sort_keys=True).encode()),
        "test_forecasts": fingerprint(run_dir / "test_forecasts.parquet"),
        "predict": fingerprint(predicted),
        "serve": fingerprint(served),
        # the largest difference where both have a number (NaN: an actual not yet realised)
        "serve_vs_predict": max(
            (float(np.nanmax(d)) for c in common if np.isfinite(d := np.abs(p[c] - s[c])).any()),
            default=None,
        ),
        "same_missing": all(np.array_equal(np.isnan(p[c]), np.isnan(s[c])) for c in common),
        "compared_columns": len(common),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="")
    label = ap.parse_args().label
    work = Path(tempfile.mkdtemp(prefix="same_numbers_"))
    panel = make_stock_panel(work / "panel.parquet", PANEL_NAMES, days=PANEL_DAYS, seed=0)
    row = {"bench": "same_numbers", "label": label, "commit": commit()}
    row["sample"] = case(
        "sample", work, [f"data.path={Path('data/ES_FUT_small.parquet').resolve()}"]
    )
    row["panel"] = case("panel", work, [f"data.path={Path(panel).resolve()}"])
    hashes = ("figures", "test_forecasts", "predict", "serve")
    print(
        f"{'case':<7} {'test loss':<22} " + " ".join(f"{h:<16}" for h in hashes) + " serve-predict"
    )
    for key in ("sample", "panel"):
        r = row[key]
        said = " ".join(f"{r[h]:<16}" for h in hashes)
        print(f"{key:<7} {r['test_loss']:<22} {said} {r['serve_vs_predict']}")
    with open(RESULTS / "same_numbers.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
