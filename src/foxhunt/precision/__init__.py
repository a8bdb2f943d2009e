"""The training precision (`precision=fp32|bf16|int8`) as one object, chosen once from its config
group or a checkpoint's hyperparameters: its Trainer flag, callbacks, model transform, export
and device check. The precision named N is `foxhunt.precision.N.PRECISION`, configured by
foxhunt/conf/precision/N.yaml; which one a config means follows from what it sets (`name_of`),
not from a label beside it."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from foxhunt.errors import CheckpointError
from foxhunt.precision.base import BestModel, Precision

__all__ = ["BestModel", "Precision", "name_of", "precision_of"]

FLOAT_FLAGS = {"32-true": "fp32", "bf16-mixed": "bf16"}  # Lightning's flag: the precision


def name_of(settings: Mapping[str, Any]) -> str:
    """fp32, bf16 or int8: int8 with quantization-aware training (`qat`), else the Trainer's
    float precision; a checkpoint of foxhunt 0.1 (or a caller's dict) names it itself."""
    if "name" in settings:
        return str(settings["name"])
    if settings.get("qat"):
        return "int8"
    flag = str(settings.get("trainer_precision", "32-true"))
    if flag not in FLOAT_FLAGS:
        raise CheckpointError(f"unknown precision: trainer_precision={flag!r}")
    return FLOAT_FLAGS[flag]


def precision_of(source: Mapping[str, Any] | DictConfig | None) -> Precision:
    """The precision of a config group (`cfg.precision`), of a whole config or a checkpoint's
    hyperparameters (their `precision`), or of none (checkpoints made before precisions: fp32)."""
    if source is not None and not {"name", "trainer_precision", "qat"} & set(source):
        source = source.get("precision")
    if isinstance(source, DictConfig):
        source = OmegaConf.to_container(source, resolve=True, enum_to_str=True)
    settings = dict(source or {})
    name = name_of(settings)
    module = f"{__name__}.{name}"
    try:
        precision = getattr(importlib.import_module(module), "PRECISION", None)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise  # a module the precision needs
        precision = None
    if precision is None:
        raise CheckpointError(f"unknown precision {name!r}: no {module}.PRECISION")
    return precision(settings)
