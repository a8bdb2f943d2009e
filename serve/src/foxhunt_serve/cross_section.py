"""Each date's cross-section of a panel, the way qlib's CSRankNorm and CSZScoreNorm processors
normalise one: a value against the other names' values at the same time. foxhunt computes a
model's cross-sectional inputs and target with this module in training and predict, and the
consumer here, so the three agree (model.json's data section: `cross_section`,
`target_transform`).

- inputs `rank`: every observed input's rank among the names with a row at that time, scaled to
  unit variance ((rank share - 1/2) * sqrt 12, qlib's); `zscore`: its z-score there. A name
  alone at its time, or one among equal values, gets 0. Named `<input>_xs_<how>`.
- target `xs_demean`: the target less the mean of the names' targets at its time (a
  market-neutral return, in each name's units); `xs_rank`: its rank there, scaled as above.

Written with numpy (a sort and bincounts over the dates): pandas' group ranks would do it, but
neither foxhunt's data path nor this package takes pandas."""

from __future__ import annotations

import math

import numpy as np


def name_of(feature: str, how: str) -> str:
    """The cross-sectional input of `feature` (data.cross_section=`how`)."""
    return f"{feature}_xs_{how}"


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
        ranked = np.empty_like(values, dtype=np.float64)
        ranked[order] = mean_position[run]
        return np.where(n > 1, ((ranked + 0.5) / n - 0.5) * math.sqrt(12), 0.0)
    mean = (np.bincount(at, values) / count)[at]
    if how == "demean":
        return values - mean
    var = (np.bincount(at, values**2) / count)[at] - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    spread = std > 1e-12 * np.maximum(np.abs(mean), 1.0)
    return np.where(spread, (values - mean) / np.where(spread, std, 1.0), 0.0)


def panel(
    times: list[np.ndarray],
    targets: list[np.ndarray],
    inputs: list[np.ndarray],
    how: str,
    transform: str,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each series' (its `times`, `targets`, observed `inputs` [rows, k]) target after
    `transform` (none, xs_demean, xs_rank) and its inputs' cross-sectional values [rows, k]
    (`how`: none, rank, zscore; [rows, 0] for none), across every series at each time."""
    at = np.unique(np.concatenate(times), return_inverse=True)[1].ravel()
    bounds = np.cumsum([0, *(len(t) for t in times)])
    target = np.concatenate(targets).astype(np.float64)
    if transform != "none":
        target = by_date(target, at, transform.removeprefix("xs_"))
    stacked = np.concatenate(inputs).astype(np.float64)
    added = stacked[:, :0]
    if how != "none" and stacked.shape[1]:
        added = np.column_stack([by_date(stacked[:, j], at, how) for j in range(stacked.shape[1])])
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return [target[p] for p in parts], [added[p] for p in parts]
