"""The exchange's clock by default (issue 57, items 7 to 9): the sample's zone, the warning for
bars that keep another zone's daylight-saving dates, weekdays of daily bars in every zone, and
the sessions of a short input (carried from training, or an exchange's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from foxhunt_serve.clock import Clock, Sessions, learn_open, session_steps
from foxhunt_serve.features import calendar
from foxhunt_serve.forecast import output
from foxhunt_serve.read import time_ns, zone_of
from foxhunt_serve.windows import future_steps

from foxhunt.app.inspect_data.inspection import Inspection, _instruments, _zone
from foxhunt.config import DataConfig
from foxhunt.data.daylight import warning
from foxhunt.data.features import clock_of, learned_sessions
from foxhunt.data.read import load_table
from foxhunt.data.samples import es_sample_table
from foxhunt.data.schema import DataSchema
from tests.helpers import (
    compose_train,
    run_script,
    session_bars,
    session_times,
    write_table,
)

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
    clock = clock_of(cfg)
    _instruments(pa.table({"timestamp": pa.array(times, pa.int64())}), cfg, clock, out)
    _zone(times, clock, out)
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

    table = output(W, np.zeros((1, 2, 1)), ["q0.5"], pa.timestamp("ns", tz="UTC"), "none")
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


# --- issue 58, item 2: naive times are local times on data.calendar's clock -----------------


def _naive(path, cols: dict, local: np.ndarray) -> str:
    """`cols` with the times `local` (int64 ns) written without a time zone, as a vendor's."""
    table = pa.table({**cols, "timestamp": pa.array(local, pa.timestamp("ns"))})
    pq.write_table(table, path)
    return str(path)


@pytest.mark.parametrize("weeks", [("2026-03-02", "2026-03-13"), ("2026-10-26", "2026-11-06")])
def test_naive_times_are_local_on_the_calendars_clock_across_a_change(tmp_path, weeks):
    """Chicago's 08:30-15:00 bars over the spring and the autumn change, stamped without a
    zone in Chicago time: read as the same instants, and the same calendar features, as the
    file stamped in UTC; with the default zone (UTC) a naive file reads as it always did."""
    utc = session_times("America/Chicago", *weeks, ("08:30", "15:00"))
    cols = {k: v for k, v in session_bars(utc).items() if k != "timestamp"}
    aware = write_table(tmp_path / "utc.parquet", {"timestamp": utc, **cols})
    naive = _naive(tmp_path / "naive.parquet", cols, CHICAGO.local(utc))
    loaded = []
    for path in (aware, naive):
        cfg = DataConfig(path=str(path), group_column="symbol", features="ohlcv", lazy=False)
        cfg.calendar.time_zone, cfg.calendar.close = CHICAGO.time_zone, "15:00"
        (series,) = load_table(pq.read_table(path), cfg).series
        loaded.append(series)
    np.testing.assert_array_equal(loaded[1].time_ns, loaded[0].time_ns)
    np.testing.assert_array_equal(loaded[1].known, loaded[0].known)  # the calendar's
    np.testing.assert_array_equal(loaded[1].observed, loaded[0].observed)
    meta = {"calendar": CHICAGO.section(), "time_column": "timestamp", "time_unit": None}
    np.testing.assert_array_equal(
        time_ns(pq.read_table(naive), "timestamp", None, zone_of(meta)), utc
    )
    as_utc = time_ns(pq.read_table(naive), "timestamp", None)  # the default clock: UTC
    np.testing.assert_array_equal(as_utc, CHICAGO.local(utc))


@pytest.mark.parametrize(
    ("stamp", "how"),
    [
        ("2026-03-08T02:30:00", "goes forward over it"),
        pytest.param("2026-11-01T01:30:00", "goes back over it", marks=pytest.mark.slow),  # #70
    ],
)
def test_a_naive_time_the_clock_skips_or_repeats_is_one_line_before_training(tmp_path, stamp, how):
    """A naive time that is no instant (spring) or two (autumn) in the calendar's zone: exit 2,
    one line that says how to declare the times, before any training."""
    utc = session_times("America/Chicago", "2026-02-02", "2026-03-06", ("08:30", "15:00"))
    local = np.append(CHICAGO.local(utc), np.datetime64(stamp, "ns").astype(np.int64))
    cols = {k: np.append(v, v[-1]) for k, v in session_bars(utc).items() if k != "timestamp"}
    path = _naive(tmp_path / "naive.parquet", cols, local)
    code, stdout, stderr = run_script(
        "train.py",
        "data=parquet",
        f"data.path={path}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.calendar.time_zone=America/Chicago",
        "trainer.accelerator=cpu",
        *("trainer.max_epochs=1", "trainer.limit_train_batches=1", "report=false"),
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr == (
        f"error: time column 'timestamp' holds {stamp} without a time zone: a local time in "
        f"America/Chicago (data.calendar.time_zone), whose clock {how}; store the column with "
        "its zone (timestamp[ns, tz=America/Chicago]) or in UTC (tz=UTC)\n"
    )
    assert "epoch" not in (stdout + stderr).lower()
