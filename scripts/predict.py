"""Forecast with a trained TFT: `python scripts/predict.py ckpt_path=/abs/best.ckpt data.path=x`.

Loads a checkpoint (float32) or an export (model_fp32/model_int8.safetensors), checks the
data against the checkpoint's schema, forecasts the latest window of each instrument (every
window with `predict.all_windows=true`) and writes predictions.parquet into the run directory
(outputs/predict/<date>/<time>/) or `predict.out=`; prints a preview and where it wrote.
The data config is the checkpoint's training run's, with `data.*` overrides on top.
"""

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.app.predict_cli import predict_command


@cli.main("predict")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    predict_command(cfg, run_dir, list(hydra_cfg.overrides.task))


if __name__ == "__main__":
    cli.run(main)
