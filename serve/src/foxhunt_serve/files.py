"""Files written whole or not at all: a temp file in the destination's own directory, flushed
and fsynced, then `os.replace`d over it, so a reader, or a writer killed at any point, sees the
old file or the new one, never half of one. The temp file lives beside the destination, not in
`$TMPDIR`, so the replace is a rename on one filesystem (a "move" across filesystems is a
truncate-then-copy). A killed writer leaves a `.<name>.<pid>.foxhunt-tmp` file behind (foxhunt's
`remove_stale_temps` clears those of dead processes). foxhunt writes every result file this way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from foxhunt_serve.errors import WriteError

TMP_SUFFIX = ".foxhunt-tmp"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power cut
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """An open temp file beside `path`; when the block ends without an error it is fsynced and
    replaces `path`. Any OSError (here or in the block) is a WriteError naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # an unwritable directory: the error above already names it


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], Any]) -> None:
    """`write(f)` into a temp file beside `path`, then replace `path` with it (see module)."""
    with atomic_file(path) as f:
        write(f)
