"""Which columns to read and the role each plays for the TFT (observed, known, static, target),
from the configured data settings and the Parquet footers alone: no rows are read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from foxhunt_serve import CONTEXT

from foxhunt.data.features import OhlcvSpec, feature_names, feature_plan
from foxhunt.data.section import OHLCV_FIELDS, DataSection, futures_enabled, ohlcv_spec_of
from foxhunt.data.source import one_line
from foxhunt.errors import ConfigError, DataError

OHLCV_TARGET = "log_return"


def is_numeric(t: pa.DataType) -> bool:
    """Whether a column of type `t` can be read as float64 values (integers and booleans too)."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _type_name(t: pa.DataType) -> str:
    """The type without its parameters: timestamp[ns, tz=UTC] -> timestamp."""
    return str(t).split("[")[0].split("<")[0].split("(")[0]


def skipped_columns(schema: pa.Schema, cfg: Any) -> dict[str, str]:
    """The columns data.features=all leaves out for not being numeric, with their type."""
    if cfg.features != "all":
        return {}
    roles = {cfg.time_column, cfg.group_column, cfg.target, *cfg.known_features}
    roles |= set(cfg.static_features)
    return {
        f.name: _type_name(f.type) for f in schema if f.name not in roles and not is_numeric(f.type)
    }


def resolve_columns(
    schema: pa.Schema, cfg: Any
) -> tuple[list[str], list[str], list[str], str, list[str]]:
    """Return (observed, known, static, target, values): column names by role, checked to exist,
    and every numeric column to read (the target only when it is not derived)."""
    names = set(schema.names)
    ohlcv = cfg.features == "ohlcv"
    target = cfg.target if cfg.target is not None else OHLCV_TARGET
    known, static = list(cfg.known_features), list(cfg.static_features)
    wanted = [cfg.time_column] + ([cfg.group_column] if cfg.group_column else []) + known + static
    if ohlcv:
        wanted += [getattr(cfg.ohlcv, f) for f in OHLCV_FIELDS]
        if cfg.target is not None:
            wanted.append(target)
        observed = []
    else:
        wanted.append(target)
        if cfg.features == "all":
            skip = {cfg.time_column, cfg.group_column, target, *known, *static}
            observed = [f.name for f in schema if f.name not in skip and is_numeric(f.type)]
            if not observed:
                raise DataError("data.features=all found no numeric feature column in the file")
        else:
            observed = [c for c in cfg.features if c != target and c not in known]
            wanted += observed
    extra = extra_features(cfg, observed, target, known, static)
    observed += extra
    wanted += extra
    futures = getattr(cfg, "futures", None)
    on = futures_enabled(cfg)
    if on and futures.roll.open_interest_column:
        wanted.append(futures.roll.open_interest_column)  # read, not a feature
    for key, column in (
        ("roll.expiry_column", futures.roll.expiry_column if on else None),
        ("root_column", getattr(futures, "root_column", None) if on else None),
    ):
        if column and column not in names:
            raise DataError(
                f"data.futures.{key} names '{column}', which is not in {cfg.path}; "
                f"the file has: {', '.join(schema.names)}"
            )
    missing = [c for c in dict.fromkeys(wanted) if c not in names]
    if missing:
        raise DataError(
            f"missing column(s) {', '.join(missing)} in {cfg.path}; "
            f"the file has: {', '.join(schema.names)}"
        )
    keys = {cfg.time_column, cfg.group_column}
    values = [c for c in dict.fromkeys(wanted + observed) if c not in keys]
    return observed, known, static, target, values


def extra_features(
    cfg: Any, observed: list[str], target: str, known: list[str], static: list[str]
) -> list[str]:
    """data.extra_features not already observed; one that has another role is an error."""
    extra = list(dict.fromkeys(getattr(cfg, "extra_features", None) or []))
    roles = {target: "the target", cfg.time_column: "the time column"}
    roles |= {cfg.group_column: "the group column"} | dict.fromkeys(known, "a known feature")
    roles |= dict.fromkeys(static, "a static feature")
    spec = ohlcv_spec_of(cfg)
    roles |= dict.fromkeys(feature_names(spec)[0] if spec else (), "a derived feature")
    for c in extra:
        if c in roles:
            raise ConfigError(f"data.extra_features names '{c}', which is {roles[c]}")
    return [c for c in extra if c not in observed]


def model_inputs(cfg: Any, observed: list[str], known: list[str]) -> tuple[list[str], list[str]]:
    """The observed and known inputs the model sees: with features=ohlcv, the derived ones."""
    spec = ohlcv_spec_of(cfg)
    if spec is None:
        return observed, known
    derived_observed, derived_known = feature_names(spec)
    return list(derived_observed) + observed, list(derived_known) + known


def resolve_target_kind(cfg: Any) -> str:
    if cfg.target_kind != "auto":
        return str(cfg.target_kind)  # the config's TargetKind: a plain string for checkpoints
    return "return" if cfg.features == "ohlcv" and cfg.target is None else "level"


def _time_kind(t: pa.DataType) -> str | None:
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "timestamp"
    return "integer" if pa.types.is_integer(t) else None


def check_files(dataset: pads.Dataset, cfg: Any, values: list[str]) -> None:
    """Every file of a directory holds the columns to read with usable types, from its footer
    alone; a DataError naming the file otherwise (pyarrow would fill a missing column with nulls
    and fail a type mismatch deep in the scan)."""
    if not isinstance(dataset, pads.FileSystemDataset) or len(dataset.files) < 2:
        return
    time_col = cfg.time_column
    wanted = [time_col] + ([cfg.group_column] if cfg.group_column else []) + values
    first: tuple[pa.DataType, str] | None = None
    for fragment in dataset.get_fragments():
        path = fragment.path
        try:
            schema = fragment.physical_schema
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"cannot read {path} as Parquet: {one_line(exc)}") from None
        partition = pads.get_partition_keys(fragment.partition_expression)
        missing = [c for c in wanted if c not in schema.names and c not in partition]
        if missing:
            raise DataError(
                f"missing column(s) {', '.join(missing)} in {path}; "
                f"the file has: {', '.join(schema.names)}"
            )
        for c in values:
            if c in schema.names and not is_numeric(schema.field(c).type):
                raise DataError(
                    f"column '{c}' is {schema.field(c).type} in {path}, expected a numeric column"
                )
        if time_col not in schema.names:
            continue
        t = schema.field(time_col).type
        if _time_kind(t) is None:
            raise DataError(
                f"time column '{time_col}' is {t} in {path}, expected a timestamp or integer"
            )
        if first is None:
            first = (t, path)
        elif _time_kind(t) != _time_kind(first[0]):
            raise DataError(
                f"time column '{time_col}' is {t} in {path} but {first[0]} in {first[1]}; "
                "write every file with the same schema"
            )


@dataclass
class ColumnPlan:
    """What to read and the role of every column; shared by `read_data` and `stream`."""

    cfg: Any
    observed: list[str]  # the model's observed inputs (derived ones with features=ohlcv)
    extra: list[str]  # columns read as observed inputs beside the derived ones (features=ohlcv)
    known: list[str]  # the model's known inputs (calendar ones first with features=ohlcv)
    user_known: list[str]  # data.known_features
    static: list[str]
    target: str
    target_kind: str
    values: list[str]  # the numeric columns read
    spec: OhlcvSpec | None
    skipped: dict[str, str]  # column -> its type: not numeric, so left out by features=all
    section: DataSection  # how the file is read, the run's clock with it
    # how `foxhunt_serve.make_series` makes each series' inputs, as model.json tells predict
    meta: dict[str, Any]


def column_plan(dataset: pads.Dataset, cfg: Any, section: DataSection | None = None) -> ColumnPlan:
    """The role of every configured column, from the dataset's schema alone (no rows read);
    `section`: the run's (none: the config's)."""
    section = section or DataSection.of(cfg)
    observed, known, static, target, values = resolve_columns(dataset.schema, cfg)
    model_observed, model_known = model_inputs(cfg, observed, known)
    taken = [c for c in CONTEXT if getattr(cfg, "market_context", False) and c in model_observed]
    if taken:
        raise ConfigError(
            f"data.market_context=true adds the input(s) {', '.join(taken)}, which the data "
            "already has: rename the column(s), or set data.market_context=false"
        )
    sources = feature_sources(cfg, target, model_observed, model_known)
    sources |= {s: {"role": "static", "source": "column", "column": s} for s in static}
    return ColumnPlan(
        cfg=cfg,
        observed=model_observed,
        extra=observed if cfg.features == "ohlcv" else [],
        known=model_known,
        user_known=known,
        static=static,
        target=target,
        target_kind=resolve_target_kind(cfg),
        values=values,
        spec=ohlcv_spec_of(cfg),
        skipped=skipped_columns(dataset.schema, cfg),
        section=section,
        meta={"data": section.as_dict(), "features": sources, "target": {"name": target}},
    )


def feature_sources(
    cfg: Any,
    target: str,
    observed: list[str],
    known: list[str],
    bases: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """The target's and every observed and known input's role and source, by name: a `column`
    of the file, a `derived` OHLCV feature of a family and window, the `calendar` of the bar's
    time, the `cross_section` of the input `bases[name]`, or data.market_context's `context`
    (`foxhunt_serve.series` makes each)."""
    spec = ohlcv_spec_of(cfg)
    derived, calendar = feature_plan(spec) if spec is not None else ([], [])
    spec_of = {f"{fam}_{w}": (fam, w) for fam, w in derived}
    roles = [("target", target), *(("observed", c) for c in observed)]
    out = {}
    for role, name in roles + [("known", c) for c in known]:
        if role == "target" and cfg.target is None:
            source = {"source": "derived", "family": OHLCV_TARGET}
        elif name in spec_of:
            source = {"source": "derived", "family": spec_of[name][0], "window": spec_of[name][1]}
        elif name in calendar:
            source = {"source": "calendar"}
        elif role == "observed" and name in (bases or {}):
            source = {"source": "cross_section", "of": bases[name]}
        elif role == "observed" and name in CONTEXT and getattr(cfg, "market_context", False):
            source = {"source": "context", "stat": CONTEXT[name]}
        else:
            source = {"source": "column", "column": name}
        out[name] = {"role": role, **source}
    return out
