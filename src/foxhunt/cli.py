"""Entry-point plumbing shared by the scripts: one-line user errors and exit code 2."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
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
            if _in_multirun():
                # one invalid combination fails its job, not the sweep; the summary shows it
                _record_invalid(str(exc))
                return float("nan")
            sys.exit(EXIT_USER_ERROR)

    return wrapper


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _record_invalid(error: str) -> None:
    from hydra.core.hydra_config import HydraConfig

    out = Path(HydraConfig.get().runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "status.json").write_text(json.dumps({"status": "invalid", "error": error}) + "\n")


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
