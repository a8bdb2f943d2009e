"""What the target's training rows say of it, read once where the data module first sees them
(`foxhunt.data.windows.split_windows`), before any training.

A level (a price) is forecast as its move from its last value (anchored); a return is not. A
column of returns taken as a level trains to the end with a negative skill, so:

- an instrument's target is *return-like* over its training rows (at least MIN_ROWS of them)
  when it has no unit root (lag-1 autocorrelation under MAX_AUTOCORR; a price's is near 1) and
  is centred near zero (its mean within one std of zero; a price sits many stds from zero);
- the column is return-like when most instruments' are (at least half of those with the rows to
  judge), and *clearly* so when at least CLEAR_SHARE of them are and its values are far below a
  price's (the instruments' median |value| under SMALL: a return is a fraction, a price its
  level);
- data.target_kind=auto takes a clearly return-like column as returns, and keeps any other as a
  level, with a warning naming data.target_kind=return when it is return-like but not clearly;
  data.target_kind=level with a return-like column warns the same. A derived target
  (data.features=ohlcv's log_return) and data.target_kind=return are returns, not judged.

An instrument whose target is constant over its training rows has no scale of its own
(`foxhunt_serve.scaling` gives it a floor or the pooled one) and nothing to learn: a warning
names it, whatever the kind."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)
MIN_ROWS = 20  # training rows below which an instrument is not judged
MAX_AUTOCORR = 0.5  # lag-1 autocorrelation under which a series has no unit root
CLEAR_SHARE = 0.8  # share of the judged instruments return-like for auto to pick return
SMALL = 1.0  # median |value| under which values are far below a price's
SHOWN = 5  # instruments named in a warning


@dataclass(frozen=True)
class Evidence:
    """One instrument's training targets, as `evidence` finds them."""

    name: str
    rows: int
    autocorr: float  # lag-1, about their mean (nan: constant or fewer than two rows)
    mean: float
    std: float
    median_abs: float
    constant: bool  # at least two rows, every one the same value

    @property
    def judged(self) -> bool:
        return self.rows >= MIN_ROWS and not self.constant

    @property
    def return_like(self) -> bool:
        return self.judged and self.autocorr < MAX_AUTOCORR and abs(self.mean) < self.std


def evidence(name: str, target: np.ndarray) -> Evidence:
    """What instrument `name`'s training targets show: persistence, centre, size, constancy."""
    y = np.asarray(target, np.float64)
    if not len(y):
        return Evidence(name, 0, float("nan"), 0.0, 0.0, 0.0, False)
    d = y - y.mean()
    power = float((d * d).sum())
    autocorr = float((d[1:] * d[:-1]).sum()) / power if power > 0 else float("nan")
    constant = len(y) > 1 and bool((y == y[0]).all())
    mean, std, median_abs = float(y.mean()), float(y.std()), float(np.median(np.abs(y)))
    return Evidence(name, len(y), autocorr, mean, std, median_abs, constant)


def target_kind(
    configured: str, kind: str, target: str, found: list[Evidence]
) -> tuple[str, list[str]]:
    """The target's kind (`kind`: the config's reading of data.target_kind `configured`, where
    auto is a level unless the target is derived) decided from each instrument's evidence, and
    the warnings to give before training (module docstring)."""
    warnings = _constant(target, found)
    judged = [e for e in found if e.judged]
    like = [e for e in judged if e.return_like]
    if kind == "return" or not judged or 2 * len(like) < len(judged):
        return kind, warnings
    median_abs = float(np.median([e.median_abs for e in judged]))
    shown = (
        f"target '{target}' looks like returns over the training rows of {len(like)} of "
        f"{len(judged)} instruments (median lag-1 autocorrelation "
        f"{np.median([e.autocorr for e in judged]):.2f}, mean "
        f"{np.median([e.mean for e in judged]):.3g}, median |value| {median_abs:.3g})"
    )
    clear = len(like) >= CLEAR_SHARE * len(judged) and median_abs < SMALL
    if configured == "auto" and clear:
        log.info("data: %s: forecast as returns (data.target_kind=auto)", shown)
        return "return", warnings
    if configured == "auto":
        why = "but not clearly, so it is taken as a level and anchored on its last value"
    else:
        why = "but data.target_kind=level anchors it on its last value as a price"
    return kind, [f"{shown}, {why}: set data.target_kind=return if it holds returns", *warnings]


def _constant(target: str, found: list[Evidence]) -> list[str]:
    """One warning naming the instruments whose target is constant over the training rows."""
    flat = [e for e in found if e.constant]
    if not flat:
        return []
    names = ", ".join(f"{e.name} ({e.mean:g})" for e in flat[:SHOWN])
    more = f" and {len(flat) - SHOWN} more" if len(flat) > SHOWN else ""
    return [
        f"target '{target}' is constant over the training rows of {names}{more}: it has no "
        "scale of its own (a floor or the pooled scale stands in) and the model learns nothing "
        "of it; fix its rows or leave it out of the data"
    ]
