"""Train a Temporal Fusion Transformer: `python scripts/train.py model=tft_small ...`."""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.app.report import console_summary
from foxhunt.app.train import train
from foxhunt.run import resume
from foxhunt.run.dir import RunDir


@cli.main("train")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # +sweep.resume=true: a job that finished is not re-run
    summary = None
    if cfg.get("sweep", {}).get("resume"):
        summary = resume.finished(RunDir(run_dir), "sweep.resume: job")
    if summary is None:
        summary = train(cfg, run_dir, overrides=list(hydra_cfg.overrides.task))
    if rank_zero_only.rank == 0:  # under DDP every process runs this script; one prints
        print("\n".join(console_summary(summary)))  # for a person; the JSON line for programs
        print(json.dumps(summary))
    return summary["metrics"][cfg.optimized_metric]  # the value a Hydra sweeper optimises


if __name__ == "__main__":
    cli.run(main)
