"""The tune command line: `foxhunt tune` runs a study (`foxhunt.app.tune.search`) and prints
where its report is, then one JSON line."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from foxhunt.app.tune import search


def tune_command(cfg: DictConfig, overrides: list[str]) -> float | None:
    """foxhunt tune: the study's summary as one JSON line; its best validation loss, for a
    sweeper."""
    summary = search.tune(cfg, overrides=overrides)
    if "best_trial" in summary:
        print(f"tune: {Path(summary['study_dir']) / search.REPORT}")
    print(json.dumps(summary))
    return summary.get("best_val_loss")
