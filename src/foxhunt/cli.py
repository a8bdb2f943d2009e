"""Entry-point plumbing shared by the scripts: one-line user errors and exit code 2."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from foxhunt.config import register_configs
from foxhunt.errors import FoxhuntError

EXIT_USER_ERROR = 2
_task_started = False


def task(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Hydra task: a FoxhuntError becomes `error: <message>` on stderr and exit 2
    (the traceback only with HYDRA_FULL_ERROR=1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _task_started
        _task_started = True
        try:
            return fn(*args, **kwargs)
        except FoxhuntError as exc:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


def run(hydra_main: Callable[[], Any]) -> None:
    """Call a `@hydra.main` function. Hydra exits 1 when an override is invalid, before any
    task starts; that is the user's error too, so it exits 2 like the others."""
    register_configs()
    try:
        hydra_main()
    except SystemExit as exc:
        if exc.code == 1 and not _task_started:
            sys.exit(EXIT_USER_ERROR)
        raise
