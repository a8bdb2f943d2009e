"""Each date's cross-section of a panel (`foxhunt_serve.cross_section`, which the ONNX
consumer shares): data.cross_section=rank|zscore adds every observed input's rank or z-score
among the names at its time beside it; data.target_transform=xs_demean makes the target
market-neutral, xs_rank its rank; auto (the default) is xs_demean on a panel of at least
PANEL_NAMES names with a return target, else none. Both need every name's rows at once: the
in-memory path (`foxhunt.checks`, `foxhunt.data.store.wants_lazy`)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
from foxhunt_serve import name_of, panel

from foxhunt.errors import DataError

log = logging.getLogger(__name__)

# names a panel needs for data.target_transform=auto to take out their mean: the cross-sectional
# book's default eval.book_min_names, below which a date's mean is mostly one name's own move
PANEL_NAMES = 10


def resolve(transform: str, target_kind: str, names: int) -> str:
    """data.target_transform as it applies to data of `names` instruments."""
    if transform != "auto":
        return transform
    return "xs_demean" if target_kind == "return" and names >= PANEL_NAMES else "none"


def apply(loaded: Any, cfg: Any) -> Any:
    """`loaded` (a `foxhunt.data.read.Loaded`, every series in memory) with data.cross_section's
    inputs added and data.target_transform applied (its resolved value in `target_transform`);
    as it is when both are none."""
    series = list(loaded.series)
    how = str(getattr(cfg, "cross_section", "none"))
    asked = str(getattr(cfg, "target_transform", "none"))
    transform = resolve(asked, loaded.target_kind, len(series))
    if transform != "none" and loaded.target_kind == "level":
        raise DataError(
            f"data.target_transform={transform} compares returns across names, but the target "
            f"'{loaded.target}' is a level: use a return target or data.target_transform=none"
        )
    if how == "none" and transform == "none":
        return replace(loaded, series=series, target_transform="none")
    if len(series) < PANEL_NAMES:  # a model trained so, given a few names (predict)
        log.warning(
            "data: %s across %d name(s) only: the model compares each name with the others at "
            "each time, so give it the panel it was trained on",
            " and ".join(
                f"data.{k}={v}"
                for k, v in (("cross_section", how), ("target_transform", transform))
                if v != "none"
            ),
            len(series),
        )
    targets, added = panel(
        [s.time_ns for s in series],
        [s.target for s in series],
        [s.observed for s in series],
        how,
        transform,
    )
    out = [
        replace(s, observed=np.concatenate([s.observed, a], axis=1), target=t)
        for s, t, a in zip(series, targets, added, strict=True)
    ]
    observed = list(loaded.observed)
    if how != "none":
        observed += [name_of(c, how) for c in loaded.observed]
    return replace(loaded, observed=observed, series=out, target_transform=transform)
