"""The train/val/test split on one calendar for all instruments, with an embargo at each cut,
and the train-split normalization: one definition that both data paths (in memory,
`foxhunt.data.datamodule`, and the disk-backed store, `foxhunt.data.store`) and predict use, so
that they give the same numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from foxhunt_serve import SCALE_INPUT, as_float32, check_normalized, scale_static

from foxhunt.config import parse_time

SPLITS = ("train", "val", "test")


NO_CUT = np.iinfo(np.int64).max  # a period that never starts (data.test_fraction=0)
NO_START = np.iinfo(np.int64).min  # no bound before the data


@dataclass(frozen=True)
class Cuts:
    """One set of cut times (int64 ns) for every instrument: training targets before
    `train_end`, validation targets from `val_start` to before `val_end`, test targets from
    `test_start` on. `train_end` and `val_end` lie `embargo` bars of the common timeline before
    the next period's start: an embargo no target falls in. On a shared calendar no instrument's
    training target lies in another's test period (per-instrument fractions put overlapping
    contracts' test bars in each other's training)."""

    val_start: int
    test_start: int
    embargo: int
    train_end: int
    val_end: int
    train_start: int = NO_START  # a walk-forward fold's: the first training target
    test_end: int = NO_CUT  # and the end of its test period

    def to_dict(self) -> dict[str, Any]:
        return {
            "val_start": iso_time(self.val_start),
            "test_start": iso_time(self.test_start),
            "embargo": self.embargo,
            "train_end": iso_time(self.train_end),
            "val_end": iso_time(self.val_end),
            "train_start": iso_time(self.train_start),
            "test_end": iso_time(self.test_end),
        }


def iso_time(ns: int) -> str | None:
    """int64 nanoseconds as an ISO date-time in UTC (None for NO_CUT and NO_START)."""
    if ns in (NO_CUT, NO_START):
        return None
    unit = "s" if ns % 10**9 == 0 else "ns"
    return f"{np.datetime_as_string(np.datetime64(int(ns), 'ns'), unit=unit)}Z"


def calendar_cuts(timeline: np.ndarray, cfg: Any) -> Cuts:
    """The cuts of `cfg` (the data config) on `timeline`, every distinct time of every
    instrument (sorted): data.split.val_start / test_start where given, else the times that
    leave data.val_fraction / data.test_fraction of the timeline to each later split."""
    n = len(timeline)
    n_test = int(round(n * cfg.test_fraction))
    n_val = int(round(n * cfg.val_fraction))
    test = parse_time("data.split.test_start", cfg.split.test_start)
    if test is None:
        test = int(timeline[n - n_test]) if n_test else NO_CUT
    val = parse_time("data.split.val_start", cfg.split.val_start)
    if val is None:
        before_test = int(np.searchsorted(timeline, test))  # the timeline's rows before test
        val = int(timeline[before_test - n_val]) if n_val and before_test > n_val else test
    embargo = cfg.prediction_length if cfg.split.embargo is None else cfg.split.embargo

    def embargo_start(cut: int) -> int:  # `embargo` distinct times before the cut
        if cut == NO_CUT or embargo == 0:
            return cut
        return int(timeline[max(int(np.searchsorted(timeline, cut)) - embargo, 0)])

    first = parse_time("data.split.train_start", cfg.split.train_start)
    end = parse_time("data.split.test_end", cfg.split.test_end)
    return Cuts(
        val,
        test,
        embargo,
        embargo_start(val),
        embargo_start(test),
        NO_START if first is None else first,
        NO_CUT if end is None else end,
    )


def split_starts(
    time_ns: np.ndarray, cuts: Cuts, encoder_length: int, prediction_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, slice]:
    """Window starts (rows of one instrument) of each split, and its rows of the training
    period, from train_start to val_start (whose statistics normalize the data).

    A window belongs to the split whose period holds all of its targets (decoder rows), the
    embargo before each cut excepted; val/test encoders may reach back into earlier periods
    (that is the past, not leakage)."""
    E, H = encoder_length, prediction_length
    times = [cuts.train_start, cuts.train_end, cuts.val_start, cuts.val_end, cuts.test_start]
    first, train_end, val, val_end, test = (int(i) for i in np.searchsorted(time_ns, times))
    end = int(np.searchsorted(time_ns, cuts.test_end))

    def starts(first_target: int, end: int) -> np.ndarray:
        return np.arange(max(first_target - E, 0), end - E - H + 1, dtype=np.int64)

    return (
        starts(first, train_end),
        starts(val, val_end),
        starts(test, end),
        slice(first, val),
    )


def split_record(
    cuts: Cuts, series: list[Any], splits: list[tuple], encoder_length: int, prediction_length: int
) -> dict[str, Any]:
    """What summary.json records of the splits: the cuts, and per instrument the first and last
    target time of each split (None: no window there)."""
    return {
        "cuts": cuts.to_dict(),
        "instruments": {
            s.name: {
                split: target_span(s.time_ns, starts, encoder_length, prediction_length)
                for split, starts in zip(SPLITS, sp[:3], strict=True)
            }
            for s, sp in zip(series, splits, strict=True)
        },
    }


def target_span(
    time_ns: np.ndarray, starts: np.ndarray, encoder_length: int, prediction_length: int
) -> list[str | None] | None:
    """[first, last] target time (ISO) of one instrument's windows in a split; None if none."""
    if len(starts) == 0:
        return None
    first = time_ns[starts.min() + encoder_length]
    return [
        iso_time(first),
        iso_time(time_ns[starts.max() + encoder_length + prediction_length - 1]),
    ]


def _floored(std: np.ndarray) -> np.ndarray:
    return np.where(std > 1e-12, std, 1.0)


def mean_std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and population std (1 where the column is constant) of a [rows, cols]."""
    if x.size == 0:
        return np.zeros(x.shape[1]), np.ones(x.shape[1])
    return x.mean(axis=0), _floored(x.std(axis=0))


def vocabulary_index(schema: dict[str, Any], names: list[str | None]) -> np.ndarray:
    """[len(names)] int64: each name's index in the schema's vocabulary (`groups`), the index
    past it for a name outside it; 0 for one unnamed series."""
    vocab = {g: i for i, g in enumerate(schema["groups"])}
    return np.array([vocab.get(n, len(vocab)) if vocab else 0 for n in names], np.int64)


def embedding_rows(schema: dict[str, Any], names: list[str | None]) -> np.ndarray:
    """[len(names)] int64: each name's row of the instrument embedding, its index in the
    vocabulary; the row past it (the unseen name's) for a name outside the vocabulary or
    without a training window (`untrained`); 0 for one unnamed series."""
    rows = vocabulary_index(schema, names)
    rows[np.isin(np.asarray(names, object), schema.get("untrained", []))] = len(schema["groups"])
    return rows


def normalized_statics(
    schema: dict[str, Any], names: list[str | None], statics: list[np.ndarray]
) -> np.ndarray:
    """The normalized static reals [len(names), static inputs] of the series `names` (the
    target scale's input last with data.target_scale=instrument: a name the model was not
    trained on has the pooled scale)."""
    columns = list(schema["static"])
    mean, std = schema["static_mean"], schema["static_std"]
    if schema.get("target_scales"):  # the target scale's input: its log, relative to the pooled
        target = {"means": schema["target_centres"], "stds": schema["target_scales"]}
        target |= {"mean": schema["input_mean"][0], "std": schema["input_std"][0]}
        scale = scale_static(target, schema["groups"], [str(n) for n in names])
        statics = [np.append(st, sc) for st, sc in zip(statics, scale, strict=True)]
        columns.append(SCALE_INPUT)
    static = np.zeros((len(names), len(columns)))
    for i, st in enumerate(statics):
        static[i] = (st - mean) / np.asarray(std)
    check_normalized(as_float32(static), columns, mean, std, lambda i: names[i])
    return static


class Moments:
    """Per-column count, mean and sum of squared deviations, merged block by block (Chan, Golub
    and LeVeque's parallel update, float64): the statistics of all rows without holding them.
    With each column's least and greatest value: which are constant, exactly."""

    def __init__(self, columns: int) -> None:
        self.count = 0
        self.mean = np.zeros(columns)
        self.m2 = np.zeros(columns)
        self.low = np.full(columns, np.inf)
        self.high = np.full(columns, -np.inf)

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
        self.low = np.minimum(self.low, x.min(axis=0))
        self.high = np.maximum(self.high, x.max(axis=0))

    def constant(self) -> np.ndarray:
        """Per column: every row added so far has the same value (False with no rows)."""
        return self.low == self.high

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        if self.count == 0:
            return np.zeros_like(self.mean), np.ones_like(self.mean)
        return self.mean.copy(), _floored(np.sqrt(self.m2 / self.count))
