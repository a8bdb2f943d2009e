"""model.json and model.onnx: a foxhunt ONNX export, read and checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from foxhunt_serve.errors import InputError

FORMAT, FORMAT_VERSION = "foxhunt-onnx", 1


def read_export(export_dir: Path) -> tuple[dict[str, Any], bytes]:
    """model.json and the model.onnx it describes (checked by its SHA-256)."""
    try:
        meta = json.loads((export_dir / "model.json").read_text())
        model = (export_dir / meta["model_file"]).read_bytes()
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{export_dir} holds no foxhunt ONNX export: {exc}") from None
    if meta.get("format") != FORMAT or meta.get("format_version", 0) > FORMAT_VERSION:
        raise InputError(
            f"{export_dir}/model.json is not a {FORMAT} export of version {FORMAT_VERSION} or "
            f"earlier (format {meta.get('format')!r}, version {meta.get('format_version')!r})"
        )
    if hashlib.sha256(model).hexdigest() != meta.get("sha256"):
        raise InputError(f"{export_dir}/{meta['model_file']} is not the one model.json describes")
    return meta, model
