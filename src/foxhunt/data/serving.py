"""A model's data config as the serving core (`foxhunt_serve`) reads it: model.json's `data`
and `features` sections, which predict hands the serving core too. Each derived feature is
named by its family and window: `foxhunt_serve.features` is what computes it, and its
definition (no prose copy)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from foxhunt_serve import CONTEXT, SCALE_INPUT

from foxhunt.data.columns import (
    OHLCV_FIELDS,
    column_plan,
    feature_sources,
    futures_enabled,
    ohlcv_section,
)
from foxhunt.data.features import clock_of
from foxhunt.data.futures import futures_section
from foxhunt.data.schema import DataSchema


def data_section(cfg: Any, schema: DataSchema | None = None) -> dict[str, Any]:
    """How a file is read for this model: the columns and their roles, the numeric columns
    read (the NaN policy applies to each; with `schema`), the OHLCV columns and the warm-up
    rows the derived features drop, the futures roll, the exchange's clock (`calendar`: its
    time zone, cash close, session rule, holidays, exchange and, with `schema`, the sessions
    learned in training)."""
    section = {
        "time_column": cfg.time_column,
        "time_unit": None if cfg.time_unit is None else str(cfg.time_unit),
        "group_column": cfg.group_column,
        "target_column": cfg.target,  # None: the log return of the close (derived)
        "known_columns": list(cfg.known_features),  # given in the rows to forecast too
        "nan_policy": str(cfg.nan_policy),
        "columns_read": None if schema is None else columns_read(cfg, schema),
        "ohlcv": ohlcv_section(cfg),
        "futures": futures_section(cfg) if futures_enabled(cfg) else None,
        "calendar": clock_of(cfg).section(),
        # foxhunt_serve.cross_section: the inputs (their names and bases in `features`) and
        # the target, across the names at each time
        "cross_section": str(getattr(cfg, "cross_section", "none")),
        "market_context": bool(getattr(cfg, "market_context", False)),
        "target_transform": "none" if schema is None else schema.target_transform,
    }
    if schema is None:
        del section["columns_read"]
    elif schema.sessions:  # the sessions learned in training (foxhunt_serve.clock.Sessions)
        section["calendar"]["sessions"] = schema.sessions
    return section


def features(schema: DataSchema, cfg: Any) -> dict[str, dict[str, Any]]:
    """Every input feature by name: its role, where it comes from (a `column` of the file, a
    `derived` OHLCV feature of a family and window, the `calendar` of the bar's time), and its
    normalization statistics."""
    bases = {c: b for c in schema.observed if (b := _across(c, cfg, schema))}
    out = feature_sources(cfg, schema.target, schema.observed, schema.known, bases)
    stats = zip(out.values(), schema.input_mean, schema.input_std, strict=True)
    for spec, mean, std in stats:
        spec |= {"mean": float(mean), "std": float(std)}
    statics = zip(schema.static_inputs, schema.static_mean, schema.static_std, strict=True)
    for name, mean, std in statics:
        if name in schema.static:
            source = {"source": "column", "column": name}
        else:  # the target scale's input, of model.json's target.stds (foxhunt_serve.scaling)
            source = {"source": SCALE_INPUT}
        out[name] = {"role": "static", **source, "mean": float(mean), "std": float(std)}
    return out


def target_section(schema: DataSchema) -> dict[str, Any]:
    """The target, and the centre and scale it is normalized with: the pooled ones (`mean`,
    `std`: an instrument not in the model's vocabulary), each instrument's (`means`, `stds`, in
    the vocabulary's order; none: the pooled for all); `anchored`: a level forecast as its
    move from the last value (in the graph)."""
    return {
        "name": schema.target,
        "kind": schema.target_kind,
        "mean": schema.target_center,
        "std": schema.target_scale,
        "means": schema.target_centres,
        "stds": schema.target_scales,
        "anchored": schema.target_anchor,
    }


def _across(name: str, cfg: Any, schema: DataSchema) -> str | None:
    """The observed input `name` is the cross-sectional value of (data.cross_section), if any."""
    how = str(getattr(cfg, "cross_section", "none"))
    base = name.removesuffix(f"_xs_{how}")
    return base if how != "none" and base != name and base in schema.observed else None


def columns_read(cfg: Any, schema: DataSchema) -> list[str]:
    """The numeric columns predict reads from a file for this model, from the column plan of a
    stand-in file with the columns the config names (data.features=all: the model's own)."""
    floats = [*cfg.known_features, *cfg.static_features, *cfg.extra_features]
    if cfg.target is not None:
        floats.append(cfg.target)
    if cfg.features == "ohlcv":
        floats += [getattr(cfg.ohlcv, f) for f in OHLCV_FIELDS]
    elif cfg.features == "all":
        made = set(CONTEXT) if getattr(cfg, "market_context", False) else set()
        own = [c for c in schema.observed if c not in made and _across(c, cfg, schema) is None]
        floats += [*own, *(c for c in schema.dropped if c not in schema.known)]
    else:
        floats += list(cfg.features)
    columns = {cfg.time_column: pa.timestamp("ns")}
    if cfg.group_column:
        columns[cfg.group_column] = pa.string()
    if futures_enabled(cfg):
        roll = cfg.futures.roll
        if roll.open_interest_column:
            floats.append(roll.open_interest_column)
        if roll.expiry_column:
            columns[roll.expiry_column] = pa.timestamp("ns")
        if cfg.futures.root_column:
            columns[cfg.futures.root_column] = pa.string()
    columns |= {c: pa.float64() for c in floats if c not in columns}
    stand_in = pa.schema([pa.field(name, kind) for name, kind in columns.items()])
    return list(column_plan(pads.dataset(stand_in.empty_table()), cfg).values)
