"""Futures as futures, as data.futures configures them: contract ids parsed into a root and an
expiry month, a roll schedule per root, and one back-adjusted continuous series per root. The
state machine and the stitching, and their rules, are the serving core's
(`foxhunt_serve.futures`, shared with predict and the ONNX consumer); here are the config's
checks, its translation for the serving core, and rolls.csv.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from foxhunt_serve import ADJUSTMENTS, PRICES, RULES, Continuous, Contract, Roll, continuous
from foxhunt_serve import roll_schedule as serve_roll_schedule
from foxhunt_serve import stitch as serve_stitch

from foxhunt.config import parse_time
from foxhunt.data.features import clock_of
from foxhunt.errors import ConfigError

__all__ = [
    "ROLLS",
    "continuous_table",
    "futures_section",
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


def futures_section(cfg: Any) -> dict[str, Any]:
    """data.futures as the serving core applies it (model.json's `data.futures`): contract ids
    to roots, the roll rule; roll dates as int64 ns UTC."""
    f, roll = cfg.futures, cfg.futures.roll
    return {
        "root_column": getattr(f, "root_column", None),
        "root_pattern": f.root_pattern,
        "roll": {
            "rule": str(roll.rule),
            "confirm_bars": roll.confirm_bars,
            "days": roll.days,
            "dates_ns": [parse_time("data.futures.roll.dates", d) for d in roll.dates],
            "open_interest_column": roll.open_interest_column,
            "expiry_column": getattr(roll, "expiry_column", None),
            "strict": bool(getattr(roll, "strict", False)),
            # the derived inputs (ratios of prices) come from ratio-adjusted prices whatever
            # roll.adjust says (foxhunt_serve.futures.continuous)
            "adjust": "ratio",
        },
    }


def continuous_table(table: pa.Table, cfg: Any) -> tuple[pa.Table, list[Roll]]:
    """data.futures: the rows of a table (the common types of `foxhunt.data.read`) whose group
    column holds contract ids, as one continuous series per root: the held contract's rows,
    their prices (data.ohlcv's open, high, low, close) back-adjusted, the group column holding
    the root; and every root's rolls."""
    if cfg.features != "ohlcv" or cfg.group_column is None:
        raise ConfigError(
            "data.futures needs data.features=ohlcv (its prices are adjusted) and "
            "data.group_column naming the contract id"
        )
    futures = futures_section(cfg)
    roll = futures["roll"]
    check_roll(roll["rule"], roll["dates_ns"], bool(roll["open_interest_column"]))
    data = {
        "time_column": cfg.time_column,
        "time_unit": None,  # the common types' times are timestamps
        # a naive time column's clock (an in-memory table; the common types' times are UTC)
        "calendar": clock_of(cfg).section(),
        "group_column": cfg.group_column,
        "ohlcv": {p: getattr(cfg.ohlcv, p) for p in (*PRICES, "volume")},
        "futures": futures,
    }
    return continuous(table, data)


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
