"""Train a Temporal Fusion Transformer: `python scripts/train.py model=tft_small ...`."""

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt import cli
from foxhunt.training.run import train


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@cli.task
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    summary = train(
        cfg, Path(hydra_cfg.runtime.output_dir), overrides=list(hydra_cfg.overrides.task)
    )
    print(json.dumps(summary))
    return summary["metrics"][cfg.optimized_metric]  # the value a Hydra sweeper optimises


if __name__ == "__main__":
    cli.run(main)
