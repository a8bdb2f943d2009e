"""The exchange's clock by default (issue 57, items 7 to 9): the sample's zone, the warning for
bars that keep another zone's daylight-saving dates, weekdays of daily bars in every zone, and
the sessions of a short input (carried from training, or an exchange's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from foxhunt_serve.clock import Clock, Sessions, learn_open, session_steps
from foxhunt_serve.features import calendar
from foxhunt_serve.forecast import output
from foxhunt_serve.windows import future_steps

from foxhunt.app.inspect import Inspection, _instruments, _zone
from foxhunt.data.daylight import warning
from foxhunt.data.features import clock_of, learned_sessions
from foxhunt.data.sample import es_sample_table
from foxhunt.data.schema import DataSchema
from tests.helpers import compose_train

FIVE_MIN = 300 * 10**9
DAY = 86_400 * 10**9
CHICAGO = Clock.of({"time_zone": "America/Chicago", "close": "15:00"})


def _ns(*stamps: str) -> np.ndarray:
    return np.array(stamps, dtype="datetime64[ns]").view(np.int64)


@pytest.fixture(scope="module")
def es() -> np.ndarray:
    """The bundled sample's distinct bar times, six weeks over the March change."""
    t = es_sample_table(days=30).column("timestamp").cast("int64").to_numpy()
    return np.unique(t)


# --- 7: the exchange's clock by default -------------------------------------------------------


def test_the_sample_names_its_zone_and_cash_close():
    clock = clock_of(compose_train("data=es_fut_small").data)
    assert (clock.time_zone, clock.close_min) == ("America/Chicago", 15 * 60)


def test_bars_on_another_zones_daylight_saving_dates_get_one_warning(es):
    """The sample keeps Chicago's hours: read in UTC, its hours shift on March 8; read in
    Chicago they do not; bars round the clock say nothing either way."""
    said = warning(es, Clock())
    assert "America/Chicago" in said and "data.calendar.time_zone=" in said
    assert warning(es, CHICAGO) is None
    fixed = es - (es % DAY) + 14 * 3600 * 10**9 + (es % (6 * 3600 * 10**9))  # UTC hours
    assert "UTC" in warning(fixed, CHICAGO)
    round_the_clock = np.arange(es[0], es[-1], FIVE_MIN)
    assert warning(round_the_clock, Clock()) is None


def _inspected(times: np.ndarray, zone: str) -> Inspection:
    cfg = compose_train("data=es_fut_small").data
    cfg.group_column, cfg.futures.enabled = None, False
    cfg.calendar.time_zone, cfg.calendar.close = zone, None
    out = Inspection()
    _instruments(pa.table({"timestamp": pa.array(times, pa.int64())}), cfg, out)
    _zone(times, cfg, out)
    return out


def test_inspect_warns_and_reads_weekdays_in_the_configured_zone(es):
    out = _inspected(es, "UTC")
    assert sum(line.startswith("warning: ") for line in out.lines) == 1
    assert "America/Chicago" in out.facts["bars"]["zone_warning"]
    chicago = _inspected(es, "America/Chicago")
    assert chicago.facts["bars"]["zone_warning"] is None
    assert chicago.facts["instruments"]["each"]["series"]["saturday_bars"] == 0
    tokyo = _inspected(es, "Asia/Tokyo")  # Friday afternoon in Chicago is Saturday there
    assert tokyo.facts["instruments"]["each"]["series"]["saturday_bars"] > 0


# --- 8: a daily bar is its calendar date in every zone ---------------------------------------

ZONES = ["America/New_York", "Asia/Tokyo"]


@pytest.mark.parametrize("zone", ZONES)
def test_daily_bars_at_midnight_utc_keep_their_weekday(zone):
    monday = _ns("2026-03-09", "2026-03-10")  # a Monday and a Tuesday
    clock = Clock.of({"time_zone": zone})
    np.testing.assert_array_equal(calendar(monday, "dow_sin", clock), calendar(monday, "dow_sin"))
    np.testing.assert_array_equal(calendar(monday, "dow_cos", clock), calendar(monday, "dow_cos"))


@pytest.mark.parametrize("zone", ZONES)
def test_daily_steps_after_the_data_are_mondays_less_holidays(zone):
    """Weekday dates to a Friday: the next steps are Monday, Tuesday; with Monday a holiday,
    Tuesday, Wednesday, in either zone."""
    days = np.arange(np.datetime64("2026-01-05"), np.datetime64("2026-03-07"))
    history = days[np.is_busday(days)].astype("datetime64[ns]").view(np.int64)
    clock = Clock.of({"time_zone": zone})
    got = session_steps(history, int(history[-1]), DAY, 2, clock)
    assert got.tolist() == _ns("2026-03-09", "2026-03-10").tolist()
    holiday = Clock.of({"time_zone": zone, "holidays": ["2026-03-09"]})
    got = session_steps(history, int(history[-1]), DAY, 2, holiday)
    assert got.tolist() == _ns("2026-03-10", "2026-03-11").tolist()


# --- 9: the sessions of a short input ---------------------------------------------------------


def test_a_short_input_continues_in_the_sessions_carried_from_training(es):
    """Two sessions of the sample to a Friday's 15:55 Chicago: alone they say nothing of the
    weekend (the steps run on at 16:00); with the sessions learned on the whole history, the
    steps are Sunday's open, 17:00 Chicago, and they survive model.json's round trip."""
    friday = _ns("2026-04-03T20:55")[0]  # 15:55 in Chicago summer time
    short = es[(es <= friday) & (es > friday - 2 * DAY)]
    learned = learned_sessions(es[es <= friday], np.zeros(len(es[es <= friday])), [], CHICAGO)
    sessions = Sessions(learned)
    alone, _, _ = future_steps("series", short, None, 2, [], CHICAGO)
    assert alone.tolist() == (friday + FIVE_MIN * np.arange(1, 3)).tolist()
    carried, from_data, _ = future_steps("series", short, None, 2, [], CHICAGO, sessions)
    assert carried.tolist() == _ns("2026-04-05T22:00", "2026-04-05T22:05").tolist()
    assert not from_data.any()
    assert np.array_equal(
        sessions.open("series", FIVE_MIN), learn_open(es[es <= friday], FIVE_MIN, CHICAGO)
    )
    old = DataSchema.from_dict(
        {
            k: v
            for k, v in DataSchema([], [], [], [], "y", "return", 4, 2).to_dict().items()
            if k != "sessions"
        }
    )
    assert old.sessions == {}  # a checkpoint from before: its input's own sessions


def test_the_forecast_writes_continued_times_and_says_so():
    class W:
        instrument = np.array(["ES"], dtype=object)
        origin_ns = _ns("2026-04-03T20:55")
        target_ns = _ns("2026-04-03T21:00", "2026-04-05T22:00")[None, :]
        target_time_known = np.array([[True, False]])
        actual = np.array([[0.1, np.nan]])

    table = output(W, np.zeros((1, 2, 1)), ["q0.5"], pa.timestamp("ns", tz="UTC"))
    assert table["target_time"].null_count == 0
    assert table["target_time"].cast(pa.int64()).to_pylist() == W.target_ns[0].tolist()
    assert table["target_time_continued"].to_pylist() == [False, True]


def test_an_exchange_gives_its_holidays_and_early_closes():
    pytest.importorskip("exchange_calendars")
    cme = Clock.of({"exchange": "XCME", "session": "continuous"})
    assert cme.time_zone == "America/Chicago" and cme.exchange == "CMES"
    last = _ns("2026-11-27T17:50")[0]  # the day after Thanksgiving: closes at 12:00 Chicago
    got = session_steps(np.array([last - FIVE_MIN, last]), int(last), FIVE_MIN, 3, cme)
    assert got.tolist() == _ns("2026-11-27T17:55", "2026-11-29T23:00", "2026-11-29T23:05").tolist()
    nyse = Clock.of({"exchange": "XNYS"})
    dates = _ns("2026-11-23", "2026-11-24", "2026-11-25")
    got = session_steps(dates, int(dates[-1]), DAY, 2, nyse)  # not Thanksgiving, the 26th
    assert got.tolist() == _ns("2026-11-27", "2026-11-30").tolist()
