"""The chronological train/val/test split of each instrument and the train-split normalization:
one definition that both data paths (in memory, `foxhunt.data.datamodule`, and the disk-backed
store, `foxhunt.data.store`) and predict use, so that they give the same numbers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from foxhunt.errors import DataError

SPLITS = ("train", "val", "test")


def split_starts(n: int, cfg: Any, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Window starts (relative to the series) of each split, and the number of train rows.

    A window's decoder rows lie wholly inside one split; val/test encoders may reach back into
    earlier splits (that is the past, not leakage)."""
    E, H = cfg.encoder_length, cfg.prediction_length
    n_test = int(round(n * cfg.test_fraction))
    n_val = int(round(n * cfg.val_fraction))
    n_train = n - n_val - n_test
    if n_train < E + H:
        raise DataError(
            f"instrument {name} is too short: {n} usable rows leave {n_train} for training, "
            f"one window needs encoder_length + prediction_length = {E + H}"
        )

    def starts(first_decoder: int, end: int) -> np.ndarray:
        return np.arange(max(first_decoder - E, 0), end - E - H + 1, dtype=np.int64)

    return (
        starts(0, n_train),
        starts(n_train, n_train + n_val),
        starts(n_train + n_val, n),
        n_train,
    )


def _floored(std: np.ndarray) -> np.ndarray:
    return np.where(std > 1e-12, std, 1.0)


def mean_std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and population std (1 where the column is constant) of a [rows, cols]."""
    if x.size == 0:
        return np.zeros(x.shape[1]), np.ones(x.shape[1])
    return x.mean(axis=0), _floored(x.std(axis=0))


def normalized_statics(
    schema: dict[str, Any], names: list[str], statics: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Each series' index in the schema's instrument vocabulary (0 for one unnamed series), and
    the normalized static reals by that index [max(groups, 1), static]. Indexing the schema's
    vocabulary keeps a subset of a checkpoint's instruments embedding right."""
    vocab = {g: i for i, g in enumerate(schema["groups"])}
    group_of_series = np.array([vocab.get(n, 0) for n in names], np.int64)
    static = np.zeros((max(len(schema["groups"]), 1), len(schema["static"])))
    mean, std = schema["static_mean"], schema["static_std"]
    for g, st in zip(group_of_series, statics, strict=True):
        static[g] = (st - mean) / np.asarray(std)
    groups = schema["groups"] or [None]
    check_normalized(as_float32(static), schema["static"], mean, std, lambda g: groups[g])
    return group_of_series, static


def as_float32(x: np.ndarray) -> np.ndarray:
    """`x` in float32, where a value beyond its range becomes inf (`check_normalized` names it)."""
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def check_normalized(
    normalized: np.ndarray,
    columns: list[str],
    mean: list[float],
    std: list[float],
    instrument_of: Callable[[int], str | None],
) -> None:
    """A DataError naming the column (and the instrument of `instrument_of(row)`) where the
    normalization statistics are not finite or the float32 normalized values [rows, columns]
    overflowed to inf: checked once when the data is set up, so that no batch carries one.
    (NaN is not looked for: the rows read are finite, and predict's rows after the data are
    NaN where nothing reads them.)"""
    for c, m, s in zip(columns, mean, std, strict=True):
        if not (np.isfinite(m) and np.isfinite(s)):
            raise DataError(
                f"the normalization statistics of column '{c}' are not finite (mean {m:.3g}, "
                f"std {s:.3g}): their values must fit in float32"
            )
    overflow = np.isinf(normalized)
    if not overflow.any():
        return
    row, col = (int(i) for i in np.argwhere(overflow)[0])
    instrument = instrument_of(row)
    raise DataError(
        f"column '{columns[col]}'{f' of instrument {instrument}' if instrument else ''} is "
        f"beyond float32's range after normalization with mean {mean[col]:.3g} and std "
        f"{std[col]:.3g}: a value far outside the range of the training rows"
    )


class Moments:
    """Per-column count, mean and sum of squared deviations, merged block by block (Chan, Golub
    and LeVeque's parallel update, float64): the statistics of all rows without holding them."""

    def __init__(self, columns: int) -> None:
        self.count = 0
        self.mean = np.zeros(columns)
        self.m2 = np.zeros(columns)

    def add(self, x: np.ndarray) -> None:
        n = len(x)
        if n == 0:
            return
        mean = x.mean(axis=0)
        m2 = ((x - mean) ** 2).sum(axis=0)
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        if self.count == 0:
            return np.zeros_like(self.mean), np.ones_like(self.mean)
        return self.mean.copy(), _floored(np.sqrt(self.m2 / self.count))
