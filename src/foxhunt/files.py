"""Files foxhunt writes and reads: written whole or not at all, and never able to run code.

Every result file (checkpoints, exports, summary.json, status.json, predictions.parquet) is
written whole or not at all, by the serving core's `atomic_file` (`foxhunt_serve.files`: a temp
file beside it, fsynced, then replaced). A killed writer leaves a `.<name>.<pid>.foxhunt-tmp`
file behind; `remove_stale_temps` clears those of dead processes at the next start.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from foxhunt_serve import TMP_SUFFIX, atomic_file, write_atomic
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from foxhunt.errors import CheckpointError, WriteError

_TMP_NAME = re.compile(r"^\..+\.(\d+)" + re.escape(TMP_SUFFIX) + "$")


def write_text(path: str | Path, text: str) -> None:
    with atomic_file(path, "w") as f:
        f.write(text)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def check_writable(directory: str | Path) -> None:
    """Prove a file can be made in `directory`, or in the nearest existing folder above it
    when it is not there yet (nothing is created); WriteError if not. Permission bits do not
    say: root ignores them, an immutable folder or a read-only mount does not."""
    directory = Path(directory).absolute()
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    probe = existing / f".probe.{os.getpid()}{TMP_SUFFIX}"
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise WriteError(f"cannot write in {directory}: {exc.strerror or exc}") from None


def alive(pid: int) -> bool:
    """Whether process `pid` is running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_temps(*directories: str | Path) -> list[Path]:
    """Delete the temp files that killed writers left in `directories`; returns them."""
    removed = []
    for directory in directories:
        if not Path(directory).is_dir():
            continue
        for p in Path(directory).iterdir():
            m = _TMP_NAME.match(p.name)
            if m and int(m.group(1)) != os.getpid() and not alive(int(m.group(1))):
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


# --- reading: nothing runs ------------------------------------------------------------------

# What weights_only loading may build beyond its defaults. foxhunt's checkpoints and legacy
# exports hold only tensors, torch.Size, dicts, lists, tuples, numbers, strings and None (the
# numpy RNG state is stored with its key array as a tensor), which the defaults cover: every
# version since the first was checked (tests/training/test_checkpoint_io.py), so this stays empty.
ALLOWED_GLOBALS: list[Any] = []
EXPORT_KEY = "foxhunt"  # the safetensors metadata entry that holds the export's JSON


def _refusal(exc: Exception) -> str:
    """What the weights-only unpickler refused, from its message."""
    text = str(exc)
    found = re.search(r"GLOBAL (\S+)", text)
    if found:
        return f"it holds {found.group(1)}, which no foxhunt file contains"
    found = re.search(r"WeightsUnpickler error: (.+)", text, re.DOTALL)
    detail = " ".join(found.group(1).split()) if found else type(exc).__name__
    return f"its contents are not a foxhunt file's ({detail[:120]})"


def load_file(path: str | Path, map_location: Any = "cpu") -> Any:
    """A checkpoint or legacy `.pt` export, loaded without running anything it holds;
    CheckpointError (one line) for anything else, before any of it runs."""
    path = Path(path)
    try:
        mmap = zipfile.is_zipfile(path)  # tensors paged in only when used (zip format only)
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"refused to load {path}: {_refusal(exc)}") from None
    except Exception as exc:  # any unreadable file is the same user-facing problem
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}") from None


def write_export(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> int:
    """A safetensors file of `tensors` with `meta` as JSON in its header, written atomically;
    returns its size in bytes."""
    # contiguous copies: safetensors refuses views and tensors that share memory
    data = safetensors_bytes(
        {k: v.detach().contiguous().clone() for k, v in tensors.items()},
        metadata={EXPORT_KEY: json.dumps(meta)},
    )
    write_atomic(path, lambda f: f.write(data))
    return len(data)


def read_export(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, metadata) of a foxhunt safetensors export; CheckpointError if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[EXPORT_KEY])
            return {k: f.get_tensor(k) for k in f.keys()}, meta
    except Exception as exc:  # noqa: BLE001 - not a file of ours, whatever the reason
        raise CheckpointError(
            f"cannot read {path} as a foxhunt export: {type(exc).__name__}"
        ) from None
