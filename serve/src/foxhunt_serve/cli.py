"""foxhunt-serve EXPORT_DIR DATA.parquet OUT.parquet: forecast with an exported model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from foxhunt_serve.errors import InputError
from foxhunt_serve.forecast import predict, write_atomic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("export_dir", type=Path, help="holds model.onnx and model.json")
    p.add_argument("data", type=Path, help="a Parquet file of bars")
    p.add_argument("out", type=Path, help="the predictions Parquet file to write")
    p.add_argument("--all-windows", action="store_true", help="every window, not the latest")
    p.add_argument("--batch-size", type=int, default=256, help="windows per ONNX Runtime run")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: its own)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    args = p.parse_args(argv)
    try:
        out = args.out.resolve()
        if out == args.data.resolve():
            raise InputError(f"{out} is the input data; give another path")
        if out.exists() and not args.overwrite:
            raise InputError(f"{out} exists; give another path, or --overwrite to replace it")
        if args.batch_size < 1:
            raise InputError(f"--batch-size must be positive, got {args.batch_size}")
        table = predict(args.export_dir, args.data, args.all_windows, args.batch_size, args.threads)
        write_atomic(table, out)
    except (InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    windows = table.num_rows // max(1, len(set(table.column("horizon").to_pylist())))
    print(f"wrote {table.num_rows} rows ({windows} windows) to {out}")
    return 0
