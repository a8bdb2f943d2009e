"""Synthetic panels of any size for the benchmarks: a simple target and noise features.

Not market data (that is `foxhunt.data.samples.es`, the simulated ES futures bars): the values only
need a known scale, so that a model that standardizes and one that does not see the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ar1(rng: np.random.Generator, length: int, phi: float = 0.9) -> np.ndarray:
    """`length` steps of a unit-variance AR(1) with coefficient `phi` < 1, or of a random walk
    with unit steps for `phi` = 1; the first value is a standard normal draw (float64)."""
    if not 0 <= phi <= 1:
        raise ValueError(f"phi must be in [0, 1], got {phi}")
    x = rng.normal(scale=np.sqrt(1 - phi**2) if phi < 1 else 1.0, size=length)  # the shocks
    x[0] = rng.normal()
    if phi == 1:
        return np.cumsum(x)
    for t in range(1, length):
        x[t] += phi * x[t - 1]
    return x


def synthetic_panel(
    series: Sequence[str],
    length: int,
    num_features: int,
    *,
    phi: float = 0.9,
    seed: int | Sequence[int] = 0,
    dtype: type = np.float32,
) -> dict[str, np.ndarray]:
    """Columns `time` (int64 steps 0 .. length-1 of each series), `series` (the names given),
    `target` (an `ar1` with `phi`) and `f0` .. `f{num_features-1}` (unit-variance noise), in
    `dtype`: the series one after another, the same `seed` giving the same values."""
    rng = np.random.default_rng(seed)
    features = [f"f{i}" for i in range(num_features)]
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("time", "series", "target", *features)}
    for name in series:
        cols["time"].append(np.arange(length, dtype=np.int64))
        cols["series"].append(np.full(length, name))
        cols["target"].append(ar1(rng, length, phi).astype(dtype))
        block = rng.normal(size=(length, num_features)).astype(dtype)
        for i, feature in enumerate(features):
            cols[feature].append(block[:, i])
    return {k: np.concatenate(v) for k, v in cols.items()}
