"""Futures as futures, as data.futures configures them: contract ids parsed into a root and an
expiry month, a roll schedule per root, and one back-adjusted continuous series per root. The
state machine and the stitching, and their rules, are the serving core's
(`foxhunt_serve.futures`, shared with predict and the ONNX consumer); here are the config's
checks, its translation for the serving core, and rolls.csv.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
from foxhunt_serve import ADJUSTMENTS, RULES, Continuous, Contract, Roll, continuous
from foxhunt_serve import roll_schedule as serve_roll_schedule
from foxhunt_serve import stitch as serve_stitch

from foxhunt.data.section import DataSection
from foxhunt.errors import ConfigError

__all__ = [
    "ROLLS",
    "continuous_table",
    "roll_schedule",
    "rolls_table",
    "stitch",
]
ROLLS = "rolls.csv"  # the roll schedule, in a run directory


def check_roll(rule: str, fixed: list | None, has_interest: bool) -> None:
    """data.futures.roll's rule and what it needs."""
    if rule not in RULES:
        raise ConfigError(f"data.futures.roll.rule must be one of {', '.join(RULES)}, got {rule}")
    if rule == "fixed" and not fixed:
        raise ConfigError(
            "data.futures.roll.rule=fixed needs data.futures.roll.dates (one ISO time per roll)"
        )
    if rule == "open_interest" and not has_interest:
        raise ConfigError(
            "data.futures.roll.rule=open_interest needs data.futures.roll.open_interest_column"
        )


def roll_schedule(
    contracts: list[Contract],
    rule: str,
    confirm_bars: int = 1,
    days: int = 5,
    fixed: list[int] | None = None,
    strict: bool = False,
) -> list[Roll]:
    """The rolls of one root's held contract over time, factor not yet set (nan)."""
    check_roll(rule, fixed, all(c.open_interest is not None for c in contracts))
    return serve_roll_schedule(contracts, rule, confirm_bars, days, fixed, strict)


def stitch(contracts: list[Contract], rolls: list[Roll], adjust: str) -> Continuous:
    """The continuous series of one root from its contracts and rolls (see the module)."""
    if adjust not in ADJUSTMENTS:
        raise ConfigError(
            f"data.futures.roll.adjust must be one of {', '.join(ADJUSTMENTS)}, got {adjust}"
        )
    return serve_stitch(contracts, rolls, adjust)


def continuous_table(table: pa.Table, section: DataSection) -> tuple[pa.Table, list[Roll]]:
    """data.futures: the rows of a table (the common types of `foxhunt.data.read`) whose group
    column holds contract ids, as one continuous series per root: the held contract's rows,
    their prices (data.ohlcv's open, high, low, close) back-adjusted, the group column holding
    the root; and every root's rolls."""
    if section.ohlcv is None or section.group_column is None or section.futures is None:
        raise ConfigError(
            "data.futures needs data.features=ohlcv (its prices are adjusted) and "
            "data.group_column naming the contract id"
        )
    roll = section.futures["roll"]
    check_roll(roll["rule"], roll["dates_ns"], bool(roll["open_interest_column"]))
    # the common types' times are timestamps (UTC), whatever unit the file's had
    return continuous(table, dataclasses.replace(section, time_unit=None).as_dict())


def rolls_table(rolls: list[Roll]) -> pa.Table:
    """The roll schedule (rolls.csv): time, from, to, adjustment factor, whether `to` is held
    at the end of the data."""
    return pa.table(
        {
            "time": pa.array([r.time_ns for r in rolls], pa.timestamp("ns", tz="UTC")),
            "from": [r.from_id for r in rolls],
            "to": [r.to_id for r in rolls],
            "factor": pa.array([r.factor for r in rolls], pa.float64()),
            "held_at_end": pa.array([r.held_at_end for r in rolls], pa.bool_()),
        }
    )
