"""How much memory does the DataModule need? The lazy path (data.lazy) against the in-memory one.

    python benchmarks/bench_data.py [--instruments 40] [--rows 100000] [--features 30]
        [--layout instrument|month] [--modes eager,lazy,lazy-cached] [--dir DIR] [--keep]

Writes a directory of Parquet files (one per instrument, or one per month holding every
instrument), file by file so that the generator holds one file. Then each mode runs in its own
subprocess, so that peaks do not mix: `ParquetDataModule.setup()` and one pass over the train
loader. `lazy` builds the window store in a fresh cache folder, `lazy-cached` reopens it.

Measured per mode: wall time of setup and of the epoch; peak RSS (VmHWM of /proc/self/status:
every page the process held, including window-store pages mapped from the page cache, which
the kernel can drop and reread); peak anonymous RSS (RssAnon sampled every 5 ms, less its value
before setup, about 340 MiB of torch and Lightning: the memory the data needs that must fit in
RAM). A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from foxhunt.data.samples.synthetic import synthetic_panel

MIB = 2**20
T0 = np.datetime64("2020-01-06T00:00:00", "ns").astype(np.int64)
BAR_NS = 60 * 10**9


def generate(folder: Path, instruments: int, rows: int, features: int, layout: str) -> int:
    """Write the data set; returns its uncompressed size in bytes (the Parquet footers')."""
    folder.mkdir(parents=True)
    months = 12 if layout == "month" else 1
    per_month = rows // months
    for m in range(months):
        parts = []
        for i in range(instruments):
            n = per_month if m < months - 1 else rows - per_month * (months - 1)
            # a random-walk target and noise features, float64 as market data usually come
            panel = synthetic_panel(
                [f"I{i:04d}"], n, features, phi=1.0, seed=[i, m], dtype=np.float64
            )
            t = T0 + BAR_NS * (m * per_month + panel.pop("time"))
            table = pa.table(
                {
                    "timestamp": pa.array(t, pa.timestamp("ns", tz="UTC")),
                    "symbol": pa.array(panel.pop("series")).dictionary_encode(),
                    "k1": np.sin(np.arange(n) / 60.0),
                    **panel,  # target, f0, f1, ...
                }
            )
            if layout == "instrument":
                pq.write_table(table, folder / f"I{i:04d}.parquet")
            else:
                parts.append(table)
        if parts:
            pq.write_table(pa.concat_tables(parts), folder / f"month-{m:02d}.parquet")
    return sum(
        pq.ParquetFile(f).metadata.row_group(g).total_byte_size
        for f in sorted(folder.glob("*.parquet"))
        for g in range(pq.ParquetFile(f).metadata.num_row_groups)
    )


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


class AnonPeak:
    """Samples RssAnon in a thread: the peak of memory not backed by a file."""

    def __init__(self, every_s: float = 0.005) -> None:
        self.peak, self.every_s = _status("RssAnon"), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, _status("RssAnon"))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status("RssAnon"))


def child(args: argparse.Namespace) -> None:
    """One mode in this process: setup and one epoch; prints one JSON line."""
    import torch

    from foxhunt.config import DataConfig
    from foxhunt.data.datamodule import ParquetDataModule
    from foxhunt.data.store import eager_bytes_estimate

    torch.set_num_threads(args.threads)
    cfg = DataConfig(
        path=str(args.dir / "data"),
        group_column="symbol",
        target="target",
        features=[f"f{j}" for j in range(args.features)],
        known_features=["k1"],
        encoder_length=64,
        prediction_length=8,
        batch_size=args.batch_size,
        lazy=args.child != "eager",
        cache_dir=str(args.dir / "cache"),
    )
    baseline = _status("RssAnon")  # the interpreter, torch and Lightning, before any data
    sampler = AnonPeak()
    start = time.perf_counter()
    dm = ParquetDataModule(cfg)
    dm.setup()
    setup_s = time.perf_counter() - start
    setup_anon = sampler.peak - baseline
    windows = 0
    start = time.perf_counter()
    for batch in dm.train_dataloader():
        windows += len(batch["target"])
    epoch_s = time.perf_counter() - start
    anon = sampler.stop()
    store_bytes = sum(p.stat().st_size for p in dm.store_path.iterdir()) if dm.store_path else 0
    print(
        json.dumps(
            {
                "mode": args.child,
                "rows": len(dm.datasets["train"].inputs),
                "encoder_columns": len(dm.schema.encoder_columns),
                "train_windows": windows,
                "setup_s": setup_s,
                "epoch_s": epoch_s,
                "baseline_anon_mib": baseline / MIB,
                "setup_peak_anon_mib": setup_anon / MIB,
                "peak_anon_mib": (anon - baseline) / MIB,
                "peak_rss_mib": _status("VmHWM") / MIB,
                "store_mib": store_bytes / MIB,
                "eager_estimate_mib": eager_bytes_estimate(cfg) / MIB,
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instruments", type=int, default=40)
    p.add_argument("--rows", type=int, default=100_000, help="rows per instrument")
    p.add_argument("--features", type=int, default=30, help="observed feature columns")
    p.add_argument("--layout", choices=("instrument", "month"), default="instrument")
    p.add_argument("--modes", default="eager,lazy,lazy-cached")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the data and the store")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    work = args.dir or Path(tempfile.mkdtemp(prefix="foxhunt-bench-data-"))
    args.dir = work
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(work / "cache", ignore_errors=True)
    start = time.perf_counter()
    uncompressed = generate(data, args.instruments, args.rows, args.features, args.layout)
    on_disk = sum(f.stat().st_size for f in data.glob("*.parquet"))
    print(
        f"data: {args.instruments} instruments x {args.rows:,} rows x {args.features} features "
        f"(+ target, known, time, symbol), {args.layout} files: {uncompressed / 2**30:.2f} GiB "
        f"uncompressed, {on_disk / 2**30:.2f} GiB on disk, written in "
        f"{time.perf_counter() - start:.0f} s"
    )
    print(
        f"{'mode':<13}{'setup s':>9}{'epoch s':>9}{'+anon MiB':>11}{'setup +anon':>13}"
        f"{'peak RSS MiB':>14}"
        f"{'store MiB':>11}{'estimate MiB':>14}"
    )
    results = []
    try:
        for mode in args.modes.split(","):
            command = [sys.executable, __file__, "--child", mode, "--dir", str(work)]
            command += ["--features", str(args.features), "--batch-size", str(args.batch_size)]
            command += ["--threads", str(args.threads)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            results.append(r)
            print(
                f"{mode:<13}{r['setup_s']:>9.1f}{r['epoch_s']:>9.1f}{r['peak_anon_mib']:>11,.0f}"
                f"{r['setup_peak_anon_mib']:>13,.0f}"
                f"{r['peak_rss_mib']:>14,.0f}{r['store_mib']:>11,.0f}"
                f"{r['eager_estimate_mib']:>14,.0f}",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "instruments": args.instruments,
                "rows_per_instrument": args.rows,
                "features": args.features,
                "layout": args.layout,
                "uncompressed_bytes": uncompressed,
                "parquet_bytes": on_disk,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
