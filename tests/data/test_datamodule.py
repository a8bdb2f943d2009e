"""ParquetDataModule: windows, splits, normalization and every bad input it must name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.errors import CheckpointError, DataError
from tests.conftest import make_table, with_, write_table


def setup(cfg) -> ParquetDataModule:
    dm = ParquetDataModule(cfg)
    dm.setup()
    return dm


def test_window_counts_and_boundaries(data_cfg):
    dm = setup(data_cfg)
    E, H = data_cfg.encoder_length, data_cfg.prediction_length
    expected = {"train": 0, "val": 0, "test": 0}
    for n in (300, 200):  # AAA, BBB
        n_test, n_val = round(n * 0.2), round(n * 0.2)
        n_train = n - n_val - n_test
        expected["train"] += n_train - E - H + 1
        expected["val"] += n_val - H + 1
        expected["test"] += n_test - H + 1
    assert {s: len(dm.datasets[s]) for s in expected} == expected

    for split, ds in dm.datasets.items():
        rows = ds.starts[:, None] + torch.arange(E + H)
        groups = ds.group[rows]
        assert (groups == groups[:, :1]).all(), f"a {split} window crosses an instrument"


def test_no_target_leakage_across_splits(data_cfg):
    dm = setup(data_cfg)
    E, H = data_cfg.encoder_length, data_cfg.prediction_length
    # AAA occupies rows [0, 300): train rows [0, 180), val [180, 240), test [240, 300)
    for split, (lo, hi) in {"train": (0, 180), "val": (180, 240), "test": (240, 300)}.items():
        starts = dm.datasets[split].starts
        starts = starts[starts < 300 - E - H + 1]
        decoder_rows = starts[:, None] + E + torch.arange(H)
        assert decoder_rows.min() >= lo and decoder_rows.max() < hi, split


def test_normalization_uses_train_rows_only(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f2"][250:300] += 1000.0  # a shift inside AAA's test rows only
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "shift.parquet", cols)))
    dm = setup(cfg)
    train = np.r_[0:180, 300:420]
    f2 = dm.schema.encoder_columns.index("f2")
    assert dm.schema.input_mean[f2] == pytest.approx(cols["f2"][train].mean())
    assert dm.schema.input_std[f2] == pytest.approx(cols["f2"][train].std())
    assert dm.schema.input_mean[f2] < 100


def test_batch_matches_rows(data_cfg):
    dm = setup(data_cfg)
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
    schema = setup(data_cfg).schema
    assert schema.observed == ["f1", "f2"] and schema.known == ["k1"]
    assert schema.encoder_columns == ["y", "f1", "f2", "k1"]
    assert schema.groups == ["AAA", "BBB"] and schema.num_features == 3


def test_features_all_takes_numeric_columns(data_cfg):
    schema = setup(with_(data_cfg, features="all", known_features=[])).schema
    assert schema.observed == ["f1", "f2", "k1"]


def test_directory_of_files(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    folder = tmp_path / "parts"
    folder.mkdir()
    for symbol in ("AAA", "BBB"):
        part = {k: v[cols["symbol"] == symbol] for k, v in cols.items()}
        write_table(folder / f"{symbol}.parquet", part)
    assert len(setup(with_(data_cfg, path=str(folder))).datasets["train"]) > 0


def test_ohlcv_features_on_sample(es_sample, data_cfg):
    cfg = with_(
        data_cfg,
        path=str(es_sample),
        target=None,
        features="ohlcv",
        known_features=[],
        encoder_length=32,
        prediction_length=4,
    )
    dm = setup(cfg)
    assert dm.schema.target == "log_return" and dm.schema.target_kind == "return"
    assert dm.schema.target_center == 0.0  # a zero return stays zero after scaling
    assert len(dm.schema.known) > 0
    batch = next(iter(dm.train_dataloader()))
    assert torch.isfinite(batch["encoder_cont"]).all()


# ---- bad input: one clear error naming the problem ----


def test_missing_file(data_cfg):
    with pytest.raises(DataError, match="data file not found: .*nope.parquet"):
        setup(with_(data_cfg, path="/nonexistent/nope.parquet"))


def test_not_parquet(tmp_path, data_cfg):
    bogus = tmp_path / "bars.parquet"
    bogus.write_text("timestamp,close\n1,2\n")
    with pytest.raises(DataError, match="cannot read .* as Parquet"):
        setup(with_(data_cfg, path=str(bogus)))


@pytest.mark.parametrize(
    "change, column",
    [
        ({"target": "close"}, "close"),
        ({"time_column": "ts"}, "ts"),
        ({"features": ["f1", "f9"]}, "f9"),
    ],
)
def test_missing_column(data_cfg, change, column):
    with pytest.raises(DataError, match=f"missing column\\(s\\) {column} in"):
        setup(with_(data_cfg, **change))


def test_nan_is_an_error_naming_column_and_count(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["f1"][[10, 20, 30]] = np.nan
    cols["f1"][40] = np.inf
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "nan.parquet", cols)))
    with pytest.raises(DataError, match=r"NaN/inf values in instrument AAA: 'f1' \(4\)"):
        setup(cfg)
    assert len(setup(with_(cfg, nan_policy="drop")).datasets["train"]) == 159 + 101
    ffilled = setup(with_(cfg, nan_policy="ffill"))
    assert len(ffilled.datasets["train"]) == 161 + 101


def test_unsorted_time(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["timestamp"][[50, 51]] = cols["timestamp"][[51, 50]]
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "unsorted.parquet", cols)))
    with pytest.raises(DataError, match="not strictly increasing in instrument AAA at its row 51"):
        setup(cfg)


def test_instrument_too_short(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 30})
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "short.parquet", cols)))
    with pytest.raises(DataError, match="instrument BBB is too short: 30 usable rows"):
        setup(cfg)


def test_non_numeric_feature(tmp_path, data_cfg):
    cols = make_table({"AAA": 300})
    table = pa.table({**{k: v for k, v in cols.items()}, "f1": pa.array(cols["f1"].astype(str))})
    pq.write_table(table, tmp_path / "text.parquet")
    with pytest.raises(DataError, match="column 'f1' is string, expected a numeric column"):
        setup(with_(data_cfg, path=str(tmp_path / "text.parquet")))


def test_schema_mismatch_names_missing_and_extra(tmp_path, data_cfg):
    trained = setup(data_cfg).schema
    other = with_(data_cfg, features=["f1", "k1"], known_features=[])
    with pytest.raises(CheckpointError, match="missing from the data: f2; extra in the data: none"):
        ParquetDataModule(other, schema=trained).setup()


def test_fixed_schema_reuses_normalization(tmp_path, data_cfg):
    trained = setup(data_cfg).schema
    cols = make_table({"AAA": 300, "BBB": 200}, seed=7)
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "new.parquet", cols)))
    dm = ParquetDataModule(cfg, schema=trained)
    dm.setup()
    assert dm.schema.input_mean == trained.input_mean


def test_reads_only_needed_columns(tmp_path, data_cfg):
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["junk"] = np.array(["x"] * 500)  # unreadable as a feature, but never projected
    cfg = with_(data_cfg, path=str(write_table(tmp_path / "extra.parquet", cols)))
    assert setup(cfg).schema.observed == ["f1", "f2"]
    assert Path(cfg.path).exists()
