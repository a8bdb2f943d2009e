"""Interpret a trained TFT on its test split: `python scripts/interpret.py ckpt_path=/abs/x.ckpt`.

Writes interpretation.json (variable importance per selection network, attention by lag,
observed coverage of each quantile) and variable_importance.png, attention_by_lag.png and
forecast_fan.png into the run directory (outputs/interpret/<date>/<time>/) or `out_dir=`, and
prints the files as one JSON line. Data overrides are those of train.py (`data.path=...`).
"""

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.app.interpret import interpret_checkpoint


@cli.main("interpret")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(cfg.out_dir or hydra_cfg.runtime.output_dir)
    overridden = any(
        o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "data" for o in hydra_cfg.overrides.task
    )
    result = interpret_checkpoint(cfg, out_dir, data_overridden=overridden)
    files = ["interpretation.json", *result["plots"].values()]
    print(json.dumps({"out_dir": str(out_dir.resolve()), "files": files}))


if __name__ == "__main__":
    cli.run(main)
