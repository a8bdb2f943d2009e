"""The command lines of a trained model's commands, each from its composed config, its run
directory and its overrides:
- `foxhunt predict ckpt_path=/abs/best.ckpt data.path=x` forecasts with
  `foxhunt.app.predict.predictor`, writes predictions.parquet (into the run directory or
  predict.out) and prints a preview and where it wrote;
- `foxhunt export` writes model.onnx and model.json (`foxhunt.app.predict.export`) and prints
  where, the parity, then one JSON line;
- `foxhunt interpret` writes interpretation.json and its plots
  (`foxhunt.app.predict.interpret`) and prints one JSON line of where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.predict.export import JSON_FILE, ONNX_FILE, export_onnx
from foxhunt.app.predict.inference import data_changes, required_checkpoint
from foxhunt.app.predict.interpret import interpret_checkpoint
from foxhunt.app.predict.predictor import load
from foxhunt.errors import ConfigError
from foxhunt.files import check_writable, write_atomic


def preview(table: pa.Table, rows: int) -> str:
    """The first `rows` rows as an aligned text table."""

    def cell(v: Any) -> str:
        if v is None:
            return ""
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    head = [[cell(v) for v in r.values()] for r in table.slice(0, rows).to_pylist()]
    widths = [max(len(c), *(len(r[i]) for r in head)) for i, c in enumerate(table.column_names)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in head]
    header = "  ".join(c.rjust(w) for c, w in zip(table.column_names, widths, strict=True))
    more = [f"... {table.num_rows - rows} more rows"] if table.num_rows > rows else []
    return "\n".join([header, *lines, *more])


def output_path(
    out: str | Path, data: str | None, overwrite: bool, model: str | Path | None = None
) -> Path:
    """Where predict.out writes: a directory (or a path ending in /) gets predictions.parquet
    inside it. Refused, before any work: the input data (or a file inside an input directory)
    and the `model` file, whatever `overwrite` says; a directory that does not exist; any
    existing file unless `overwrite`."""
    directory = str(out).endswith("/")
    out = Path(out).expanduser().resolve()
    if out.is_dir() or directory:
        out = out / "predictions.parquet"
    if data is not None:
        source = Path(data).expanduser().resolve()
        if out == source or source in out.parents:
            raise ConfigError(f"predict.out={out} is the input data; give another path")
    if model is not None and out == Path(model).expanduser().resolve():
        raise ConfigError(f"predict.out={out} is the model (ckpt_path); give another path")
    if not out.parent.is_dir():
        raise ConfigError(
            f"predict.out={out}: directory {out.parent} does not exist; make it, or give "
            "another path"
        )
    if out.is_dir():
        raise ConfigError(f"predict.out={out} is a directory holding a predictions.parquet one")
    if out.exists() and not overwrite:
        raise ConfigError(
            f"predict.out={out} exists; give another path, or predict.overwrite=true to replace it"
        )
    check_writable(out.parent)
    return out


def predict_command(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """foxhunt predict: predict, write predictions.parquet, print a preview and where."""
    required_checkpoint(cfg)
    opts = cfg.predict
    chosen, changes = data_changes(cfg.data, overrides)
    predictor = load(
        cfg.ckpt_path,
        changes,
        device=opts.device,
        batch_size=opts.batch_size,
        data_defaults=cfg.data if chosen else None,
        calibration=None if opts.calibration is None else str(opts.calibration),
    )
    data = None if OmegaConf.is_missing(predictor.data_cfg, "path") else predictor.data_cfg.path
    out = output_path(opts.out or run_dir, data, opts.overwrite, cfg.ckpt_path)
    table = predictor.predict(all_windows=opts.all_windows)
    write_atomic(out, lambda f: pq.write_table(table, f))
    windows = table.num_rows // predictor.schema.prediction_length
    instruments = len(pc.unique(table.column("instrument")))
    print(preview(table, opts.preview_rows))
    print(
        f"wrote {table.num_rows} rows ({windows} windows of {instruments} instruments x "
        f"{predictor.schema.prediction_length} steps) to {out.resolve()}"
    )
    cal = predictor.calibration
    return {
        "predictions": str(out.resolve()),
        "rows": table.num_rows,
        "windows": windows,
        "calibration": cal.method if cal else None,
    }


def export_command(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """foxhunt export: export, print where and the parity, then one JSON line."""
    required_checkpoint(cfg)
    opts = cfg.export
    chosen, changes = data_changes(cfg.data, overrides)
    result = export_onnx(
        cfg.ckpt_path,
        opts.out or run_dir,
        changes,
        opset=opts.opset,
        overwrite=opts.overwrite,
        data_defaults=cfg.data if chosen else None,
    )
    parity = result["verification"]
    print(
        f"wrote {ONNX_FILE} ({result['onnx_bytes'] / 2**20:.1f} MB, opset {result['opset']}, "
        f"{result['precision']}) and {JSON_FILE} to {result['out']}; ONNX Runtime matches "
        f"PyTorch within {parity['max_rel_diff']:.1e} (relative) at batch "
        f"{' and '.join(map(str, parity['batch_sizes']))}"
    )
    print(json.dumps(result))
    return result


def interpret_command(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """foxhunt interpret: interpretation.json and its plots into interpret.out_dir (else the run
    directory), then one JSON line of where."""
    out_dir = Path(cfg.out_dir or run_dir)
    result = interpret_checkpoint(cfg, out_dir, overrides)
    files = ["interpretation.json", *result["plots"].values()]
    print(json.dumps({"out_dir": str(out_dir.resolve()), "files": files}))
    return result
