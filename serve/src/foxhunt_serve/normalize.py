"""The inputs as the model takes them: float32((value - mean) / std), computed in float64, each
column with the training split's statistics, the target with its instrument's centre and scale
(`foxhunt_serve.scaling`). foxhunt's training and predict and the consumer all normalize here,
so that every path gives the same numbers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from foxhunt_serve.errors import DataError


def normalize_rows(
    rows: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    columns: list[str],
    target: tuple[np.ndarray, np.ndarray] | None = None,
    instrument_of: Callable[[int], str | None] = lambda row: None,
) -> np.ndarray:
    """Float64 `rows` [n, columns] normalized in place (no second float64 copy of a large
    table), each column by its `mean` and `std`, the target (column 0) by each row's centre
    and scale in `target` when given, then as float32; a DataError naming the column (and
    the instrument of `instrument_of(row)`) where a value leaves float32's range."""
    own = None if target is None else (rows[:, 0] - target[0]) / target[1]
    rows -= np.asarray(mean)
    rows /= np.asarray(std)
    if own is not None:
        rows[:, 0] = own
    normalized = as_float32(rows)
    check_normalized(normalized, columns, mean, std, instrument_of)
    return normalized


def as_float32(x: np.ndarray) -> np.ndarray:
    """`x` in float32, where a value beyond its range becomes inf (`check_normalized` names it)."""
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def check_normalized(
    normalized: np.ndarray,
    columns: list[str],
    mean: Sequence[float],
    std: Sequence[float],
    instrument_of: Callable[[int], str | None],
) -> None:
    """An DataError naming the column (and the instrument of `instrument_of(row)`) where the
    normalization statistics are not finite or the float32 normalized values [rows, columns]
    overflowed to inf: checked once, so that no batch carries one. (NaN is not looked for: the
    rows read are finite, and the rows after the data are NaN where nothing reads them.)"""
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
