"""Each instrument's target on its own scale (data.target_scale=instrument, the default on a
panel), as pytorch-forecasting's GroupNormalizer does: the target is normalized as
(value - centre) / scale with the centre and scale of the instrument's own training rows, so
that the pinball loss counts a quiet name as much as a loud one; the scale's log, relative to
the pooled scale, is a static input (`SCALE_INPUT`), so that the model still knows how loud a
name is. Forecasts are scaled back with the same centre and scale.

The scale of a return target is the std of its returns (centre 0); of a level target (a price)
the std of its one-bar changes, with its mean as the centre: the model forecasts the move from
the last value (the naive anchor; `foxhunt.models.tft`), in units of the name's typical bar
move. A name with fewer than MIN_ROWS training rows (a late listing), or none, falls back on
the pooled scale: a return takes the pooled centre and scale (returns are alike in size across
names); a level takes its own level (the mean of its training rows, or with none its first
value, which no window has as a target) as the centre and the pooled relative move (the std of
every name's one-bar change over the level before it) times that level as the scale: a $20
stock listed late in a panel with a 4000-point future moves like a stock, not like the future.
A level that is not positive, or a panel without positive levels, takes the pooled centre and
scale. A name the model has not seen (past the vocabulary) takes the pooled ones. No scale is
under a floor (a halted name's flat prices): a return's is FLOOR of the pooled scale; a
level's LEVEL_FLOOR of its own mean price (a penny stock's moves are not a future's). A scale
of zero (a constant that is no price) takes the pooled one. data.target_scale=global gives
every name the pooled ones."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

MIN_ROWS = 30  # training rows below which an instrument takes the pooled scale
FLOOR = 0.05  # a return's scale is at least this share of the pooled scale
LEVEL_FLOOR = 1e-5  # a level's scale (of its moves) is at least this share of its mean
SCALE_INPUT = "target_scale"  # the static input: log(instrument's scale / pooled scale)


class TargetMoments(NamedTuple):
    """One instrument's training targets, as `moments` finds them."""

    rows: int
    centre: float  # a level's mean (0 for a return)
    mean: float  # of its moves: the returns themselves, or a level's one-bar changes
    var: float
    level: float  # a level's own level: `centre`, or with no rows its first value (else 0)
    relative: int  # a level's one-bar changes over the positive level before them (0: not all)
    relative_mean: float
    relative_var: float


def moments(target: np.ndarray, kind: str, first: np.ndarray | None = None) -> TargetMoments:
    """One instrument's training targets (`first`: its first value read, the level of a name
    with no training rows)."""
    target = np.asarray(target, np.float64)
    moves = np.diff(target) if kind == "level" else target
    centre = float(target.mean()) if kind == "level" and len(target) else 0.0
    level = centre
    if kind == "level" and not len(target) and first is not None and len(first):
        level = float(np.asarray(first, np.float64)[0])
    mean, var = (float(moves.mean()), float(moves.var())) if len(moves) else (0.0, 0.0)
    relative = (0, 0.0, 0.0)
    if kind == "level" and len(moves) and (target > 0).all():  # a price
        r = moves / target[:-1]
        relative = (len(r), float(r.mean()), float(r.var()))
    return TargetMoments(len(target), centre, mean, var, level, *relative)


def _pooled_std(counts: np.ndarray, means: np.ndarray, variances: np.ndarray) -> float:
    """The std of every group of values together from each group's count, mean and variance
    (0 where there are none)."""
    if counts.sum() == 0:
        return 0.0
    grand = (counts * means).sum() / counts.sum()
    var = (counts * (variances + (means - grand) ** 2)).sum() / counts.sum()
    return float(np.sqrt(var)) if var > 1e-24 else 0.0


def pooled_scale(found: list[TargetMoments], kind: str) -> float:
    """The scale of every instrument's training targets together (`moments` each): the std of
    all their moves about the moves' common mean (1 where there are none)."""
    rows = np.array([m.rows for m in found], np.float64)
    moves = np.maximum(rows - 1, 0) if kind == "level" else rows
    means, variances = (np.array([getattr(m, k) for m in found]) for k in ("mean", "var"))
    return _pooled_std(moves, means, variances) or 1.0


def pooled_relative(found: list[TargetMoments]) -> float:
    """A level's pooled relative move: the std of every price's one-bar changes over the level
    before them (0: no instrument with a positive history)."""
    counts, means, variances = (
        np.array([getattr(m, k) for m in found], np.float64)
        for k in ("relative", "relative_mean", "relative_var")
    )
    return _pooled_std(counts, means, variances)


def instrument_scales(
    found: list[TargetMoments], kind: str, centre: float, scale: float
) -> tuple[list[float], list[float]]:
    """Each instrument's centre and scale from its `moments` (of a target of `kind`), the
    pooled fallback where it has fewer than MIN_ROWS training rows (`centre` and `scale`, or
    for a level the pooled relative move times its own level), and never under the floor
    (module docstring)."""
    relative = pooled_relative(found) if kind == "level" else 0.0
    centres, scales = [], []
    for m in found:
        floor = LEVEL_FLOOR * abs(m.centre) if kind == "level" else FLOOR * scale
        own = max(float(np.sqrt(m.var)), floor)
        short = m.rows < MIN_ROWS
        if not short and own >= 1e-12:
            centres.append(float(m.centre))
            scales.append(float(own))
        elif short and relative > 0 and m.level > 0:  # a price: the pooled relative move
            centres.append(float(m.level))
            scales.append(float(max(relative, LEVEL_FLOOR) * m.level))
        else:
            centres.append(float(centre))
            scales.append(float(scale))
    return centres, scales


def lookup(
    centres: list[float], scales: list[float], centre: float, scale: float, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The centre and scale of each instrument index in `group` (float64 arrays like it): its
    own, or the pooled `centre` and `scale` for an index past `centres` (a name the model has not
    seen) and for every index when there are none (data.target_scale=global)."""
    c = np.append(np.asarray(centres, np.float64), centre)
    s = np.append(np.asarray(scales, np.float64), scale)
    group = np.asarray(group, np.int64)
    at = np.where((group < 0) | (group >= len(centres)), len(centres), group)
    return c[at], s[at]


def scale_input(scales: np.ndarray, scale: float) -> np.ndarray:
    """The static input's raw value (`SCALE_INPUT`): log of each scale relative to the pooled."""
    return np.log(np.asarray(scales, np.float64) / scale)


def of_instruments(target: dict, vocabulary: list[str], names: np.ndarray) -> tuple:
    """The centre and scale [len(names)] of each instrument name, from model.json's `target`
    (`means` and `stds` in the order of the model's `vocabulary`; a model.json written before
    them: the pooled `mean` and `std` for all)."""
    at = {n: i for i, n in enumerate(vocabulary)}
    group = np.array([at.get(str(n), len(at)) for n in names], np.int64)
    return lookup(
        target.get("means", []), target.get("stds", []), target["mean"], target["std"], group
    )


def scale_static(target: dict, vocabulary: list[str], names: Any) -> np.ndarray:
    """The static input `SCALE_INPUT` of each of `names` (`scale_input`, from model.json's
    `target` as `of_instruments` reads it): 0 for a name the model has not seen, whose scale is
    the pooled one. foxhunt's training and predict and the consumer all take it from here."""
    return scale_input(of_instruments(target, vocabulary, np.asarray(names))[1], target["std"])
