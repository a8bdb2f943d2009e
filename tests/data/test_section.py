"""The data section (foxhunt.data.section): how a file is read for a model, one typed value
built once a run, with the run's clock, and handed to every read."""

from __future__ import annotations

import sys

import pyarrow.dataset as pads
import pytest
from foxhunt_serve import Clock

from foxhunt.data.columns import column_plan
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.schema import footer_schema
from foxhunt.data.section import DataSection
from foxhunt.data.serving import trained_section
from tests.helpers import ohlcv_cfg, with_


@pytest.fixture
def clocks_built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where a clock is built from a config's data.calendar (not from model.json's dict, as the
    serving core reads it, nor a zone the daylight check tries)."""
    built, of = [], Clock.of.__func__

    def counted(cls: type, section: object) -> Clock:
        if not isinstance(section, dict):
            built.append(sys._getframe(1).f_globals["__name__"])
        return of(cls, section)

    monkeypatch.setattr(Clock, "of", classmethod(counted))
    return built


@pytest.mark.parametrize("lazy", [False, True])
def test_a_run_builds_its_clock_once_and_every_read_takes_it(
    tmp_path, es_sample, data_cfg, clocks_built, lazy
):
    cfg = with_(ohlcv_cfg(data_cfg, es_sample), lazy=lazy, cache_dir=str(tmp_path))
    cfg.calendar.time_zone = "America/Chicago"
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert clocks_built == ["foxhunt.data.features"]  # clock_of, once, in the data module's setup
    assert dm.section.clock.time_zone == "America/Chicago"
    assert dm.schema.sessions  # learned on that clock


def test_a_plan_and_model_json_read_the_section_the_run_built(es_sample, data_cfg):
    cfg = ohlcv_cfg(data_cfg, es_sample)
    cfg.calendar.time_zone, cfg.calendar.holidays = "America/Chicago", ["2026-01-19"]
    section = DataSection.of(cfg, Clock.of({"time_zone": "America/Chicago"}))
    plan = column_plan(pads.dataset(es_sample), cfg, section)
    assert plan.section is section
    assert plan.meta["data"] == section.as_dict()
    assert plan.meta["data"]["calendar"]["holidays"] == []  # the run's clock, not the config's
    # model.json's: the config's section with what training learned, its clock a round trip
    schema = footer_schema(cfg)
    data = trained_section(cfg, schema).as_dict()
    assert Clock.of(data["calendar"]) == DataSection.of(cfg).clock
    assert data["calendar"]["holidays"] == ["2026-01-19"]
    assert data["columns_read"] == ["open", "high", "low", "close", "volume"]
    assert data["target_transform"] == schema.target_transform
    assert {k: data[k] for k in ("time_column", "group_column", "target_column")} == {
        "time_column": cfg.time_column,
        "group_column": cfg.group_column,
        "target_column": None,
    }
