"""A panel's latest forecasts, served (#68): each way's wall time and where it goes.

    python -m benchmarks.bench_serve CKPT EXPORT_DIR DATA.parquet [--label panel250]

CKPT is a run's best checkpoint, EXPORT_DIR its `foxhunt export`, DATA the file it was trained
on (its state's time near the file's end, as a daily job finds it). Measured, one after the
other (run it alone: the load average before each is recorded):

- `foxhunt-serve` and `foxhunt predict` on DATA, each a fresh process (its imports, the
  checkpoint or export read, the session opened);
- `foxhunt-serve` on DATA's last 14 months;
- in one process, the consumer's parts on DATA: reading the file, the windows (features,
  cross-section, normalization), ONNX Runtime, calibration;
- `foxhunt_serve.Forecaster.predict` on an open session: its first call, a call a bar later
  (each name's last bar arrived since the call before: the model runs on the new windows alone)
  and the same table again.

Prints a table and one JSON line, appended to benchmarks/results/serve_68.jsonl.
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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from foxhunt_serve.calibration import stored_outputs
from foxhunt_serve.forecast import Forecaster, Todo, calibrated, run_model
from foxhunt_serve.read import group_codes, time_ns, zone_of
from foxhunt_serve.windows import build_windows

from benchmarks.panel_study import RESULTS, commit

MONTHS_NS = 14 * 30.44 * 86_400 * 10**9  # the last 14 months of the file
BIN = Path(sys.executable).parent


def wall(command: list[str]) -> dict[str, float]:
    """A command's wall seconds as a fresh process, and the load average before it."""
    load = os.getloadavg()[0]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return {"s": round(time.perf_counter() - began, 2), "load_before": round(load, 2)}


def parts(export: Path, data: Path) -> dict[str, float]:
    """The consumer's seconds on `data` by part, in one process (the session open already)."""
    served = Forecaster(export)
    meta, clock = served.meta, time.perf_counter
    t0 = clock()
    table = pq.read_table(data)
    t1 = clock()
    todo = Todo.of(meta["calibration"], False)
    w = build_windows(table, meta, todo.every, str(data), replay=todo.replay)
    t2 = clock()
    held = None
    if todo.replay is not None:  # as `forecast` runs it: the state's held windows not run
        shape = (len(w.starts), meta["prediction_length"], len(meta["quantiles"]))
        held = stored_outputs(meta["calibration"], w.instrument, w.origin_ns, shape)
    out = run_model(served.session, meta, w, served.batch_size, None, held)
    t3 = clock()
    calibrated(meta, w, out, todo.replay is not None)
    t4 = clock()
    return {
        "read_s": round(t1 - t0, 3),
        "windows_s": round(t2 - t1, 3),
        "onnx_s": round(t3 - t2, 3),
        "calibration_s": round(t4 - t3, 3),
        "windows": len(w.starts),
        "windows_run": int(len(w.starts) - (0 if held is None else held[0].sum())),
        "names": len(set(w.instrument)),
    }


def a_bar_before(table: pa.Table, data: dict[str, Any]) -> pa.Table:
    """`table` as it was a bar before: each name's last row dropped."""
    t = time_ns(table, data["time_column"], data["time_unit"], zone_of(data))
    codes, _ = group_codes(table, data["group_column"])
    order = np.lexsort((t, codes))
    keep = np.ones(table.num_rows, bool)
    keep[order[np.r_[codes[order][1:] != codes[order][:-1], True]]] = False
    return table.filter(pa.array(keep))


def live(export: Path, data: Path) -> dict[str, float]:
    """Forecaster.predict's milliseconds: the first call (a bar before), a bar later, again."""
    served = Forecaster(export)
    table = pq.read_table(data)
    before = a_bar_before(table, served.meta["data"])
    session, ran, timed = served.session, [], {}

    def run(names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        ran.append(len(feed["encoder_observed"]))
        return session.run(names, feed)

    served.session = SimpleNamespace(run=run)
    for label, t in (("first", before), ("a_bar_later", table), ("same_again", table)):
        ran.clear()
        began = time.perf_counter()
        served.predict(t)
        timed[f"{label}_ms"] = round(1000 * (time.perf_counter() - began), 1)
        timed[f"{label}_windows_run"] = sum(ran)
    return timed


def last_months(data: Path, time_column: str, out: Path) -> int:
    """DATA's last 14 months written to `out`; their rows."""
    table = pq.read_table(data)
    t = table[time_column].cast(pa.int64()).to_numpy()
    recent = table.filter(pa.array(t >= t.max() - MONTHS_NS))
    pq.write_table(recent, out)
    return recent.num_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("export", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--label", default="panel")
    a = ap.parse_args()
    meta = json.loads((a.export / "model.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    recent = work / "recent.parquet"
    row = {"bench": "serve", "label": a.label, "rows": pq.read_metadata(a.data).num_rows}
    row["recent_rows"] = last_months(a.data, meta["data"]["time_column"], recent)
    serve = [str(BIN / "foxhunt-serve"), str(a.export)]
    row["serve"] = wall([*serve, str(a.data), str(work / "a.parquet")])
    row["serve_14_months"] = wall([*serve, str(recent), str(work / "b.parquet")])
    predict = [str(BIN / "foxhunt"), "predict", f"ckpt_path={a.ckpt.resolve()}"]
    predict += [f"data.path={a.data.resolve()}", f"predict.out={work / 'c.parquet'}"]
    row["predict"] = wall([*predict, f"hydra.run.dir={work / 'run'}"])
    row["parts"] = parts(a.export, a.data)
    row["parts_14_months"] = parts(a.export, recent)
    row["forecaster"] = live(a.export, a.data)
    row["forecaster_14_months"] = live(a.export, recent)
    row |= {"cpu": os.cpu_count(), "commit": commit()}
    table(row)
    with open(RESULTS / "serve_68.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


def table(row: dict[str, Any]) -> None:
    print(f"{row['label']}: {row['rows']} rows, the last 14 months {row['recent_rows']}")
    print(f"{'way':<34} {'seconds':>8} {'load':>5}")
    for key in ("serve", "serve_14_months", "predict"):
        print(f"{key:<34} {row[key]['s']:>8.2f} {row[key]['load_before']:>5.2f}")
    for key in ("parts", "parts_14_months"):
        p = row[key]
        split = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in p.items() if k.endswith("_s"))
        print(
            f"{key}: {p['windows']} windows ({p['windows_run']} run) of {p['names']} names; {split}"
        )
    for key in ("forecaster", "forecaster_14_months"):
        calls = [k[:-3] for k in row[key] if k.endswith("_ms")]
        said = (
            f"{c} {row[key][c + '_ms']:.0f} ms ({row[key][c + '_windows_run']} run)" for c in calls
        )
        print(f"{key}: " + ", ".join(said))


if __name__ == "__main__":
    main()
