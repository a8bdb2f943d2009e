"""Tuning without fooling yourself: `python scripts/tune.py [train.py's overrides] tune.trials=40
tune.jobs=2 tune.folds=3 tune_space=tft` (docs/tune.md)."""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt.app import cli, tune


@cli.main("tune")
def main(cfg: DictConfig) -> float | None:
    summary = tune.tune(cfg, overrides=list(HydraConfig.get().overrides.task))
    study_dir = Path(summary["study_dir"])
    if "best_trial" in summary:
        print(f"tune: {study_dir / tune.REPORT}")
    print(json.dumps(summary))
    return summary.get("best_val_loss")


if __name__ == "__main__":
    cli.run(main)
