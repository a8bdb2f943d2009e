"""Each date's cross-section of a panel, the way qlib's CSRankNorm and CSZScoreNorm processors
normalise one: a value against the other names' values at the same time.

- `data.cross_section=rank|zscore`: beside every observed input, its rank among the names
  trading at that time, scaled to unit variance ((rank share - 1/2) * sqrt 12, qlib's), or its
  z-score there; a name alone at its time, or one among equal values, gets 0 for it.
- `data.target_transform=xs_demean`: the target less the mean of the names' targets at its time
  (a market-neutral return, in each name's units); `xs_rank`: the target's rank there, scaled
  as above (a forecast is then of a rank, without units).

Both need every name's rows at once: the in-memory path (data.lazy=false), checked in
`foxhunt.checks`. Written here with numpy (a sort and bincounts over the dates): pandas' group
ranks would do it, but pandas stays out of the data path."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from foxhunt.errors import DataError

TRANSFORMS = ("none", "xs_demean", "xs_rank")


def by_date(values: np.ndarray, at: np.ndarray, how: str) -> np.ndarray:
    """`values` [n] against the others at the same date `at` [n] (dense date indices): "rank"
    (average ranks of ties, so equal values get equal ranks), "zscore" or "demean"."""
    count = np.bincount(at)
    n = count[at]
    if how == "rank":
        order = np.lexsort((values, at))
        v, a = values[order], at[order]
        new_run = np.r_[True, (v[1:] != v[:-1]) | (a[1:] != a[:-1])]
        run = np.cumsum(new_run) - 1
        first = np.r_[0, np.cumsum(count)[:-1]]  # each date's first position in the order
        position = np.arange(len(v)) - first[a]
        mean_position = np.bincount(run, position) / np.bincount(run)
        ranked = np.empty_like(values)
        ranked[order] = mean_position[run]
        return np.where(n > 1, ((ranked + 0.5) / n - 0.5) * math.sqrt(12), 0.0)
    mean = (np.bincount(at, values) / count)[at]
    if how == "demean":
        return values - mean
    var = (np.bincount(at, values**2) / count)[at] - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    spread = std > 1e-12 * np.maximum(np.abs(mean), 1.0)
    return np.where(spread, (values - mean) / np.where(spread, std, 1.0), 0.0)


def apply(loaded: Any, cfg: Any) -> Any:
    """`loaded` (a `foxhunt.data.read.Loaded`, every series in memory) with
    data.cross_section's inputs added and data.target_transform applied (see the module); as
    it is when both are none."""
    how = str(getattr(cfg, "cross_section", "none"))
    transform = str(getattr(cfg, "target_transform", "none"))
    if how == "none" and transform == "none":
        return loaded
    series = list(loaded.series)
    if transform != "none" and loaded.target_kind == "level":
        raise DataError(
            f"data.target_transform={transform} compares returns across names, but the target "
            f"'{loaded.target}' is a level: use a return target or data.target_transform=none"
        )
    times = np.concatenate([s.time_ns for s in series])
    at = np.unique(times, return_inverse=True)[1].ravel()
    bounds = np.cumsum([0, *(len(s.time_ns) for s in series)])
    observed = list(loaded.observed)
    columns: list[np.ndarray] = []
    if how != "none":
        stacked = np.concatenate([s.observed for s in series])
        columns = [by_date(stacked[:, j], at, how) for j in range(stacked.shape[1])]
        observed += [f"{name}_xs_{how}" for name in loaded.observed]
    target = np.concatenate([s.target for s in series])
    if transform != "none":
        target = by_date(target, at, transform.removeprefix("xs_"))
    out = []
    for i, s in enumerate(series):
        rows = slice(bounds[i], bounds[i + 1])
        added = np.column_stack([c[rows] for c in columns]) if columns else s.observed[:, :0]
        out.append(
            replace(s, observed=np.concatenate([s.observed, added], axis=1), target=target[rows])
        )
    return replace(loaded, observed=observed, series=out)
