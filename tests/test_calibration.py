"""A training run's calibration end to end: fitted on its validation windows alone, reported in
summary.json, carried by the best checkpoint and the exports, applied by foxhunt.load."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import foxhunt
from foxhunt.app.train.phases import train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.errors import ConfigError
from foxhunt.files import read_export
from foxhunt.training.checkpoint_io import calibration_of
from tests.helpers import (
    FIVE_MIN,
    T0,
    compose_train,
    make_table,
    tiny_overrides,
    with_,
    write_table,
)

BRIEF = ("model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4")


def _run(tmp_path, name: str, cols: dict, *extra: str) -> dict:
    path = write_table(tmp_path / f"{name}.parquet", cols)
    cfg = compose_train(*tiny_overrides(path, *BRIEF, "trainer.deterministic=true", *extra))
    return train(cfg, tmp_path / name)


@pytest.mark.slow  # 4 CPU-s: the full tier
def test_the_calibration_is_fitted_without_the_test_targets(tmp_path):
    cols = make_table({"AAA": 400, "BBB": 300})
    first = _run(tmp_path, "first", cols)
    test_start = np.datetime64(first["splits"]["cuts"]["test_start"].rstrip("Z"), "ns")
    later = cols["timestamp"] >= test_start.astype(np.int64)
    assert 0 < later.sum() < len(later)
    changed = dict(cols, y=np.where(later, cols["y"] * 3 + 1, cols["y"]))
    second = _run(tmp_path, "second", changed)
    offsets = [
        calibration_of(torch.load(s["best_checkpoint"], weights_only=True))["offsets"]
        for s in (first, second)
    ]
    assert offsets[0] == offsets[1]  # not one offset moved
    assert first["calibration"]["calibration_windows"] > 0
    # while the test figures, which the changed targets enter, did move
    coverage = [s["calibration"]["after"]["intervals"][0]["coverage"] for s in (first, second)]
    assert coverage[0] != coverage[1]


@pytest.mark.slow  # a training of its own: the full tier (#70)
def test_a_run_reports_its_calibration_and_every_file_carries_it(tmp_path):
    summary = _run(tmp_path, "run", make_table({"AAA": 400, "BBB": 400}))
    cal = summary["calibration"]
    assert cal["method"] == "aci" and cal["fitted_on"] == "calibration"  # the defaults
    assert set(cal["methods"]) == {"cqr", "aci"}
    for figures in (cal["before"], cal["after"]):
        outer = figures["intervals"][0]
        assert outer["levels"] == [0.1, 0.9] and outer["nominal"] == 0.8
        assert len(outer["coverage_by_horizon"]) == 4
        assert set(outer["coverage_by_instrument"]) == {"AAA", "BBB"}
        assert {"pinball", "crps", "share_below"} <= set(figures) and outer["width"] > 0
    assert cal["crossing_rate"] == cal["crossing_rate_model"] == 0.0  # monotone by construction
    assert cal["verdict"] in ("better", "worse", "mixed")
    # the forecasts delivered are the calibrated ones, the model's own beside them
    table = pq.read_table(tmp_path / "run" / "test_forecasts.parquet")
    assert {"q0.1", "raw_q0.1", "raw_q0.9"} <= set(table.column_names)
    delivered, raw = table["q0.9"].to_numpy(), table["raw_q0.9"].to_numpy()
    assert not np.allclose(delivered, raw)
    np.testing.assert_array_equal(table["q0.5"].to_numpy(), table["raw_q0.5"].to_numpy())

    stored = calibration_of(torch.load(summary["best_checkpoint"], weights_only=True))
    assert stored["offsets"]["*"] == cal["offsets_by_horizon"]
    assert read_export(summary["export"])[1]["calibration"] == json.loads(json.dumps(stored))
    for source in (summary["best_checkpoint"], summary["export"]):
        predictor = foxhunt.load(source)
        assert predictor.calibration.method == "aci"
        assert predictor.calibration.offsets["*"].tolist() == stored["offsets"]["*"]


@pytest.mark.slow  # 5 CPU-s: its own training (#70)
def test_calibration_none_delivers_the_model_s_own_quantiles(tmp_path):
    summary = _run(tmp_path, "run", make_table({"AAA": 400}), "calibration.method=none")
    table = pq.read_table(tmp_path / "run" / "test_forecasts.parquet")
    np.testing.assert_array_equal(table["q0.9"].to_numpy(), table["raw_q0.9"].to_numpy())
    cal = summary["calibration"]
    assert cal["method"] == "none" and cal["after"] == cal["before"]
    assert "cqr" in cal["methods"]  # what it would have done, for the user to judge


@pytest.mark.parametrize(
    "override,message",
    [("calibration.gamma=0", "calibration.gamma"), ("calibration.min_windows=0", "min_windows")],
)
def test_bad_calibration_settings_are_one_line(tmp_path, override, message):
    path = write_table(tmp_path / "bars.parquet", make_table({"AAA": 100}))
    with pytest.raises(ConfigError, match=message):
        train(compose_train(*tiny_overrides(path, override)), tmp_path / "run")


@pytest.mark.slow  # 9 CPU-s: its own training (#70)
def test_a_calibration_share_is_held_out_of_validation_and_fits_the_calibration(tmp_path):
    """data.calibration_share: the last share of the validation dates' windows are the
    calibration windows alone (after every window validation keeps, none in both, the embargo
    between them in neither); early stopping sees the rest, the calibration is fitted on them
    and says so everywhere."""
    cols = make_table({"AAA": 400, "BBB": 300})
    path = write_table(tmp_path / "bars.parquet", cols)
    cfg = compose_train(*tiny_overrides(path, "data.calibration_share=0.4"))
    whole = ParquetDataModule(compose_train(*tiny_overrides(path, "data.calibration_share=0")).data)
    held = ParquetDataModule(cfg.data)
    whole.setup()
    held.setup()
    val, cal = held.datasets["val"], held.datasets["calibration"]
    embargoed = len(whole.datasets["val"]) - len(val) - len(cal)  # the windows across the cut
    assert 0 < embargoed <= 2 * (whole.cfg.prediction_length - 1) and len(val) and len(cal)
    first = {k: d.target_times(np.arange(len(d)))[:, 0] for k, d in (("val", val), ("cal", cal))}
    assert first["val"].max() < first["cal"].min()
    assert len(held.val_dataloader(sharded=False).dataset) == len(val)
    summary = _run(tmp_path, "run", cols, "data.calibration_share=0.4")
    assert summary["calibration"]["fitted_on"] == "calibration"
    assert summary["calibration"]["calibration_windows"] == len(cal)
    stored = calibration_of(torch.load(summary["best_checkpoint"], weights_only=True))
    assert stored["fitted_on"] == "calibration"
    with pytest.raises(ConfigError, match="data.calibration_share must be in"):
        train(compose_train(*tiny_overrides(path, "data.calibration_share=1")), tmp_path / "x")


# name: (first bar, last bar, bars missing); the timeline is 1000 bars, validation targets from
# bar 600 to before 796, so half of them held out starts the calibration period near bar 697
HISTORIES = {
    "FULL": (0, 1000, ()),
    "LATE": (650, 1000, ()),  # listed in the validation period
    "GAP": (0, 1000, range(690, 720)),  # a gap across the cut
    "GONE": (0, 705, ()),  # delisted just after it
}


@pytest.mark.parametrize("lazy", [False, True])
def test_no_validation_target_falls_in_the_calibration_period(tmp_path, data_cfg, lazy):
    """Over the whole panel, whatever each instrument's history: every validation target lies
    before the calibration period's first target, and only the windows straddling the cut (the
    embargo: prediction_length - 1 of a gapless series) are in neither set."""
    cols = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, (a, b, missing) in HISTORIES.items():
        bars = np.setdiff1d(np.arange(a, b), np.asarray(missing, np.int64))
        cols["timestamp"].append(T0 + FIVE_MIN * bars)
        cols["symbol"].append(np.full(len(bars), symbol))
        for c in ("f1", "f2", "k1", "y"):
            cols[c].append(np.random.default_rng(len(bars)).normal(size=len(bars)))
    path = write_table(tmp_path / "panel.parquet", {k: np.concatenate(v) for k, v in cols.items()})
    cfg = with_(data_cfg, path=str(path), lazy=lazy, cache_dir=str(tmp_path / "cache"))
    whole = ParquetDataModule(with_(cfg, calibration_share=0.0))
    held = ParquetDataModule(with_(cfg, calibration_share=0.5))
    whole.setup()
    held.setup()

    def targets(ds) -> np.ndarray:
        return ds.target_times(np.arange(len(ds)))

    val, cal = targets(held.datasets["val"]), targets(held.datasets["calibration"])
    cut = np.datetime64(held.splits["cuts"]["calibration_start"][:-1], "ns").astype(np.int64)
    assert cal[:, 0].min() == cut and val.max() < cut
    every = targets(whole.datasets["val"])
    assert len(val) == (every[:, -1] < cut).sum() and len(cal) == (every[:, 0] >= cut).sum()
    names = np.array(whole.datasets["val"].series.names)[whole.datasets["val"].window_series()]
    straddling = (every[:, 0] < cut) & (every[:, -1] >= cut)
    assert set(names[straddling]) == {"FULL", "LATE", "GAP", "GONE"}
    assert (names[straddling] == "FULL").sum() == cfg.prediction_length - 1
