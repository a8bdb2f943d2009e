"""Each date's cross-section of a panel (`foxhunt_serve.cross_section`, which the ONNX
consumer shares): data.cross_section=rank|zscore adds every observed input's rank or z-score
among the names at its time beside it; data.market_context=true adds the names' mean target,
its dispersion and breadth at each time (`CONTEXT`); data.target_transform=xs_demean makes the
target market-neutral, xs_rank its rank; auto (the default) is xs_demean on a panel (at least
PANEL_NAMES names, `foxhunt.config`'s: the book's threshold too) with a return target, else none.

One target, one rule:

- The transform is resolved once, from the config and the data's shape (the target's kind, the
  number of names), and stored in the schema that the checkpoint and model.json carry: predict,
  the backtest's folds and a resumed run take that copy and never resolve it again.
- The kind of a column named by data.target under data.target_kind=auto is what its training
  rows show (`foxhunt.data.target`), known only after the read: its transform waits for it
  (PENDING, then `settle` in `foxhunt.data.windows.split_windows`), so a column of returns gets
  the default a derived return (data.features=ohlcv's log_return) gets.
- Both need every name's rows at once: the in-memory path. Free memory never changes the
  target: data.lazy=auto reads a panel whose transform is not none in memory, or refuses in one
  line where the memory free cannot hold it; the lazy path (data.lazy=true) refuses such a
  transform in one line (`refuse_streamed`, `foxhunt.data.store.wants_lazy`), before reading
  where the kind is known, else once the training rows have shown it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
from foxhunt_serve import CONTEXT, name_of, panel

from foxhunt.config import PANEL_NAMES
from foxhunt.data.columns import resolve_target_kind
from foxhunt.errors import ConfigError

log = logging.getLogger(__name__)

# Loaded.target_transform read before the target's kind is judged: the training rows decide
PENDING = "auto"
SAID = {"xs_demean": "less the names' mean", "xs_rank": "the names' rank"}  # at each time


def resolve(transform: str, target_kind: str, names: int) -> str:
    """data.target_transform as it applies to data of `names` instruments."""
    if transform != "auto":
        return transform
    return "xs_demean" if target_kind == "return" and names >= PANEL_NAMES else "none"


def _judged_later(cfg: Any, target_kind: str) -> bool:
    """Whether the target's kind, read as `target_kind`, waits for its training rows: a column
    named by data.target under data.target_kind=auto (`foxhunt.data.target`)."""
    return target_kind == "level" and str(getattr(cfg, "target_kind", "level")) == "auto"


def _resolved(cfg: Any, target_kind: str, names: int) -> str:
    """data.target_transform on `names` names of a target read as `target_kind`: PENDING where
    it would apply to returns and the training rows are yet to say whether they are."""
    asked = str(getattr(cfg, "target_transform", "none"))
    if _judged_later(cfg, target_kind) and resolve(asked, "return", names) != "none":
        return PENDING
    return resolve(asked, target_kind, names)


def ahead(cfg: Any, names: int) -> str:
    """data.target_transform as it will apply to the configured data of `names` instruments,
    before it is read (`foxhunt.data.store.wants_lazy`): resolved, or PENDING."""
    return _resolved(cfg, resolve_target_kind(cfg), names)


def _check_level(transform: str, loaded: Any) -> None:
    if transform not in ("none", PENDING) and loaded.target_kind == "level":
        raise ConfigError(
            f"data.target_transform={transform} compares returns across names, but the target "
            f"'{loaded.target}' is a level: use a return target or data.target_transform=none"
        )


def refuse_streamed(cfg: Any, target_kind: str, names: int) -> None:
    """A ConfigError where data.target_transform applies to a panel read one name at a time
    (the lazy path): taking out the names' mean needs every name's rows at once."""
    transform = resolve(str(getattr(cfg, "target_transform", "none")), target_kind, names)
    if transform != "none":
        lazy = str(cfg.lazy).lower()
        why = f"data.lazy={lazy} reads the panel one name at a time"
        if lazy == "auto":
            why += " (too little memory is free to hold it)"
        raise ConfigError(refusal(cfg, transform, names, why, "set data.lazy=false"))


def refusal(cfg: Any, transform: str, names: int, why: str, fix: str) -> str:
    """The one line refusing a read `why` says cannot hold every name's rows at once, where
    data.cross_section or data.target_transform (resolved: `transform`, on `names` names, 0:
    not counted) needs them; `fix`: the first way out. Empty where neither needs them."""
    how = str(getattr(cfg, "cross_section", "none"))
    said, off = [], []
    if how != "none":
        said.append(f"data.cross_section={how} adds each input's {how} among the names")
        off.append("data.cross_section=none")
    if getattr(cfg, "market_context", False):
        said.append("data.market_context=true adds the names' mean, dispersion and breadth")
        off.append("data.market_context=false")
    if transform in SAID:
        on = f"{transform} on {names} names" if names else transform
        asked = getattr(cfg, "target_transform", transform)
        said.append(f"data.target_transform={asked} trains on the target {SAID[transform]} ({on})")
        off.append("data.target_transform=none")
    if not said:
        return ""
    return (
        f"{' and '.join(said)} at each time, which needs every name's rows at once, but {why}: "
        f"{fix}, or set {' and '.join(off)} to stream it"
    )


def apply(loaded: Any, cfg: Any) -> Any:
    """`loaded` (a `foxhunt.data.read.Loaded`, every series in memory) with data.cross_section's
    inputs added and data.target_transform applied (its resolved value in `target_transform`,
    each series' raw target kept in `raw_target` for the outputs' `actual`); as it is when both
    are none."""
    series = list(loaded.series)
    how = str(getattr(cfg, "cross_section", "none"))
    context = bool(getattr(cfg, "market_context", False))
    asked = str(getattr(cfg, "target_transform", "none"))
    transform = _resolved(cfg, loaded.target_kind, len(series))  # PENDING: `settle` applies it
    _check_level(transform, loaded)
    if how == "none" and transform in ("none", PENDING) and not context:
        return replace(loaded, series=series, target_transform=transform)
    if len(series) < PANEL_NAMES:  # a model trained so, given a few names (predict)
        shown = asked if transform == PENDING else transform
        log.warning(
            "data: %s across %d name(s) only: the model compares each name with the others at "
            "each time, so give it the panel it was trained on",
            " and ".join(
                f"data.{k}={v}"
                for k, v in (
                    ("cross_section", how),
                    ("target_transform", shown),
                    ("market_context", "true" if context else "none"),
                )
                if v != "none"
            ),
            len(series),
        )
    targets, added = panel(
        [s.time_ns for s in series],
        [s.target for s in series],
        [s.observed for s in series],
        how,
        "none" if transform == PENDING else transform,
        context,
    )
    kept = transform != "none"
    out = [
        replace(
            s,
            observed=np.concatenate([s.observed, a], axis=1),
            target=t,
            raw_target=s.target if kept else None,
        )
        for s, t, a in zip(series, targets, added, strict=True)
    ]
    observed = list(loaded.observed)
    if how != "none":
        observed += [name_of(c, how) for c in loaded.observed]
    observed += list(CONTEXT) if context else []
    return replace(loaded, observed=observed, series=out, target_transform=transform)


def settle(loaded: Any, cfg: Any) -> Any:
    """`loaded` (every series in memory, its target's kind judged from the training rows) with a
    PENDING data.target_transform resolved on that kind and applied; as it is otherwise."""
    if loaded.target_transform != PENDING:
        return loaded
    series = list(loaded.series)
    transform = resolve(str(cfg.target_transform), loaded.target_kind, len(series))
    _check_level(transform, loaded)
    if transform != "none":
        targets, _ = panel(
            [s.time_ns for s in series],
            [s.target for s in series],
            [s.observed[:, :0] for s in series],
            "none",
            transform,
        )
        series = [
            replace(s, target=t, raw_target=s.target) for s, t in zip(series, targets, strict=True)
        ]
    return replace(loaded, series=series, target_transform=transform)
