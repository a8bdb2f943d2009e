"""Each instrument's target on its own scale (data.target_scale=instrument, the default on a
panel), as pytorch-forecasting's GroupNormalizer does: the target is normalized as
(value - centre) / scale with the centre and scale of the instrument's own training rows, so
that the pinball loss counts a quiet name as much as a loud one; the scale's log, relative to
the pooled scale, is a static input (`SCALE_INPUT`), so that the model still knows how loud a
name is. Forecasts are scaled back with the same centre and scale.

The scale of a return target is the std of its returns (centre 0); of a level target (a price)
the std of its one-bar changes, with its mean as the centre: the model forecasts the move from
the last value (the naive anchor; `foxhunt.models.tft`), in units of the name's typical bar
move. A name with fewer than MIN_ROWS training rows (a late listing), or none (a name the model
has not seen), takes the pooled centre and scale. No scale is under a floor (a halted name's
flat prices): a return's is FLOOR of the pooled scale (returns are alike in size across names);
a level's LEVEL_FLOOR of its own mean price (a penny stock's moves are not a future's). A
scale of zero (a constant that is no price) takes the pooled one. data.target_scale=global
gives every name the pooled ones."""

from __future__ import annotations

import numpy as np

MIN_ROWS = 30  # training rows below which an instrument takes the pooled scale
FLOOR = 0.05  # a return's scale is at least this share of the pooled scale
LEVEL_FLOOR = 1e-5  # a level's scale (of its moves) is at least this share of its mean
SCALE_INPUT = "target_scale"  # the static input: log(instrument's scale / pooled scale)


def moments(target: np.ndarray, kind: str) -> tuple[int, float, float, float]:
    """One instrument's training targets as (rows, centre, moves' mean, moves' variance):
    the moves are the returns themselves, or a level's one-bar changes."""
    target = np.asarray(target, np.float64)
    moves = np.diff(target) if kind == "level" else target
    centre = float(target.mean()) if kind == "level" and len(target) else 0.0
    if len(moves) == 0:
        return len(target), centre, 0.0, 0.0
    return len(target), centre, float(moves.mean()), float(moves.var())


def pooled_scale(found: list[tuple[int, float, float, float]], kind: str) -> float:
    """The scale of every instrument's training targets together (`moments` each): the std of
    all their moves about the moves' common mean (1 where there are none)."""
    rows = np.array([m[0] for m in found], np.float64)
    moves = np.maximum(rows - 1, 0) if kind == "level" else rows
    if moves.sum() == 0:
        return 1.0
    mean = np.array([m[2] for m in found])
    grand = (moves * mean).sum() / moves.sum()
    var = (moves * (np.array([m[3] for m in found]) + (mean - grand) ** 2)).sum() / moves.sum()
    return float(np.sqrt(var)) if var > 1e-24 else 1.0


def instrument_scales(
    found: list[tuple[int, float, float, float]], kind: str, centre: float, scale: float
) -> tuple[list[float], list[float]]:
    """Each instrument's centre and scale from its `moments` (of a target of `kind`), the
    pooled `centre` and `scale` where it has fewer than MIN_ROWS training rows, and never under
    the floor (module docstring)."""
    centres, scales = [], []
    for rows, c, _, var in found:
        floor = LEVEL_FLOOR * abs(c) if kind == "level" else FLOOR * scale
        own = max(float(np.sqrt(var)), floor)
        short = rows < MIN_ROWS or own < 1e-12
        centres.append(float(centre if short else c))
        scales.append(float(scale if short else own))
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
