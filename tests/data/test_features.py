"""Tests of the OHLCV feature derivation (foxhunt.data.features)."""

from __future__ import annotations

import math
import time
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from foxhunt_serve.clock import Clock
from foxhunt_serve.features import calendar
from omegaconf import OmegaConf

from foxhunt.config import DataConfig
from foxhunt.data.features import (
    KNOWN_CALENDAR,
    OhlcvSpec,
    clock_of,
    derive_features,
    feature_names,
    feature_plan,
    ohlcv_spec,
    warmup_of,
)
from foxhunt.data.section import ohlcv_spec_of
from foxhunt.errors import ConfigError, DataError

NS_MIN = 60 * 10**9


def _bars(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t0 = np.datetime64("2026-03-02T00:00", "ns").astype(np.int64)  # a Monday
    t = t0 + np.arange(n, dtype=np.int64) * 5 * NS_MIN
    close = 5000 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))
    open_ = np.concatenate([[close[0]], close[:-1]])
    high = np.maximum(open_, close) * (1 + rng.uniform(0, 5e-4, n))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, 5e-4, n))
    volume = rng.integers(1, 5000, n)
    return t, open_, high, low, close, volume


def _all(d):
    return {**d.observed, **d.known}


def test_default_names_and_count():
    spec = OhlcvSpec()
    obs, known = feature_names(spec)
    assert obs == [
        "logret_2", "logret_4", "logret_8", "logret_16", "logret_32", "logret_64",
        "rvol_6", "rvol_12", "rvol_24", "rvol_48", "rvol_96",
        "volz_12", "volz_48", "volz_96",
        "range_1", "range_12",
        "clv_1", "clv_12",
    ]  # fmt: skip
    assert known == list(KNOWN_CALENDAR) == [
        "tod_sin", "tod_cos", "dow_sin", "dow_cos", "to_cash_close"
    ]  # fmt: skip
    assert len(obs) + len(known) == 23
    d = derive_features(*_bars(300), spec)
    assert list(d.observed) == obs
    assert list(d.known) == known
    assert feature_names(OhlcvSpec(calendar=False))[1] == []


def test_output_types_and_lengths():
    bars = _bars(300)
    d = derive_features(*bars, OhlcvSpec())
    for name, a in {**_all(d), "target": d.target}.items():
        assert a.dtype == np.float32, name
        assert a.shape == (300,), name
    assert np.isnan(d.target[0])
    np.testing.assert_allclose(d.target[1:], np.diff(np.log(bars[4])), rtol=1e-5)


def test_hand_computed_values():
    t, o, h, lo, c, v = _bars(400, seed=3)
    d = derive_features(t, o, h, lo, c, v, OhlcvSpec())
    r = np.diff(np.log(c))  # r[j-1] is the return of row j
    x = np.log1p(v.astype(float))
    for row in (96, 250, 399):
        np.testing.assert_allclose(
            d.observed["logret_8"][row], np.log(c[row] / c[row - 8]), rtol=1e-5
        )
        rv = np.sqrt(np.mean(r[row - 24 : row] ** 2))  # returns of rows row-23..row
        np.testing.assert_allclose(d.observed["rvol_24"][row], rv, rtol=1e-5)
        win = x[row - 47 : row + 1]
        z = (x[row] - win.mean()) / win.std()
        np.testing.assert_allclose(d.observed["volz_48"][row], z, rtol=1e-4, atol=1e-5)
        rng12 = np.log(h[row - 11 : row + 1].max() / lo[row - 11 : row + 1].min())
        np.testing.assert_allclose(d.observed["range_12"][row], rng12, rtol=1e-5)
        loc = (c[row] - lo[row - 11 : row + 1].min()) / (
            h[row - 11 : row + 1].max() - lo[row - 11 : row + 1].min()
        )
        np.testing.assert_allclose(d.observed["clv_12"][row], loc, rtol=1e-5)
    # Values at the first valid row and NaN just before it.
    assert np.isnan(d.observed["rvol_24"][23]) and np.isfinite(d.observed["rvol_24"][24])
    assert np.isnan(d.observed["logret_8"][7]) and np.isfinite(d.observed["logret_8"][8])
    assert np.isnan(d.observed["volz_48"][46]) and np.isfinite(d.observed["volz_48"][47])


def test_momentum_definition():
    t, o, h, lo, c, v = _bars(200, seed=4)
    d = derive_features(t, o, h, lo, c, v, OhlcvSpec(momentum_windows=[16]))
    r = np.diff(np.log(c))
    row = 150
    win = r[row - 16 : row]
    expected = win.sum() / (np.sqrt(16) * np.sqrt(np.mean(win**2)))
    np.testing.assert_allclose(d.observed["mom_16"][row], expected, rtol=1e-4)


def test_gap_definition():
    """gap_w: the overnight returns log(o_s / c_{s-1}) summed over the window, NaN until the
    window holds bars with a close before them."""
    t, o, h, lo, c, v = _bars(200, seed=5)
    d = derive_features(t, o, h, lo, c, v, OhlcvSpec(gap_windows=[1, 5]))
    row = 120
    np.testing.assert_allclose(d.observed["gap_1"][row], np.log(o[row] / c[row - 1]), rtol=1e-5)
    five = np.log(o[row - 4 : row + 1] / c[row - 5 : row]).sum()
    np.testing.assert_allclose(d.observed["gap_5"][row], five, rtol=1e-5)
    assert np.isnan(d.observed["gap_5"][4]) and np.isfinite(d.observed["gap_5"][5])


def test_the_gap_is_a_default_of_the_config_but_not_of_an_old_checkpoint():
    """A run gets gap_1 from the config; a checkpoint's config from before the family (no
    gap_windows key) derives the inputs it was trained on, without it."""
    cfg = OmegaConf.structured(DataConfig)
    cfg.features = "ohlcv"
    assert "gap_1" in feature_names(ohlcv_spec_of(cfg))[0]
    old = OmegaConf.to_container(cfg)
    del old["ohlcv"]["gap_windows"]
    assert not any(
        n.startswith("gap") for n in feature_names(ohlcv_spec_of(OmegaConf.create(old)))[0]
    )


@pytest.mark.parametrize(
    "spec", [OhlcvSpec(), OhlcvSpec(gap_windows=[1, 3]), OhlcvSpec(num_features=225)]
)
def test_causal(spec):
    n, k = 900, 600
    bars = _bars(n, seed=1)
    base = derive_features(*bars, spec)
    t, o, h, lo, c, v = (a.copy() for a in bars)
    rng = np.random.default_rng(9)
    c[k:] *= np.exp(rng.normal(0, 0.01, n - k))
    h[k:] = np.maximum(h[k:], c[k:]) * 1.01
    lo[k:] = np.minimum(lo[k:], c[k:]) * 0.99
    v[k:] = v[k:] * 7 + 3
    o[k:] *= 1.003
    t[k:] += 17 * NS_MIN
    changed = derive_features(t, o, h, lo, c, v, spec)
    for name, a in _all(base).items():
        b = _all(changed)[name]
        assert np.array_equal(a[:k], b[:k], equal_nan=True), name
    assert np.array_equal(base.target[:k], changed.target[:k], equal_nan=True)
    # ... and the change is visible from row k on.
    assert not np.array_equal(base.observed["logret_2"][k:], changed.observed["logret_2"][k:])


def test_num_features_225():
    spec = OhlcvSpec(num_features=225)
    obs, known = feature_names(spec)
    names = obs + known
    assert len(names) == 225 and len(set(names)) == 225
    assert names[:18] == feature_names(OhlcvSpec())[0]  # base list first
    windows = [w for _, w in feature_plan(spec)[0]]
    assert max(windows) <= 512
    bars = _bars(1500, seed=2)
    d = derive_features(*bars, spec)
    assert list(d.observed) == obs and list(d.known) == known
    x = np.stack(list(_all(d).values()) + [d.target], axis=1)
    assert x.shape == (1500, 226)
    assert np.isfinite(x[d.warmup :]).all()
    assert np.isnan(x[d.warmup - 1]).any()
    assert d.warmup == warmup_of(spec) == 362
    # No constant-copy features: every column varies after the warm-up.
    assert np.all(np.nanstd(x[d.warmup :, :-6], axis=0) > 0)


def test_warmup_is_longest_window():
    d = derive_features(*_bars(500), OhlcvSpec())
    # logret_64 needs 64 previous rows, rvol_96 needs 96 returns, volz_96 needs 96 rows.
    assert d.warmup == 96
    x = np.stack(list(_all(d).values()) + [d.target], axis=1)
    assert np.isfinite(x[96:]).all()
    assert np.isnan(x[95]).any()
    assert warmup_of(OhlcvSpec(return_lags=[200])) == 200
    assert warmup_of(OhlcvSpec(return_lags=[2], volatility_windows=[], volume_windows=[130])) == 129
    only_calendar = OhlcvSpec(
        return_lags=(), volatility_windows=(), volume_windows=(), range_windows=(),
        location_windows=(),
    )  # fmt: skip
    assert warmup_of(only_calendar) == 1  # the target's first row


def test_num_features_rules():
    obs, known = feature_names(OhlcvSpec(num_features=10))
    assert len(obs) == 5 and obs == feature_names(OhlcvSpec())[0][:5]
    assert feature_names(OhlcvSpec(num_features=5)) == ([], list(KNOWN_CALENDAR))
    assert len(feature_names(OhlcvSpec(num_features=7, calendar=False))[0]) == 7
    with pytest.raises(ConfigError):
        OhlcvSpec(num_features=4)
    with pytest.raises(ConfigError):
        OhlcvSpec(num_features=10_000)
    # Deterministic and grows by prefix.
    a = feature_names(OhlcvSpec(num_features=100))[0]
    b = feature_names(OhlcvSpec(num_features=120))[0]
    assert b[:95] == a


def test_spec_from_config_lists():
    spec = ohlcv_spec(return_lags=[3, 6], volume_windows=[20], num_features=None)
    assert spec.return_lags == (3, 6) and spec.volume_windows == (20,)
    assert hash(spec) == hash(ohlcv_spec(return_lags=(3, 6), volume_windows=(20,)))
    with pytest.raises(ConfigError):
        ohlcv_spec(bogus=1)
    with pytest.raises(ConfigError):
        ohlcv_spec(volume_windows=[1])
    with pytest.raises(ConfigError):
        ohlcv_spec(return_lags=[2, 2])
    with pytest.raises(ConfigError):
        ohlcv_spec(return_lags=[0])


def test_degenerate_inputs_are_guarded():
    n = 200
    t = np.arange(n, dtype=np.int64) * 5 * NS_MIN
    flat = np.full(n, 5000.0)
    d = derive_features(t, flat, flat, flat, flat, np.full(n, 10), OhlcvSpec(momentum_windows=[8]))
    w = d.warmup
    assert np.all(d.observed["volz_12"][w:] == 0)
    assert np.all(d.observed["clv_12"][w:] == 0.5)
    assert np.all(d.observed["range_1"][w:] == 0)
    assert np.all(d.observed["rvol_6"][w:] == 0)
    assert np.all(d.observed["mom_8"][w:] == 0)
    # Short input: everything NaN, warm-up capped at the length.
    short = derive_features(t[:10], flat[:10], flat[:10], flat[:10], flat[:10], np.ones(10))
    assert short.warmup == 10
    assert np.isnan(short.observed["rvol_96"]).all()


def test_input_validation():
    t, o, h, lo, c, v = _bars(50)
    with pytest.raises(DataError):
        derive_features(t, o, h, lo, c[:-1], v, OhlcvSpec())
    bad = c.copy()
    bad[3] = 0.0
    with pytest.raises(DataError):
        derive_features(t, o, h, lo, bad, v, OhlcvSpec())
    d1 = derive_features(t.astype("datetime64[ns]"), o, h, lo, c, v, OhlcvSpec())
    d2 = derive_features(t, o, h, lo, c, v, {"return_lags": [2, 4]})
    assert np.array_equal(d1.known["tod_sin"], d2.known["tod_sin"])


def test_calendar_values():
    day = np.datetime64("2026-03-02", "ns").astype(np.int64)  # Monday
    t = day + np.array([0, 13 * 60 + 30, 20 * 60, 21 * 60, 6 * 60, 4 * 1440 + 12 * 60]) * NS_MIN
    p = np.full(t.shape, 5000.0)
    k = derive_features(t, p, p, p, p, np.ones(t.shape), OhlcvSpec()).known
    tod = 2 * np.pi * np.array([0, 810, 1200]) / 1440
    np.testing.assert_allclose(k["tod_sin"][:3], np.sin(tod), atol=1e-6)
    np.testing.assert_allclose(k["tod_cos"][0], 1.0)
    np.testing.assert_allclose(k["dow_sin"][0], 0.0, atol=1e-7)  # Monday
    np.testing.assert_allclose(k["dow_cos"][0], 1.0)
    np.testing.assert_allclose(k["dow_sin"][5], np.sin(2 * np.pi * 4 / 7), rtol=1e-6)  # Friday
    # 00:00 is 4 h after the previous close; 06:00 is 10 h after it; Friday 12:00 is 8 h before.
    expected = np.array([-240, 390, 0, -60, -600, 480]) / 720
    np.testing.assert_allclose(k["to_cash_close"], expected, rtol=1e-5, atol=1e-7)
    for a in k.values():
        assert np.all(np.abs(a) <= 1.0)


def test_speed_225_features_30k_rows():
    bars = _bars(30_000, seed=5)
    spec = OhlcvSpec(num_features=225)
    derive_features(*(a[:1000] for a in bars), spec)  # warm up
    t0 = time.perf_counter()
    d = derive_features(*bars, spec)
    assert time.perf_counter() - t0 < 2.0
    assert len(d.observed) + len(d.known) == 225


def test_on_sample_data():
    from foxhunt.data.samples import es_sample_table

    table = es_sample_table(days=10, seed=1)
    sym = np.asarray(table["symbol"].to_pylist())
    s = sym == sym[0]
    cols = [table[k].to_numpy()[s] for k in ("open", "high", "low", "close", "volume")]
    t = table["timestamp"].to_numpy()[s]
    d = derive_features(t, *cols, OhlcvSpec(num_features=225))
    x = np.stack(list(_all(d).values()), axis=1)[d.warmup :]
    assert np.isfinite(x).all()
    assert np.all((d.observed["clv_12"][d.warmup :] >= 0) & (d.observed["clv_12"][d.warmup :] <= 1))


# --- the exchange's clock (data.calendar) ------------------------------------------------------

# each zone's 2026 changes (a Sunday each) and its cash close
CHANGES = {
    "America/New_York": ("2026-03-08", "2026-11-01", "16:00"),
    "America/Chicago": ("2026-03-08", "2026-11-01", "15:00"),
    "Europe/London": ("2026-03-29", "2026-10-25", "16:30"),
}


def _by_datetime(t: np.ndarray, zone: str, close: str) -> dict[str, np.ndarray]:
    """The calendar features computed one bar at a time with datetime and zoneinfo."""
    h, m = map(int, close.split(":"))
    out = {k: [] for k in KNOWN_CALENDAR}
    for x in t.tolist():
        local = datetime.fromtimestamp(x // 10**9, ZoneInfo(zone))
        s = local.hour * 3600 + local.minute * 60 + local.second
        d = local.weekday()
        out["tod_sin"].append(math.sin(2 * math.pi * s / 86400))
        out["tod_cos"].append(math.cos(2 * math.pi * s / 86400))
        out["dow_sin"].append(math.sin(2 * math.pi * d / 7))
        out["dow_cos"].append(math.cos(2 * math.pi * d / 7))
        out["to_cash_close"].append(((h * 60 + m - s / 60 + 720) % 1440 - 720) / 720)
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("zone", list(CHANGES))
@pytest.mark.parametrize("change", [0, 1], ids=["spring", "autumn"])
def test_calendar_features_are_local_on_both_sides_of_a_change(zone, change):
    """Every 10 minutes from two days before a change to two days after, in three zones: the
    features of datetime and zoneinfo's local time; the close is 0 at the local close on the
    Friday before and the Monday after."""
    day, close = CHANGES[zone][change], CHANGES[zone][2]
    centre = np.datetime64(day, "ns").astype(np.int64)
    t = centre + np.arange(-2 * 144, 2 * 144) * 10 * NS_MIN
    p = np.full(t.shape, 5000.0)
    clock = Clock.of({"time_zone": zone, "close": close})
    got = derive_features(t, p, p, p, p, np.ones(t.shape), OhlcvSpec(), clock).known
    want = _by_datetime(t, zone, close)
    for k in KNOWN_CALENDAR:
        np.testing.assert_allclose(got[k], want[k], atol=2e-6, err_msg=k)
    h, m = map(int, close.split(":"))
    for offset_days in (-2, 1):  # Friday, Monday
        d = date.fromisoformat(day) + timedelta(days=offset_days)
        at = datetime(d.year, d.month, d.day, h, m, tzinfo=ZoneInfo(zone))
        at_close = np.array([int(at.timestamp()) * 10**9])
        assert calendar(at_close, "to_cash_close", clock)[0] == 0.0
        assert calendar(at_close, "dow_cos", clock)[0] == np.float32(
            math.cos(2 * math.pi * d.weekday() / 7)
        )


def _old_calendar(t: np.ndarray, name: str) -> np.ndarray:
    """The calendar features before data.calendar, as they were written (UTC, close 20:00)."""
    day = np.floor_divide(t, 86_400 * 10**9)
    sec = (t - day * 86_400 * 10**9) / 1e9
    if name in ("tod_sin", "tod_cos"):
        tod = 2.0 * np.pi * sec / 86_400.0
        val = np.sin(tod) if name == "tod_sin" else np.cos(tod)
    elif name in ("dow_sin", "dow_cos"):
        dow = 2.0 * np.pi * ((day + 3) % 7) / 7.0
        val = np.sin(dow) if name == "dow_sin" else np.cos(dow)
    else:
        val = (np.mod(1200 - sec / 60.0 + 720.0, 1440.0) - 720.0) / 720.0
    return val.astype(np.float32)


def test_the_utc_clock_is_the_old_calendar_bit_for_bit():
    """No clock, the default one, a config without data.calendar and one with today's defaults:
    the values of the calendar before data.calendar, bit for bit."""
    rng = np.random.default_rng(3)
    t = np.sort(rng.integers(-(10**18), 3 * 10**18, 200_000))
    before = OmegaConf.create({"features": "ohlcv"})  # a checkpoint's config from before it
    clocks = [None, Clock(), clock_of(before), clock_of(OmegaConf.structured(DataConfig))]
    assert clocks[2] == Clock() and clocks[3].time_zone == "UTC" and clocks[3].close_min == 1200
    for k in KNOWN_CALENDAR:
        for clock in clocks:
            assert np.array_equal(calendar(t, k, clock), _old_calendar(t, k)), (k, clock)


def test_local_time_of_millions_of_bars_is_quick():
    """Three million bars over 36 years in New York time: a searchsorted, not a loop per row."""
    t = np.sort(np.random.default_rng(0).integers(0, 2**60, 3_000_000))
    clock = Clock.of({"time_zone": "America/New_York"})
    clock.local(t[:10])  # the zone's transitions, once
    t0 = time.perf_counter()
    local = clock.local(t)
    assert time.perf_counter() - t0 < 1.0
    some = t[::100_000]
    want = [datetime.fromtimestamp(x // 10**9, ZoneInfo("America/New_York")) for x in some.tolist()]
    got = local[::100_000] // 10**9
    assert [datetime.fromtimestamp(g, UTC).replace(tzinfo=None) for g in got.tolist()] == [
        w.replace(tzinfo=None) for w in want
    ]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("time_zone", "Mars/Olympus", "no time zone 'Mars/Olympus'"),
        ("close", "4pm", "calendar close '4pm' is not a time of day HH:MM"),
        ("holidays", ["Christmas"], "calendar holiday 'Christmas' is not an ISO date"),
    ],
)
def test_a_bad_calendar_is_one_config_error(key, value, message):
    cfg = OmegaConf.structured(DataConfig)
    OmegaConf.update(cfg, f"calendar.{key}", value)
    with pytest.raises(ConfigError, match=f"^data.calendar: {message}"):
        clock_of(cfg)
