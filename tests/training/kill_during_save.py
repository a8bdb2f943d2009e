"""`python kill_during_save.py SAVE STAGE train.py-args...`: scripts/train.py, SIGKILLed at one
point of its SAVE-th checkpoint save (1-based, .ckpt files only). STAGE: `write` (half-way
through the bytes), `fsync` (written, not yet synced), `replace` (synced, not yet renamed) or
`dirsync` (renamed, the directory not yet synced)."""

from __future__ import annotations

import builtins
import os
import runpy
import signal
import sys
from pathlib import Path

import foxhunt_serve.files as files

SAVE, STAGE = int(sys.argv[1]), sys.argv[2]
saves = 0
real_open, real_fsync, real_replace = builtins.open, os.fsync, os.replace


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _target() -> bool:
    return saves == SAVE


class _DiesMidWrite:
    def __init__(self, f) -> None:
        self.f, self.writes = f, 0

    def write(self, data) -> int:
        self.writes += 1
        if self.writes == 3:
            _die()
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _open(path, mode="r", *args, **kwargs):
    global saves
    f = real_open(path, mode, *args, **kwargs)
    if str(path).endswith(files.TMP_SUFFIX) and ".ckpt." in Path(path).name:
        saves += 1
        if _target() and STAGE == "write":
            return _DiesMidWrite(f)
    return f


def _fsync(fd: int) -> None:
    if _target() and STAGE == "fsync":
        _die()
    real_fsync(fd)


def _replace(src, dst) -> None:
    if _target() and STAGE == "replace" and str(dst).endswith(".ckpt"):
        _die()
    real_replace(src, dst)
    if _target() and STAGE == "dirsync" and str(dst).endswith(".ckpt"):
        _die()


files.open = _open  # what the atomic writer opens (foxhunt_serve.files, foxhunt's too)
os.fsync, os.replace = _fsync, _replace
train = Path(__file__).resolve().parents[2] / "scripts" / "train.py"
sys.argv = [str(train), *sys.argv[3:]]
runpy.run_path(str(train), run_name="__main__")
