"""Serve a trained TFT outside Python: `python scripts/export.py ckpt_path=/abs/best.ckpt`.

Writes model.onnx (a dynamic batch, named inputs, one quantile output) and model.json (the
features in input order with their derivation and normalization, the instruments, window
lengths, quantiles) into the run directory (outputs/export/<date>/<time>/) or `export.out=`,
after checking ONNX Runtime against the PyTorch model; prints where, then one JSON line.
The data config is the checkpoint's training run's, with `data.*` overrides on top.
"""

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.app.export import export_command


@cli.main("export")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    export_command(cfg, run_dir, list(hydra_cfg.overrides.task))


if __name__ == "__main__":
    cli.run(main)
