"""The first run on a user's file: the configured columns found by name in the file, and
data.futures.enabled=auto decided from the instrument ids, before anything else reads it.

The default data group is the bundled futures sample's (`timestamp`, `symbol`, lower-case OHLCV
columns, contracts rolled per root). A user's file names them its own way (`Date`, `Ticker`,
`Close`) and holds stocks: each configured name that is not in the file is matched without case,
then among the usual spellings (`TIME_NAMES`, `GROUP_NAMES`, `OHLCV_NAMES`), and the contracts are
rolled only when every id parses as one. What cannot be found is one DataError naming the
override to add. `resolve_names` changes `cfg` in place and is idempotent; the resolved names are
what every reader (and the summary, the checkpoint's schema, predict) then uses."""

from __future__ import annotations

import logging
import re
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from foxhunt.data.columns import is_numeric
from foxhunt.data.read import group_names
from foxhunt.data.section import OHLCV_FIELDS
from foxhunt.data.source import ensure_sample, open_dataset
from foxhunt.errors import ConfigError, DataError

log = logging.getLogger(__name__)
# how vendors and exports name the bar time and the instrument, in order of preference
TIME_NAMES = ("timestamp", "time", "datetime", "date", "ts_event", "ts", "dt", "date_time")
GROUP_NAMES = ("symbol", "ticker", "instrument", "asset", "contract", "security", "id", "code")
OHLCV_NAMES = {
    "open": ("open", "o"),
    "high": ("high", "h"),
    "low": ("low", "l"),
    "close": ("close", "c", "last"),
    "volume": ("volume", "vol", "v"),
}
SHOWN = 3  # ids quoted in a message


def resolve_data(cfg: Any, dataset: pads.Dataset | None = None) -> None:
    """The bundled sample generated if configured and missing, then `resolve_names`: what every
    command does to its data config before reading (`dataset`: a table's, not cfg.path's)."""
    if dataset is None and cfg.generate_if_missing:
        ensure_sample(cfg.path)
    resolve_names(cfg, dataset)


def resolve_names(cfg: Any, dataset: pads.Dataset | None = None) -> None:
    """data.time_column, data.group_column, data.ohlcv.* and data.target set to the file's own
    spelling, and data.futures.enabled=auto to true or false (see the module docstring)."""
    dataset = open_dataset(cfg.path) if dataset is None else dataset
    schema = dataset.schema
    found: list[str] = []
    time = _find(schema, cfg.time_column, TIME_NAMES, _is_time)
    if time is None:
        raise DataError(
            f"no time column '{cfg.time_column}' in {cfg.path}{_nor(cfg.time_column, TIME_NAMES)}"
            f": add data.time_column=NAME; the file has: {_listing(schema)}"
        )
    if time != cfg.time_column:
        found.append(f"time '{time}'")
        cfg.time_column = time
    if cfg.group_column is not None:
        group = _find(schema, cfg.group_column, GROUP_NAMES, _is_name)
        if group is None:
            raise DataError(
                f"no instrument column '{cfg.group_column}' in {cfg.path}"
                f"{_nor(cfg.group_column, GROUP_NAMES)}: add data.group_column=NAME, or "
                f"data.group_column=null for one series; the file has: {_listing(schema)}"
            )
        if group != cfg.group_column:
            found.append(f"instruments '{group}'")
            cfg.group_column = group
    if cfg.features == "ohlcv":
        found += _resolve_ohlcv(schema, cfg)
    if cfg.target is not None:
        target = _find(schema, cfg.target, (), lambda f: is_numeric(f.type))
        if target is not None and target != cfg.target:
            found.append(f"target '{target}'")
            cfg.target = target
    futures = getattr(cfg, "futures", None)
    if futures is not None and futures.enabled == "auto":
        found.append(_resolve_futures(dataset, cfg))
    if found:
        log.info("data: %s: %s", cfg.path, "; ".join(found))


def _resolve_ohlcv(schema: pa.Schema, cfg: Any) -> list[str]:
    """data.ohlcv's five column names found in the file; a DataError naming data=parquet when
    the file holds no such bars (the default data group derives its features from them)."""
    columns = {
        field: _find(schema, getattr(cfg.ohlcv, field), OHLCV_NAMES[field], _is_number)
        for field in OHLCV_FIELDS
    }
    missing = [getattr(cfg.ohlcv, f) for f, c in columns.items() if c is None]
    if missing:
        raise DataError(
            f"{cfg.path} has no {', '.join(missing)} column(s) (in any case) for "
            "data.features=ohlcv, which derives the features from open/high/low/close/volume "
            "bars: to train on the file's own columns add data=parquet data.target=COLUMN (or "
            f"name the bars: data.ohlcv.close=NAME, ...); the file has: {_listing(schema)}"
        )
    renamed = {f: c for f, c in columns.items() if c != getattr(cfg.ohlcv, f)}
    for f, c in renamed.items():
        setattr(cfg.ohlcv, f, c)
    return [f"bars {'/'.join(renamed.values())}"] if renamed else []


def _resolve_futures(dataset: pads.Dataset, cfg: Any) -> str:
    """data.futures.enabled=auto: on when every instrument id parses as a contract (root, month
    code, year by data.futures.root_pattern); what was decided, for the log line."""
    futures = cfg.futures
    if cfg.group_column is None or cfg.features != "ohlcv":
        futures.enabled = False
        return "one series per instrument (no contract ids to roll)"
    if futures.root_column is not None:  # the file names each contract's root itself
        futures.enabled = True
        return f"futures contracts by root column '{futures.root_column}'"
    try:
        pattern = re.compile(futures.root_pattern)
    except re.error as exc:
        raise ConfigError(f"data.futures.root_pattern is no regex: {exc}") from None
    ids = group_names(dataset, cfg.group_column)
    parsed = [i for i in ids if _is_contract(pattern, i)]
    futures.enabled = bool(ids) and len(parsed) == len(ids)
    if futures.enabled:
        return (
            f"{len(ids)} futures contracts ({', '.join(ids[:SHOWN])}"
            f"{', ...' if len(ids) > SHOWN else ''}) rolled into one series per root "
            "(data.futures.enabled=false: each contract its own series)"
        )
    plain = [i for i in ids if i not in set(parsed)]
    return (
        f"{len(ids)} instruments, not futures contracts ({', '.join(plain[:SHOWN])}"
        f"{', ...' if len(plain) > SHOWN else ''} do not parse as root + month code + year): "
        "each its own series"
    )


def _is_contract(pattern: re.Pattern, contract_id: str) -> bool:
    found = pattern.match(contract_id)
    return found is not None and {"root", "month", "year"} <= set(found.groupdict())


def _find(schema: pa.Schema, name: str, usual: tuple[str, ...], fits: Any) -> str | None:
    """`name` if the file has it; else the one column spelled as it in any case, or (when
    `name` is the default, the first of `usual`: not a name the user chose) as one of `usual`,
    whose type `fits`; None if there is none."""
    if name in schema.names:
        return name
    usual = usual if usual and name == usual[0] else ()
    by_lower: dict[str, list[pa.Field]] = {}
    for f in schema:
        by_lower.setdefault(f.name.lower(), []).append(f)
    for wanted in (name, *usual):
        candidates = [f for f in by_lower.get(wanted.lower(), []) if fits(f)]
        if len(candidates) == 1:  # two spellings of it in one file: which is meant is unsaid
            return candidates[0].name
    return None


def _is_time(f: pa.Field) -> bool:
    t = f.type
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_integer(t)


def _is_name(f: pa.Field) -> bool:
    t = pa.types
    return (
        t.is_string(f.type)
        or t.is_large_string(f.type)
        or t.is_dictionary(f.type)
        or (t.is_integer(f.type))
    )


def _is_number(f: pa.Field) -> bool:
    return is_numeric(f.type)


def _nor(name: str, usual: tuple[str, ...]) -> str:
    """What else was looked for, in a message."""
    return f" (nor {', '.join(usual[1:])}, in any case)" if name == usual[0] else " in any case"


def _listing(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} ({str(f.type).split('[')[0]})" for f in schema)
