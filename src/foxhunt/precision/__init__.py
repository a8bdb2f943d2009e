"""The training precision (`precision=fp32|bf16|int8`) as one object, chosen once from its config
group or a checkpoint's hyperparameters: its Trainer flag, callbacks, model transform, export
and device check. The precision named N is `foxhunt.precision.N.PRECISION`, configured by
conf/precision/N.yaml (and named in `foxhunt.config.PrecisionName`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from foxhunt.errors import CheckpointError
from foxhunt.precision.base import Precision

__all__ = ["Precision", "precision_of"]


def precision_of(source: Mapping[str, Any] | DictConfig | None) -> Precision:
    """The precision of a config group (`cfg.precision`), of a whole config or a checkpoint's
    hyperparameters (their `precision`), or of none (checkpoints made before precisions: fp32)."""
    if source is not None and "name" not in source:
        source = source.get("precision")
    if isinstance(source, DictConfig):
        source = OmegaConf.to_container(source, resolve=True, enum_to_str=True)
    settings = dict(source or {})
    name = str(settings.get("name", "fp32"))
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
