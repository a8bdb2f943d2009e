"""A trained model's windows from new bars: each instrument's latest, every window with a full
encoder history, or those ACI replays after its stored state (`foxhunt_serve.Cut`), checked
against the checkpoint's schema and normalized as it says; their known inputs continued on the
instrument's clock (`foxhunt.app.predict.predictor` forecasts them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from foxhunt_serve import (
    Clock,
    Cut,
    Facts,
    Sessions,
    check_history,
    complete_rows,
    future_steps,
    known_inputs,
    recent_rows,
    series_rows,
)
from omegaconf import DictConfig

from foxhunt.data.horizon import Future, known_of
from foxhunt.data.read import Series, load_table
from foxhunt.data.schema import DataSchema, drop_features
from foxhunt.data.serving import trained_section
from foxhunt.data.windows import WindowBuilder, WindowDataset, encoder_rows
from foxhunt.errors import ConfigError


@dataclass
class Windows(Facts):
    """The windows to forecast, as the model takes them (`dataset`), and what each row of the
    output says about them (the consumer's `Facts`)."""

    dataset: WindowDataset


def build_windows(
    table: pa.Table,
    cfg: DictConfig,
    schema: DataSchema,
    all_windows: bool,
    unseen: bool = False,
    replay: tuple[dict[str, int], int] | None = None,
    clock: Clock | None = None,
) -> Windows:
    """Check `table` against the checkpoint's `schema` and cut its windows: each instrument's
    latest, or with `all_windows` every window with a full encoder history, or with `replay`
    those ACI replays after its stored state (`foxhunt_serve.Cut`; `unseen`: the model
    forecasts names outside its vocabulary). `clock`: the run's (none: the config's)."""
    if schema.groups and not cfg.group_column:
        raise ConfigError(
            f"the checkpoint was trained on instruments {', '.join(schema.groups)}: set "
            "data.group_column to the column that names them"
        )
    section = trained_section(cfg, schema, clock)
    read = section.as_dict()
    e, h = schema.encoder_length, schema.prediction_length
    if not all_windows:  # the rows those windows read, not the whole history
        table = recent_rows(table, read, e, h, replay)
    # a model trained across names reads up to the last complete time (foxhunt_serve)
    observed_rows, future = complete_rows(table, read, schema.groups, h)
    loaded = load_table(observed_rows, cfg, section)
    series: list[Series] = list(loaded.series)
    names = sorted({s.name for s in series} | set(future))
    # without the features the model was trained without (constant then)
    found, keep = drop_features(
        DataSchema.from_loaded(
            loaded, cfg, names if cfg.group_column else [], encoder_length=e, prediction_length=h
        ).to_dict(),
        schema.dropped,
    )
    schema.check_matches(DataSchema.from_dict(found), unseen)
    usable = {s.name: len(s.target) for s in series}
    short = check_history(usable, names, observed_rows, read, e)
    series = [s for s in series if s.name not in short]
    return _cut(series, future, loaded, cfg, schema, keep, all_windows, replay, section.clock)


def _cut(
    series: list[Series],
    future: dict[str, Future],
    loaded: Any,
    cfg: DictConfig,
    schema: DataSchema,
    keep: Any,
    all_windows: bool,
    replay: tuple[dict[str, int], int] | None,
    clock: Clock,
) -> Windows:
    """The windows of each series, normalized as the checkpoint's schema says."""
    e, h = schema.encoder_length, schema.prediction_length
    cut, builder = Cut(e, h, all_windows, replay), WindowBuilder(["predict"])
    sessions = Sessions(schema.sessions)
    known, given_known = known_of(cfg)
    for s in series:
        given = future.get(s.name)
        times, from_data, user = future_steps(
            s.name, s.time_ns, given, h, list(cfg.known_features), clock, sessions
        )
        origins, time_all = cut.origins(s.name, s.time_ns, s.target, times, from_data, s.raw_target)
        if len(origins) == 0:
            continue
        after = known_inputs(times, user, known, given_known, clock.dated(s.time_ns))
        rows = series_rows(encoder_rows(s), after)
        builder.add(s.name, rows, time_all, [origins - e + 1], s.static)
    facts = cut.facts(list(cfg.known_features), "predict.all_windows=true")
    arrays = builder.normalize(schema.to_dict(), keep)
    dataset = arrays.datasets(e, h, bool(schema.groups))["predict"]
    return Windows(dataset=dataset, **facts)
