"""Checkpoint IO: Lightning's `.ckpt` files read without running code and written atomically.

Every load of a checkpoint, Lightning's own (`fit(ckpt_path=)`, `test(ckpt_path=)`) included,
goes through `foxhunt.files.load_file` (weights-only unpickling); every save through
`foxhunt.files.write_atomic` (temp file beside it, fsync, replace, loud on failure).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from foxhunt.errors import CheckpointError
from foxhunt.files import load_file, write_atomic
from foxhunt.training.module import TFTModule, check_hparams, upgrade


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with foxhunt's reading and writing. Lightning's own
    `_atomic_save` writes through a temp file in `$TMPDIR`, "moved" by truncate-then-copy when
    that is another filesystem, and drops a PermissionError: a failed save went unnoticed."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: torch.save(checkpoint, f))

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None):
        ckpt = load_file(path, map_location or "cpu")
        return _checked(
            ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None, ckpt, path
        )


def _checked(hparams: Any, ckpt: Any, path: Any) -> Any:
    """The loaded checkpoint with its hyper_parameters checked (`check_hparams`) and upgraded
    to this foxhunt's reading of them (`upgrade`: their format's missing keys filled in)."""
    check_hparams(hparams, path)
    if "model" in hparams and "optim" in hparams:
        ckpt["hyper_parameters"] = upgrade(hparams, path)
    return ckpt


def read_checkpoint(ckpt_path: str | Path) -> tuple[Path, Any]:
    """Resolve a checkpoint (or legacy `.pt` export) to an absolute path and load it safely,
    its hyper-parameters checked (`check_hparams`), or fail loudly."""
    path = Path(ckpt_path).expanduser().resolve()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    ckpt = load_file(path)
    if isinstance(ckpt, dict) and "hyper_parameters" in ckpt:
        ckpt = _checked(ckpt["hyper_parameters"], ckpt, path)
    return path, ckpt


def read_checkpoint_hparams(ckpt_path: str | Path) -> tuple[Path, dict[str, Any], Any]:
    """(absolute path, hyperparameters, the whole checkpoint) of a foxhunt checkpoint."""
    path, ckpt = read_checkpoint(ckpt_path)
    if not isinstance(ckpt, dict) or "schema" not in ckpt.get("hyper_parameters", {}):
        raise CheckpointError(f"{path} is not a foxhunt TFT checkpoint (no data schema)")
    return path, ckpt["hyper_parameters"], ckpt


def annotate_checkpoint(ckpt_path: str | Path, **entries: Any) -> None:
    """Add top-level entries (plain containers) to a written checkpoint, atomically: what a
    run learns about its best model after training (the calibration)."""
    path, ckpt = read_checkpoint(ckpt_path)
    ckpt.update(entries)
    write_atomic(path, lambda f: torch.save(ckpt, f))


def calibration_of(ckpt: Any) -> dict[str, Any] | None:
    """A loaded checkpoint's calibration (None: none): JSON text since #68, a dict before. As
    text it unpickles in milliseconds; its per-name grids as nested lists took a second a read
    on a 250-name panel (torch's weights-only unpickler is Python, an object at a time)."""
    found = ckpt.get("calibration") if isinstance(ckpt, dict) else None
    return json.loads(found) if isinstance(found, str) else found


def load_module(ckpt: dict[str, Any], **model_changes: Any) -> TFTModule:
    """The TFTModule of a loaded checkpoint, in eval mode (Lightning's `load_from_checkpoint`
    would read the file again, with its own loader)."""
    hparams = dict(ckpt["hyper_parameters"])
    hparams["model"] = {**hparams["model"], **model_changes}
    module = TFTModule(**hparams)
    module.load_state_dict(ckpt["state_dict"])
    return module.eval()
