"""ParquetDataModule: windows, splits, normalization and every bad input it must name."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from foxhunt_serve import TIME_UNITS
from foxhunt_serve.features import calendar

from foxhunt.app.report.markdown import data_section as _data_section
from foxhunt.config import CalendarConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.features import KNOWN_CALENDAR, clock_of
from foxhunt.data.read import load_table
from foxhunt.data.splits import iso_time
from foxhunt.errors import CheckpointError, ConfigError, DataError
from tests.helpers import FIVE_MIN, T0, make_table, ohlcv_cfg, with_, write_table


def set_up(cfg) -> ParquetDataModule:
    dm = ParquetDataModule(cfg)
    dm.setup()
    return dm


def test_window_counts_and_boundaries(data_cfg):
    dm = set_up(with_(data_cfg, calibration_share=0.0))  # validation whole
    E, H = data_cfg.encoder_length, data_cfg.prediction_length
    # both start at T0 (300 and 200 bars): the common timeline is AAA's 300 times, cut at
    # 60% and 80%; the embargo (H bars of the timeline) before each cut holds no target
    expected = {"train": 0, "val": 0, "test": 0}
    for n in (300, 200):  # AAA, BBB
        for split, (first, end) in {
            "train": (0, min(180 - H, n)),
            "val": (min(180, n), min(240 - H, n)),
            "test": (min(240, n), n),
        }.items():
            expected[split] += max(end - E - H + 1 - max(first - E, 0), 0)
    assert {s: len(dm.datasets[s]) for s in expected} == expected
    assert dm.splits["instruments"]["BBB"]["test"] is None  # BBB ends before the test period

    for split, ds in dm.datasets.items():
        rows = ds.starts[:, None] + torch.arange(E + H)
        groups = ds.group[rows]
        assert (groups == groups[:, :1]).all(), f"a {split} window crosses an instrument"


def staggered_panel(tmp_path: Path, data_cfg):
    """Four instruments with different histories on one 5-minute grid, as futures contracts
    overlap: each starts and ends at its own time, one has a gap of a day."""
    rng = np.random.default_rng(1)
    spans = {"AAA": (0, 400), "BBB": (150, 700), "CCC": (380, 1000), "DDD": (0, 1000)}
    cols = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, (a, b) in spans.items():
        bars = np.arange(a, b)
        if symbol == "DDD":
            bars = bars[(bars < 500) | (bars >= 500 + 288)]  # a day without bars
        cols["timestamp"].append(T0 + FIVE_MIN * bars)
        cols["symbol"].append(np.full(len(bars), symbol))
        for c in ("f1", "f2", "k1"):
            cols[c].append(rng.normal(size=len(bars)))
        cols["y"].append(rng.normal(size=len(bars)))
    cols = {k: np.concatenate(v) for k, v in cols.items()}
    return with_(data_cfg, path=str(write_table(tmp_path / "staggered.parquet", cols))), cols


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("embargo", [None, 0, 7])
def test_no_window_has_a_target_in_another_splits_period(tmp_path, data_cfg, lazy, embargo):
    """Over the whole panel: every target of a split's windows lies in that split's period
    (less the embargo before each cut), whatever the instrument's history."""
    cfg, cols = staggered_panel(tmp_path, data_cfg)
    cfg = with_(cfg, lazy=lazy, split=with_(cfg.split, embargo=embargo), cache_dir=str(tmp_path))
    dm = set_up(cfg)
    E, H = cfg.encoder_length, cfg.prediction_length
    cuts = {k: np.datetime64(v[:-1], "ns") for k, v in dm.splits["cuts"].items() if v and "_" in k}
    assert dm.splits["cuts"]["embargo"] == (H if embargo is None else embargo)
    # each row's time, in the order of the store (instruments sorted by name, then time)
    order = np.lexsort((cols["timestamp"], cols["symbol"]))
    times = cols["timestamp"][order].astype("datetime64[ns]")
    symbols = cols["symbol"][order]
    timeline = np.unique(times)
    # the embargo: that many distinct times of the panel before each cut
    for end, start in (("train_end", "val_start"), ("val_end", "test_start")):
        i = np.searchsorted(timeline, cuts[start])
        assert cuts[end] == timeline[i - dm.splits["cuts"]["embargo"]], end
    periods = {
        "train": (timeline[0], cuts["train_end"]),
        "val": (cuts["val_start"], cuts["val_end"]),
        "test": (cuts["test_start"], timeline[-1] + 1),
    }
    for split, (lo, hi) in periods.items():
        starts = dm.datasets[split].starts.numpy()
        assert len(starts) > 0, split
        targets = starts[:, None] + E + np.arange(H)
        assert (symbols[targets] == symbols[starts][:, None]).all()
        assert ((times[targets] >= lo) & (times[targets] < hi)).all(), split
    # what summary.json records: each instrument's first and last target time per split
    spans = dm.splits["instruments"]
    assert spans["AAA"]["val"] is None and spans["BBB"]["test"] is None  # ended before
    assert spans["DDD"]["test"][1] == iso_time(int(times[symbols == "DDD"][-1].astype(np.int64)))


def test_explicit_cuts_and_a_split_left_empty(data_cfg):
    split = with_(data_cfg.split, val_start="2026-01-05T12:00", test_start="2026-01-05T20:00")
    dm = set_up(with_(data_cfg, split=split, calibration_share=0.0))
    assert dm.splits["cuts"] == {
        "val_start": "2026-01-05T12:00:00Z",
        "test_start": "2026-01-05T20:00:00Z",
        "embargo": 4,
        "train_end": "2026-01-05T11:40:00Z",  # 4 bars before
        "val_end": "2026-01-05T19:40:00Z",
        "train_start": None,
        "test_end": None,
    }
    assert dm.splits["instruments"]["AAA"]["val"][0] == "2026-01-05T12:00:00Z"  # bar 144
    # a walk-forward fold: training targets from train_start, the test period ends at test_end
    fold = with_(split, train_start="2026-01-05T04:00", test_end="2026-01-05T22:00")
    spans = set_up(with_(data_cfg, split=fold)).splits["instruments"]["AAA"]
    assert spans["train"][0] == "2026-01-05T04:00:00Z"
    assert spans["test"] == ["2026-01-05T20:00:00Z", "2026-01-05T21:55:00Z"]
    late = with_(data_cfg, split=with_(split, test_start="2027-01-01"))  # after the data
    with pytest.raises(DataError, match="^the test split has no complete window .*test from "):
        set_up(late)


def test_normalization_uses_train_rows_only(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f2"][250:300] += 1000.0  # a shift inside AAA's test rows only
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "shift.parquet", cols)))
    dm = set_up(cfg)
    train = np.r_[0:180, 300:480]  # the rows before the validation period, of both
    f2 = dm.schema.encoder_columns.index("f2")
    assert dm.schema.input_mean[f2] == pytest.approx(cols["f2"][train].mean())
    assert dm.schema.input_std[f2] == pytest.approx(cols["f2"][train].std())
    assert dm.schema.input_mean[f2] < 100


def test_batch_matches_rows(data_cfg):
    dm = set_up(data_cfg)
    ds = dm.datasets["val"]
    batch = ds.__getitems__([0, 5])
    E, H = data_cfg.encoder_length, data_cfg.prediction_length
    s = int(ds.starts[5])
    assert torch.equal(batch["encoder_cont"][1], ds.inputs[s : s + E])
    assert torch.equal(batch["decoder_known"][1], ds.inputs[s + E : s + E + H, -1:])
    assert torch.equal(batch["target"][1], ds.inputs[s + E : s + E + H, 0])
    assert batch["encoder_cont"].dtype == torch.float32
    assert batch["static_cat"].shape == (2, 1)
    loader = dm.train_dataloader()
    first = next(iter(loader))
    assert first["encoder_cont"].shape == (8, E, 1 + 2 + 1)


def test_schema_roles(data_cfg):
    schema = set_up(data_cfg).schema
    assert schema.observed == ["f1", "f2"] and schema.known == ["k1"]
    assert schema.encoder_columns == ["y", "f1", "f2", "k1"]
    assert schema.groups == ["AAA", "BBB"] and schema.num_features == 3


def test_features_all_takes_numeric_columns(data_cfg):
    schema = set_up(with_(data_cfg, features="all", known_features=[])).schema
    assert schema.observed == ["f1", "f2", "k1"]


def test_directory_of_files(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    folder = tmp_path / "parts"
    folder.mkdir()
    for symbol in ("AAA", "BBB"):
        part = {k: v[cols["symbol"] == symbol] for k, v in cols.items()}
        write_table(folder / f"{symbol}.parquet", part)
    assert len(set_up(with_(data_cfg, path=str(folder))).datasets["train"]) > 0


def test_ohlcv_features_on_sample(es_sample, data_cfg):
    cfg = ohlcv_cfg(data_cfg, es_sample)
    dm = set_up(cfg)
    assert dm.schema.target == "log_return" and dm.schema.target_kind == "return"
    assert dm.schema.target_center == 0.0  # a zero return stays zero after scaling
    assert len(dm.schema.known) > 0
    batch = next(iter(dm.train_dataloader()))
    assert torch.isfinite(batch["encoder_cont"]).all()


def test_extra_features_ride_beside_the_derived_ones(tmp_path, es_sample, data_cfg):
    # a researcher's signal column next to data.features=ohlcv: the last observed input, its
    # rows the file's (after the derived features' warm-up), in memory and in the lazy store
    table = pq.read_table(es_sample)
    table = table.filter(pc.equal(table["symbol"], "ESH6"))  # one instrument: rows in order
    pq.write_table(table, tmp_path / "one.parquet")
    signal = np.random.default_rng(0).normal(size=table.num_rows)
    path = tmp_path / "signal.parquet"
    pq.write_table(table.append_column("my_signal", pa.array(signal)), path)
    plain = set_up(ohlcv_cfg(data_cfg, tmp_path / "one.parquet"))
    for lazy in (False, True):
        dm = set_up(with_(ohlcv_cfg(data_cfg, path), extra_features=["my_signal"], lazy=lazy))
        assert dm.schema.observed == [*plain.schema.observed, "my_signal"]
        got, want = dm.datasets["train"].inputs, plain.datasets["train"].inputs
        k = len(dm.schema.observed)  # [target, observed..., known...]: the last observed one
        others = torch.cat([got[:, :k], got[:, k + 1 :]], dim=1)
        assert torch.equal(others, want), f"lazy={lazy}"  # the derived ones unchanged
        # normalized, the file's values after the warm-up rows (one instrument in this slice)
        column = got[:, k].double().numpy()
        assert np.corrcoef(column, signal[-len(column) :])[0, 1] > 1 - 1e-6


# ---- bad input: one clear error naming the problem ----


@pytest.mark.parametrize(
    ("extra", "kind", "message"),
    [
        (["nope"], DataError, "missing column(s) nope in "),
        (["symbol"], ConfigError, "data.extra_features names 'symbol', which is the group column"),
        (["clv_1"], ConfigError, "data.extra_features names 'clv_1', which is a derived feature"),
        (["timestamp"], ConfigError, "data.extra_features names 'timestamp', which is the time"),
    ],
)
def test_extra_features_bad_names(es_sample, data_cfg, extra, kind, message):
    with pytest.raises(kind) as err:
        set_up(with_(ohlcv_cfg(data_cfg, es_sample), extra_features=extra))
    assert message in str(err.value)


def test_missing_file(data_cfg):
    with pytest.raises(DataError, match="data file not found: .*nope.parquet"):
        set_up(with_(data_cfg, path="/nonexistent/nope.parquet"))


def test_not_parquet(tmp_path, data_cfg):
    bogus = tmp_path / "bars.parquet"
    bogus.write_text("timestamp,close\n1,2\n")
    with pytest.raises(DataError, match="cannot read .* as Parquet"):
        set_up(with_(data_cfg, path=str(bogus)))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"target": "close"}, "missing column\\(s\\) close in"),
        ({"time_column": "ts"}, "no time column 'ts' in .* add data.time_column=NAME"),
        ({"features": ["f1", "f9"]}, "missing column\\(s\\) f9 in"),
    ],
)
def test_missing_column(data_cfg, change, message):
    with pytest.raises(DataError, match=message):
        set_up(with_(data_cfg, **change))


def test_nan_is_an_error_naming_column_and_count(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f1"][[10, 20, 30]] = np.nan
    cols["f1"][40] = np.inf
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "nan.parquet", cols)))
    with pytest.raises(DataError, match=r"NaN/inf values in instrument AAA: 'f1' \(4\)"):
        set_up(cfg)
    # training windows of an instrument: its bars before the validation period (180 of both;
    # AAA 176 once 4 are dropped) less the embargo (4) and one window's span less one (19)
    assert len(set_up(with_(cfg, nan_policy="drop")).datasets["train"]) == 153 + 157
    ffilled = set_up(with_(cfg, nan_policy="ffill"))
    assert len(ffilled.datasets["train"]) == 157 + 157


def test_unsorted_time(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["timestamp"][[50, 51]] = cols["timestamp"][[51, 50]]
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "unsorted.parquet", cols)))
    with pytest.raises(DataError, match="not strictly increasing in instrument AAA at its row 51"):
        set_up(cfg)


def test_a_time_given_twice_is_named_with_its_instrument(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["timestamp"][51] = cols["timestamp"][50]
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "twice.parquet", cols)))
    when = f"{np.datetime64(int(cols['timestamp'][50]), 'ns').astype('datetime64[s]')}Z"
    with pytest.raises(DataError, match=rf"instrument AAA has two rows at {when} \(its rows 50 "):
        set_up(cfg)


def test_an_instrument_without_windows_in_a_split_is_said_once(tmp_path, data_cfg, caplog):
    cols = make_table({"AAA": 300, "BBB": 12})  # BBB: 12 bars, too few for one window
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "short.parquet", cols)))
    with caplog.at_level(logging.INFO, logger="foxhunt.data.datamodule"):
        dm = set_up(cfg)
    said = [r.getMessage() for r in caplog.records if "BBB" in r.getMessage()]
    assert said == [f"data: no {split} windows for BBB" for split in ("train", "val", "test")]
    assert dm.splits["instruments"]["BBB"] == {"train": None, "val": None, "test": None}


def test_non_numeric_feature(tmp_path, data_cfg):
    cols = make_table({"AAA": 300})
    table = pa.table({**{k: v for k, v in cols.items()}, "f1": pa.array(cols["f1"].astype(str))})
    pq.write_table(table, tmp_path / "text.parquet")
    with pytest.raises(DataError, match="column 'f1' is string, expected a numeric column"):
        set_up(with_(data_cfg, path=str(tmp_path / "text.parquet"), time_unit="ns"))


def test_schema_mismatch_names_missing_and_extra(tmp_path, data_cfg):
    trained = set_up(data_cfg).schema
    other = with_(data_cfg, features=["f1", "k1"], known_features=[])
    with pytest.raises(CheckpointError, match="missing from the data: f2; extra in the data: none"):
        ParquetDataModule(other, schema=trained).setup()


def test_fixed_schema_reuses_normalization(tmp_path, data_cfg):
    trained = set_up(data_cfg).schema
    cols = make_table({"AAA": 300, "BBB": 200}, seed=7)
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "new.parquet", cols)))
    dm = ParquetDataModule(cfg, schema=trained)
    dm.setup()
    assert dm.schema.input_mean == trained.input_mean


def test_reads_only_needed_columns(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["junk"] = np.array(["x"] * 500)  # unreadable as a feature, but never projected
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "extra.parquet", cols)))
    assert set_up(cfg).schema.observed == ["f1", "f2"]
    assert Path(cfg.path).exists()


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("policy", ["drop", "ffill"])
def test_an_instrument_with_nothing_left_is_named(tmp_path, data_cfg, policy, lazy):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f1"][cols["symbol"] == "BBB"] = np.nan  # not left out without a word
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "empty.parquet", cols)), lazy=lazy)
    with pytest.raises(
        DataError, match=f"^instrument BBB has no rows left after data.nan_policy={policy}"
    ):
        set_up(with_(cfg, nan_policy=policy, cache_dir=str(tmp_path / "cache")))


def test_integers_beyond_float64_precision_load(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f2"] = np.arange(500, dtype=np.int64) + 2**60  # not all exact in float64
    dm = set_up(with_(data_cfg, path=str(write_table(tmp_path / "big.parquet", cols))))
    assert dm.schema.input_mean[2] == pytest.approx(2.0**60)


@pytest.mark.parametrize(
    "names, groups", [((1.5, 2.0), ["1.5", "2"]), ((True, False), ["false", "true"])]
)
def test_instrument_names_of_any_type(tmp_path, data_cfg, names, groups):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["symbol"] = np.where(cols["symbol"] == "AAA", *names)
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "names.parquet", cols)))
    windows = len(set_up(data_cfg).datasets["train"])
    for lazy in (False, True):  # lazy: one row group of both, sorted out by instrument
        dm = set_up(with_(cfg, lazy=lazy, cache_dir=str(tmp_path / "cache")))
        assert dm.schema.groups == groups
        assert len(dm.datasets["train"]) == windows  # no rows lost
    assert [s.name for s in load_table(pq.read_table(cfg.path), cfg).series] == groups


# ---- integer times: data.time_unit ----

UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def integer_times(es_sample: Path, path: Path, unit: str) -> Path:
    table = pq.read_table(es_sample)
    ns = table["timestamp"].cast(pa.int64()).to_numpy()
    times = pa.array(ns // UNIT_NS[unit])  # int64 in `unit` since 1970
    pq.write_table(table.set_column(0, "timestamp", times), path)
    return path


@pytest.mark.parametrize("unit", list(UNIT_NS))
def test_integer_times_need_their_unit(tmp_path, es_sample, data_cfg, unit):
    path = integer_times(es_sample, tmp_path / "int.parquet", unit)
    cfg = ohlcv_cfg(data_cfg, path)
    with pytest.raises(DataError) as err:
        set_up(cfg)
    assert str(err.value) == (
        "time column 'timestamp' holds integers (int64) of no stated unit: values like "
        f"{pq.read_table(path)['timestamp'][0]} look like {TIME_UNITS[unit]}; "
        f"set data.time_unit={unit} (one of s, ms, us, ns)"
    )
    # in that unit: the same calendar features as the file's timestamps give
    want = set_up(ohlcv_cfg(data_cfg, es_sample)).datasets["train"].inputs
    for lazy in (False, True):
        got = set_up(with_(cfg, time_unit=unit, lazy=lazy)).datasets["train"].inputs
        assert torch.equal(got, want), f"lazy={lazy}"


def test_predict_reads_integer_times_by_the_unit_too(tmp_path, es_sample, data_cfg):
    table = pq.read_table(integer_times(es_sample, tmp_path / "int.parquet", "s"))
    cfg = ohlcv_cfg(data_cfg, tmp_path / "int.parquet")
    with pytest.raises(DataError, match="holds integers .* look like seconds"):
        load_table(table, cfg)
    got = load_table(table, with_(cfg, time_unit="s")).series
    want = load_table(pq.read_table(es_sample), cfg).series
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a.time_ns, b.time_ns) and np.array_equal(a.known, b.known)


def test_times_beyond_the_nanosecond_range(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    seconds = cols["timestamp"] // 10**9 + 40 * 365 * 86_400 * 10**3  # some 40,000 years on
    table = pa.table({**cols, "timestamp": pa.array(seconds).cast(pa.timestamp("s"))})
    pq.write_table(table, tmp_path / "far.parquet")
    with pytest.raises(DataError, match="^time column 'timestamp' has values out of range"):
        set_up(with_(data_cfg, path=str(tmp_path / "far.parquet")))


# ---- values that would overflow float32 ----


@pytest.mark.parametrize("lazy", [False, True])
def test_a_value_beyond_float32_is_named(tmp_path, data_cfg, lazy):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f2"][300 + 7] = 1e300  # BBB's row 7
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "huge.parquet", cols)), lazy=lazy)
    with pytest.raises(DataError) as err:
        set_up(with_(cfg, cache_dir=str(tmp_path / "cache")))
    assert re.fullmatch(
        r"column 'f2' of instrument BBB holds 1e\+300 at its row 7( in .*huge.parquet)?, "
        r"beyond float32's range of \+-3.4e\+38: rescale the column",
        str(err.value),
    )


def test_a_huge_close_is_named_before_features_are_derived(tmp_path, es_sample, data_cfg):
    table = pq.read_table(es_sample)
    close = table["close"].to_numpy().copy()
    close[1000] = 1e300
    pq.write_table(table.set_column(5, "close", pa.array(close)), tmp_path / "es.parquet")
    with pytest.raises(DataError, match=r"^column 'close' of instrument ESH6 holds 1e\+300 at"):
        set_up(ohlcv_cfg(data_cfg, tmp_path / "es.parquet"))


@pytest.mark.parametrize("lazy", [False, True])
def test_a_value_overflowing_once_normalized_is_named(tmp_path, data_cfg, lazy):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f1"] *= 1e-11  # a tiny std in the training rows (AAA's are 0-180) ...
    cols["f1"][290] = 1e30  # ... and, in the test rows, a value that fits float32 raw
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "far.parquet", cols)), lazy=lazy)
    with pytest.raises(DataError, match=r"^column 'f1' of instrument AAA is beyond float32's "):
        set_up(with_(cfg, cache_dir=str(tmp_path / "cache")))


def test_non_finite_statistics_of_a_checkpoint_are_named(data_cfg):
    trained = set_up(data_cfg).schema
    trained.input_std[2] = float("inf")  # what a run on a column holding 1e300 saved
    with pytest.raises(DataError, match=r"statistics of column 'f2' are not finite \(mean"):
        ParquetDataModule(data_cfg, schema=trained).setup()


# ---- data.features=all names what it leaves out ----


@pytest.mark.parametrize("lazy", [False, True])
def test_features_all_names_the_columns_it_skips(tmp_path, data_cfg, caplog, lazy):
    cols = make_table({"AAA": 300, "BBB": 200})
    table = pa.table(
        {
            **cols,
            "timestamp": pa.array(cols["timestamp"], pa.timestamp("ns", tz="UTC")),
            "note": pa.array(cols["f1"].astype(str)),  # numbers stored as text
            "flag": pa.array(cols["timestamp"], pa.timestamp("ns")),
        }
    )
    pq.write_table(table, tmp_path / "mixed.parquet")
    cfg = with_(data_cfg, path=str(tmp_path / "mixed.parquet"), features="all", known_features=[])
    cfg = with_(cfg, lazy=lazy, cache_dir=str(tmp_path / "cache"))
    for _ in range(2):  # lazy: built, then reused
        with caplog.at_level(logging.WARNING, logger="foxhunt.data.datamodule"):
            dm = set_up(cfg)
        assert dm.schema.skipped == {"note": "string", "flag": "timestamp"}
        assert dm.schema.observed == ["f1", "f2", "k1"]
        assert "skipped by data.features=all: note (string), flag (timestamp)" in caplog.text
        caplog.clear()
    assert (
        "- Not numeric, so left out by `data.features=all`: `note` (string), `flag` (timestamp)"
        in _data_section(dm)
    )
    assert set_up(with_(cfg, features=["f1"])).schema.skipped == {}


def test_the_known_inputs_are_the_calendar_of_the_exchange_clock(es_sample, data_cfg):
    """data.calendar.time_zone=America/Chicago: each series' known inputs (what the splits, and
    a backtest's folds, cut windows from) are the calendar in Chicago time; eager and lazy
    give the same windows, and not UTC's."""
    chicago = CalendarConfig(time_zone="America/Chicago", close="15:00")
    cfg = with_(ohlcv_cfg(data_cfg, es_sample), calendar=chicago)
    clock = clock_of(cfg)
    for s in load_table(pq.read_table(es_sample), cfg).series:
        want = np.column_stack([calendar(s.time_ns, k, clock) for k in KNOWN_CALENDAR])
        assert np.array_equal(s.known, want.astype(s.known.dtype)), s.name
    eager = set_up(with_(cfg, lazy=False)).datasets["train"].inputs
    assert torch.equal(set_up(with_(cfg, lazy=True)).datasets["train"].inputs, eager)
    utc = set_up(with_(ohlcv_cfg(data_cfg, es_sample), lazy=False)).datasets["train"].inputs
    assert utc.shape == eager.shape and not torch.equal(utc, eager)
