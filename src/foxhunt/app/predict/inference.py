"""What running a trained model needs, for predict and interpret alike: the device to run it on
and the data config of the training run that wrote its checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from foxhunt.config import DataConfig
from foxhunt.errors import ConfigError
from foxhunt.run.dir import RunDir
from foxhunt.training.checkpoint_io import read_checkpoint

log = logging.getLogger(__name__)
# a model trained before data.calendar: UTC (the default) and every bar interval continued
BEFORE_CALENDAR = {"calendar": {"session": "continuous"}}


def run_device(name: str, key: str = "device") -> torch.device:
    """The device to run a model on: `auto` is cuda when one is present; `key` names the
    setting in the error. (The memory estimator's memory.device may plan for a CUDA device
    this machine lacks; running on one cannot.)"""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"{key} must be auto, cpu or cuda, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{key}={name} but no CUDA device is available")
    return torch.device(name)


def training_data_config(ckpt_path: Path, ckpt: Any = None) -> DictConfig | None:
    """The data config of the run that wrote the checkpoint: the one the checkpoint carries,
    else its run's (<run>/checkpoints/x.ckpt beside <run>/.hydra/config.yaml, where an export
    or a checkpoint of foxhunt 0.2 finds it), if either is there. `ckpt`: the checkpoint,
    already read (None: read here; a checkpoint's unpickling takes seconds)."""
    data = None
    if ckpt_path.suffix == ".ckpt":
        ckpt = read_checkpoint(ckpt_path)[1] if ckpt is None else ckpt
        data = ckpt.get("data_config") if isinstance(ckpt, dict) else None
        if data is not None:
            log.info("data: the config the checkpoint carries")
    if data is None:
        saved = RunDir.of_checkpoint(ckpt_path).config
        data = OmegaConf.load(saved).get("data") if saved.is_file() else None
        if data is not None:
            log.info("data: the training run's config (%s)", saved.parent)
    if not isinstance(data, (dict, DictConfig)):
        return None
    # onto today's defaults: a run made before a data key existed lacks it
    known = {k: v for k, v in data.items() if k in DataConfig.__dataclass_fields__}
    before = {} if "calendar" in known else BEFORE_CALENDAR
    return OmegaConf.merge(OmegaConf.structured(DataConfig), before, known)


def data_changes(data: DictConfig, overrides: list[str]) -> tuple[bool, dict[str, Any]]:
    """From the command line's overrides: whether a data option was chosen (`data=parquet`),
    and the data keys set (`data.path=...`), with their values in the composed `data`."""
    chosen, changes = False, OmegaConf.create({})
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.key_or_group
        if key == "data":
            chosen = True
        elif key.startswith("data."):
            OmegaConf.update(changes, key[5:], OmegaConf.select(data, key[5:]), force_add=True)
    return chosen, OmegaConf.to_container(changes)


def required_checkpoint(cfg: DictConfig) -> str:
    """The command's `ckpt_path`, which predict, interpret and export cannot run without."""
    if not cfg.ckpt_path:
        raise ConfigError("ckpt_path is required: ckpt_path=/abs/path/to/checkpoint.ckpt")
    return cfg.ckpt_path
