"""Tests of the synthetic E-mini S&P 500 sample (foxhunt.data.samples)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from foxhunt_serve.clock import Clock

from foxhunt.data import source as source_module
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.samples import ES_TICK, SAMPLE_PATH, es_sample_table, make_es_sample
from foxhunt.data.samples import es as sample_module
from foxhunt.data.samples.es import ZONE
from foxhunt.data.schema import footer_schema
from foxhunt.data.source import ensure_sample
from foxhunt.errors import DataError
from tests.helpers import compose_train, with_


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    path = tmp_path_factory.mktemp("es") / "sub" / "ES_FUT_small.parquet"
    t0 = time.perf_counter()
    out = make_es_sample(path)
    elapsed = time.perf_counter() - t0
    return out, pq.read_table(out), elapsed


def _columns(table: pa.Table) -> dict[str, np.ndarray]:
    cols = {c: table[c].to_numpy() for c in ("open", "high", "low", "close", "volume")}
    cols["timestamp"] = table["timestamp"].cast(pa.int64()).to_numpy()
    cols["symbol"] = np.asarray(table["symbol"].to_pylist())
    return cols


def test_writes_file_and_returns_path(sample):
    path, table, elapsed = sample
    assert path.is_file() and path.name == "ES_FUT_small.parquet"
    assert 15_000 <= table.num_rows <= 30_000
    assert path.stat().st_size < 5_000_000
    assert elapsed < 5.0


def test_schema_exact(sample):
    _, table, _ = sample
    expected = pa.schema(
        [
            ("timestamp", pa.timestamp("ns", tz="UTC")),
            ("symbol", pa.string()),
            ("open", pa.float64()),
            ("high", pa.float64()),
            ("low", pa.float64()),
            ("close", pa.float64()),
            ("volume", pa.int64()),
        ]
    )
    assert table.schema.remove_metadata().equals(expected)


def test_deterministic_for_seed(tmp_path):
    a = pq.read_table(make_es_sample(tmp_path / "a.parquet", days=8, seed=7))
    b = pq.read_table(make_es_sample(tmp_path / "b.parquet", days=8, seed=7))
    c = pq.read_table(make_es_sample(tmp_path / "c.parquet", days=8, seed=8))
    assert a.equals(b)
    assert a.num_rows == c.num_rows
    assert not a.equals(c)
    assert not np.array_equal(a["close"].to_numpy(), c["close"].to_numpy())


def test_symbols_contiguous_and_strictly_increasing(sample):
    _, table, _ = sample
    cols = _columns(table)
    sym = cols["symbol"]
    # Each symbol is one contiguous block, blocks sorted by symbol.
    changes = np.flatnonzero(sym[1:] != sym[:-1]) + 1
    blocks = [sym[0]] + [sym[i] for i in changes]
    assert blocks == sorted(set(blocks))
    assert set(blocks) == {"ESH6", "ESM6", "ESU6"}  # two rolls for data.futures to find
    for s in blocks:
        ts = cols["timestamp"][sym == s]
        assert np.all(np.diff(ts) > 0), s
        assert ts.shape[0] >= 1_500, s


def test_session_calendar(sample):
    """Globex sessions on Chicago's clock (the zone the sample's config names): 17:00 to 16:00
    local, so in UTC the session opens an hour later before the March change than after it."""
    _, table, _ = sample
    ts = _columns(table)["timestamp"]
    local = Clock.of({"time_zone": ZONE}).local(ts)
    day = local // (86_400 * 10**9)
    minute = (local - day * 86_400 * 10**9) // (60 * 10**9)
    weekday = (day + 3) % 7  # Monday = 0
    # Maintenance break 16:00-17:00 Chicago: no bar starts there.
    assert not np.any((minute >= 16 * 60) & (minute < 17 * 60))
    # No Saturday bars; Sunday only from the 17:00 Globex open; Friday ends by 16:00.
    assert not np.any(weekday == 5)
    assert np.all(minute[weekday == 6] >= 17 * 60)
    assert np.all(minute[weekday == 4] < 16 * 60)
    assert np.any(weekday == 6)
    # In UTC: Sunday's open at 23:00 in winter time (March 1), 22:00 in summer time (March 8).
    opens = {str(np.datetime64(int(t), "ns"))[:16] for t in ts[weekday == 6]}
    assert {"2026-03-01T23:00", "2026-03-08T22:00"} <= opens
    # 5-minute grid.
    assert np.all(ts % (5 * 60 * 10**9) == 0)


def test_ohlc_envelope_volume_and_ticks(sample):
    _, table, _ = sample
    c = _columns(table)
    assert np.all(c["high"] >= np.maximum(c["open"], c["close"]))
    assert np.all(c["low"] <= np.minimum(c["open"], c["close"]))
    assert np.all(c["volume"] > 0)
    for k in ("open", "high", "low", "close"):
        ticks = c[k] / ES_TICK
        assert np.all(ticks == np.round(ticks)), k
    assert 4000 < np.median(c["close"]) < 6000
    assert np.any(c["high"] > c["low"])


def test_roll_overlap(sample):
    _, table, _ = sample
    c = _columns(table)
    front, back = c["symbol"] == "ESH6", c["symbol"] == "ESM6"
    common, i_f, i_b = np.intersect1d(
        c["timestamp"][front], c["timestamp"][back], return_indices=True
    )
    bars_per_day = 23 * 12
    assert 5 * bars_per_day <= common.shape[0] <= 8 * bars_per_day
    # Back month at a small calendar-spread premium.
    spread = c["close"][back][i_b] - c["close"][front][i_f]
    rel = spread / c["close"][front][i_f]
    assert np.all(rel > 0.0) and np.all(rel < 0.02)
    # Volume migrates: back month thin at the start of the overlap, dominant at its end.
    vf, vb = c["volume"][front][i_f], c["volume"][back][i_b]
    first, last = slice(0, bars_per_day), slice(-bars_per_day, None)
    assert vb[first].sum() < 0.2 * vf[first].sum()
    assert vf[last].sum() < 0.2 * vb[last].sum()
    # The front contract ends after the overlap, the back contract starts at its beginning.
    assert c["timestamp"][front].max() == common.max()
    assert c["timestamp"][back].min() == common.min()


def test_intraday_seasonality(sample):
    _, table, _ = sample
    c = _columns(table)
    m = c["symbol"] == "ESM6"
    close, ts, vol = c["close"][m], c["timestamp"][m], c["volume"][m]
    r = np.abs(np.diff(np.log(close)))
    minute = (ts[1:] // (60 * 10**9)) % 1440
    cash = (minute >= 13 * 60 + 30) & (minute < 20 * 60)
    night = (minute >= 0) & (minute < 6 * 60)
    assert r[cash].mean() > 1.5 * r[night].mean()
    assert vol[1:][cash].mean() > 3 * vol[1:][night].mean()


def test_daily_volatility_and_clustering(sample):
    _, table, _ = sample
    c = _columns(table)
    m = c["symbol"] == "ESM6"
    r = np.diff(np.log(c["close"][m]))
    daily = np.sqrt(np.sum(r[: (r.size // 276) * 276].reshape(-1, 276) ** 2, axis=1))
    assert 0.004 < np.median(daily) < 0.02
    # Volatility clustering: deseasonalised |r| (divided by its time-of-day mean) stays
    # autocorrelated over several bars.
    slot = (c["timestamp"][m][1:] // (300 * 10**9)) % 288
    count = np.maximum(np.bincount(slot, minlength=288), 1)
    season = np.bincount(slot, np.abs(r), minlength=288) / count
    a = np.abs(r) / season[slot]
    a = a - a.mean()
    for lag in (1, 5, 20):
        assert np.dot(a[:-lag], a[lag:]) / np.dot(a, a) > 0.05, lag


def test_argument_checks():
    with pytest.raises(ValueError):
        es_sample_table(days=0)
    with pytest.raises(ValueError):
        es_sample_table(bar_minutes=7)
    one_min = es_sample_table(days=2, bar_minutes=1)
    assert one_min.num_rows == 2 * 23 * 60


# ---- where the sample may appear, and how ----


def test_a_killed_generation_leaves_no_half_file(tmp_path, monkeypatch):
    write_table = sample_module.pq.write_table

    def killed_midway(table, where, **options):
        write_table(table.slice(0, 10), where)  # a first part written ...
        raise KeyboardInterrupt  # ... and then a Ctrl-C (or any death)

    monkeypatch.setattr(sample_module.pq, "write_table", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        make_es_sample(tmp_path / "ES_FUT_small.parquet", days=1)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temp file


def test_generated_only_at_its_own_path(tmp_path, monkeypatch, data_cfg):
    monkeypatch.chdir(tmp_path)
    made = []
    monkeypatch.setattr(source_module, "make_es_sample", lambda p: made.append(str(p)))
    for same in (SAMPLE_PATH, tmp_path / SAMPLE_PATH, "data/../data/ES_FUT_small.parquet"):
        ensure_sample(same)
    assert made == [SAMPLE_PATH, str(tmp_path / SAMPLE_PATH), "data/../data/ES_FUT_small.parquet"]
    made.clear()
    for other in ("ES_FUT_small.parquet", "data/ES_FUT_small.parquet.bak", tmp_path / "nope"):
        ensure_sample(other)
    assert made == []


def test_a_mistyped_path_is_not_found_not_generated(tmp_path, monkeypatch, data_cfg):
    monkeypatch.chdir(tmp_path)
    cfg = with_(data_cfg, path=str(tmp_path / "nope.parquet"), generate_if_missing=True)
    with pytest.raises(DataError, match=r"^data file not found: .*/nope.parquet$"):
        ParquetDataModule(cfg).setup()
    with pytest.raises(DataError, match=r"^data file not found: .*/nope.parquet$"):
        footer_schema(cfg)  # what the memory estimator reads first
    assert [p.name for p in tmp_path.iterdir()] == ["bars.parquet"]  # data_cfg's own file


def test_the_default_config_points_at_the_sample():
    assert compose_train().data.path == SAMPLE_PATH


def test_the_default_config_reads_the_sample_as_one_continuous_es(sample):
    # data.futures is on for the sample: one instrument, rolled where the volume crosses over
    cfg = compose_train(f"data.path={sample[0]}", "data.encoder_length=32").data
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert dm.schema.groups == ["ES"]
    rolls = [
        (r.from_id, r.to_id, str(np.datetime64(r.time_ns, "ns").astype("datetime64[D]")))
        for r in dm.rolls
    ]
    # the Globex session of 2026-03-12 opens on the 11th, 22:00 UTC: the crossover's session
    assert rolls == [("ESH6", "ESM6", "2026-03-11"), ("ESM6", "ESU6", "2026-06-10")]
    assert all(1.004 < r.factor < 1.01 for r in dm.rolls)  # the calendar spread, ~0.75%
