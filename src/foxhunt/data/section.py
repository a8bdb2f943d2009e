"""How a file is read for a model, said once: `DataSection`, model.json's `data` section as a
typed value. A run builds it from its data config once (`DataSection.of`), with the exchange's
clock, and hands it on: the column plan, the reads and the futures roll in training, predict's
windows, and the export (with what training learned, `trained`). The serving core
(`foxhunt_serve`) reads the same section as a dict (`as_dict`), from model.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from foxhunt_serve import TIME_UNITS, Clock, read_time_ns

from foxhunt.checks import parse_time
from foxhunt.data.features import OhlcvSpec, clock_of, ohlcv_spec, warmup_of
from foxhunt.errors import ConfigError

OHLCV_FIELDS = ("open", "high", "low", "close", "volume")


@dataclass(frozen=True)
class DataSection:
    """model.json's `data`: the columns and their roles, the NaN policy, the OHLCV columns and
    the warm-up rows the derived features drop, the futures roll, the exchange's clock, the
    cross-section's settings; with `trained`, the numeric columns read, the target transform
    and the sessions learned in training."""

    time_column: str
    time_unit: str | None  # of an integer time column; timestamps and dates carry their own
    group_column: str | None
    target_column: str | None  # None: the log return of the close (derived)
    known_columns: tuple[str, ...]  # given in the rows to forecast too
    nan_policy: str
    ohlcv: dict[str, Any] | None
    futures: dict[str, Any] | None
    clock: Clock
    # foxhunt_serve.cross_section: the inputs (their names and bases in `features`) and the
    # target, across the names at each time
    cross_section: str = "none"
    market_context: bool = False
    target_transform: str = "none"
    columns_read: tuple[str, ...] | None = None  # set by `trained`
    sessions: dict[str, Any] | None = None  # foxhunt_serve.clock.Sessions, learned in training

    @classmethod
    def of(cls, cfg: Any, clock: Clock | None = None) -> DataSection:
        """The data config `cfg` (a checkpoint's from before a key: as its model was read), on
        the run's `clock` (none: the config's)."""
        if cfg.time_unit is not None and cfg.time_unit not in TIME_UNITS:
            raise ConfigError(f"data.time_unit must be s, ms, us or ns, got {cfg.time_unit!r}")
        return cls(
            time_column=cfg.time_column,
            time_unit=None if cfg.time_unit is None else str(cfg.time_unit),
            group_column=cfg.group_column,
            target_column=cfg.target,
            known_columns=tuple(cfg.known_features),
            nan_policy=str(cfg.nan_policy),
            ohlcv=ohlcv_section(cfg),
            futures=futures_section(cfg) if futures_enabled(cfg) else None,
            clock=clock or clock_of(cfg),
            cross_section=str(getattr(cfg, "cross_section", "none")),
            market_context=bool(getattr(cfg, "market_context", False)),
        )

    def trained(self, transform: str, columns_read: list[str], sessions: dict) -> DataSection:
        """This section with what training decided: the target transform, the numeric columns
        read and each instrument's sessions."""
        return dataclasses.replace(
            self,
            target_transform=transform,
            columns_read=tuple(columns_read),
            sessions=sessions or None,
        )

    def time_ns(self, table: pa.Table) -> np.ndarray:
        """The time column as int64 nanoseconds since 1970 UTC: a timestamp or date column by
        its own unit, an integer column by `time_unit`; naive timestamps are local times on the
        clock (`foxhunt_serve.read.time_ns`)."""
        return read_time_ns(table, self.time_column, self.time_unit, self.clock.time_zone)

    def as_dict(self) -> dict[str, Any]:
        """As model.json holds it and the serving core reads it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["known_columns"] = list(self.known_columns)
        calendar = self.clock.section()
        if self.sessions:
            calendar["sessions"] = self.sessions
        out["calendar"] = calendar
        del out["clock"], out["sessions"]
        if self.columns_read is None:
            del out["columns_read"]
        else:
            out["columns_read"] = list(self.columns_read)
        return out


def ohlcv_spec_of(cfg: Any) -> OhlcvSpec | None:
    """The feature families to derive from raw bars; None unless data.features=ohlcv."""
    if cfg.features != "ohlcv":
        return None
    fields = {f.name: f.default for f in dataclasses.fields(OhlcvSpec) if f.name != "intraday"}
    # a checkpoint's config from before a family lacks its key: the spec's default (none)
    spec = ohlcv_spec(**{k: getattr(cfg.ohlcv, k, d) for k, d in fields.items()})
    # unresolved (no data seen: `footer_schema` for the memory estimator): as intraday bars
    intraday = getattr(cfg.ohlcv, "intraday", "auto")
    return dataclasses.replace(spec, intraday=intraday in (True, "auto", "true"))


def ohlcv_section(cfg: Any) -> dict[str, Any] | None:
    """model.json's `data.ohlcv`: the OHLCV columns and the warm-up rows the derived features
    drop (none: data.features is not ohlcv)."""
    spec = ohlcv_spec_of(cfg)
    if spec is None:
        return None
    return {f: str(getattr(cfg.ohlcv, f)) for f in OHLCV_FIELDS} | {"warmup_rows": warmup_of(spec)}


def futures_enabled(cfg: Any) -> bool:
    """data.futures.enabled, once `foxhunt.data.names` has decided `auto` from the data."""
    futures = getattr(cfg, "futures", None)
    if futures is None:
        return False
    if futures.enabled == "auto":
        raise ConfigError(
            "data.futures.enabled=auto is decided from the data's instrument ids, and no data "
            "file was given: give data.path, or set data.futures.enabled=true or false"
        )
    return bool(futures.enabled)


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
