"""foxhunt-serve EXPORT_DIR DATA.parquet OUT.parquet: forecast with an exported model."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from foxhunt_serve.errors import InputError
from foxhunt_serve.files import write_atomic
from foxhunt_serve.forecast import BATCH, predict

MODEL_FILES = ("model.json", "model.onnx")  # what `foxhunt export` writes into EXPORT_DIR


def output_path(out: Path, data: Path, export_dir: Path, overwrite: bool) -> Path:
    """Where OUT is written, checked before any work: never the input data or the export's
    own files (whatever --overwrite says), a file in a directory that exists and takes files,
    and not an existing file unless --overwrite."""
    out = out.resolve()
    if out == data.resolve():
        raise InputError(f"{out} is the input data; give another path")
    if out in [export_dir.resolve() / name for name in MODEL_FILES]:
        raise InputError(f"{out} is the export's own {out.name}; give another path")
    if out.is_dir():
        raise InputError(f"{out} is a directory; give the path of the file to write")
    if not out.parent.is_dir():
        raise InputError(f"directory {out.parent} does not exist; make it, or give another path")
    if out.exists() and not overwrite:
        raise InputError(f"{out} exists; give another path, or --overwrite to replace it")
    probe = out.parent / f".{out.name}.{os.getpid()}.probe"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise InputError(f"cannot write in directory {out.parent}: {exc.strerror}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("export_dir", type=Path, help="holds model.onnx and model.json")
    p.add_argument("data", type=Path, help="a Parquet file of bars")
    p.add_argument("out", type=Path, help="the predictions Parquet file to write")
    p.add_argument("--all-windows", action="store_true", help="every window, not the latest")
    p.add_argument("--batch-size", type=int, default=BATCH, help="windows per ONNX Runtime run")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: its own)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing OUT (never the input data or the export's own files)",
    )
    args = p.parse_args(argv)
    try:
        if args.batch_size < 1:
            raise InputError(f"--batch-size must be 1 or more, got {args.batch_size}")
        if args.threads < 0:
            raise InputError(
                f"--threads must be 0 (ONNX Runtime's choice) or more, got {args.threads}"
            )
        out = output_path(args.out, args.data, args.export_dir, args.overwrite)
        table = predict(args.export_dir, args.data, args.all_windows, args.batch_size, args.threads)
        write_atomic(out, lambda f: pq.write_table(table, f))
    except (InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    windows = table.num_rows // max(1, len(set(table.column("horizon").to_pylist())))
    print(f"wrote {table.num_rows} rows ({windows} windows) to {out}")
    return 0
