"""Train a Temporal Fusion Transformer: `python scripts/train.py model=tft_small ...`."""

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from foxhunt import cli
from foxhunt.report import console_summary
from foxhunt.sweep import finished_job
from foxhunt.train import train


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@cli.task
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # +sweep.resume=true: a job that finished is not re-run
    summary = finished_job(run_dir, sweep_resumed=bool(cfg.get("sweep", {}).get("resume")))
    if summary is None:
        summary = train(cfg, run_dir, overrides=list(hydra_cfg.overrides.task))
    if rank_zero_only.rank == 0:  # under DDP every process runs this script; one prints
        print("\n".join(console_summary(summary)))  # for a person; the JSON line for programs
        print(json.dumps(summary))
    return summary["metrics"][cfg.optimized_metric]  # the value a Hydra sweeper optimises


if __name__ == "__main__":
    cli.run(main)
