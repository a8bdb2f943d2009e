"""A model's data config as the serving core (`foxhunt_serve`) reads it: model.json's `data`
and `features` sections, which predict hands the serving core too. Each derived feature is
named by its family and window: `foxhunt_serve.features` is what computes it, and its
definition (no prose copy)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from foxhunt_serve import CONTEXT, SCALE_INPUT, Clock

from foxhunt.data.columns import column_plan, feature_sources
from foxhunt.data.schema import DataSchema
from foxhunt.data.section import OHLCV_FIELDS, DataSection, futures_enabled


def trained_section(cfg: Any, schema: DataSchema, clock: Clock | None = None) -> DataSection:
    """model.json's `data` for a model of `schema` read with data config `cfg`, on the run's
    `clock` (none: the config's): the config's section (`DataSection.of`) with the numeric
    columns read, the target transform and the sessions training learned."""
    section = DataSection.of(cfg, clock)
    read = columns_read(cfg, schema, section)
    return section.trained(schema.target_transform, read, schema.sessions)


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


def columns_read(cfg: Any, schema: DataSchema, section: DataSection) -> list[str]:
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
    return list(column_plan(pads.dataset(stand_in.empty_table()), cfg, section).values)
