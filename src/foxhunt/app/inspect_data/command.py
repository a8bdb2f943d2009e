"""The inspect command line: `foxhunt inspect data.path=...` prints what foxhunt will make of a
data file (`foxhunt.app.inspect_data.inspection`), each problem on its own line, then one JSON
line of the facts."""

from __future__ import annotations

import json

from omegaconf import DictConfig

from foxhunt.app.inspect_data.inspection import inspect_data


def inspect_command(cfg: DictConfig) -> bool:
    """foxhunt inspect: the facts and the problems; whether it found any (the command then
    exits 2)."""
    found = inspect_data(cfg, time_batches=bool(cfg.get("time_batches", True)))
    print("\n".join(found.lines))
    print(f"problems: {len(found.problems) or 'none'}")
    for problem in found.problems:
        print(f"problem: {problem}")
    print(json.dumps(found.facts | {"problems": found.problems}))
    return bool(found.problems)
