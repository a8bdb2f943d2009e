"""Walk-forward backtest: `python scripts/backtest.py backtest.folds=5 [train.py's overrides]`."""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt.app import backtest, cli
from foxhunt.app.report import console_summary


@cli.main("backtest")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    summary = backtest.run(cfg, run_dir, overrides=list(hydra_cfg.overrides.task))
    if cfg.backtest.fold is None:  # the whole backtest: its pooled figures, for a person
        print("\n".join(console_summary(summary, run_dir / backtest.REPORT)))
    print(json.dumps(summary))
    # val_loss: the mean over the folds (one fold's with backtest.fold), for a sweeper
    return summary["metrics"][cfg.optimized_metric]


if __name__ == "__main__":
    cli.run(main, resume=backtest.resume_argv)
