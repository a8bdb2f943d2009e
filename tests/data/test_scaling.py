"""Each instrument's target on its own scale (data.target_scale=instrument, the default on a
panel; foxhunt_serve.scaling): from its own training rows, with the pooled scale for a short or
missing history, the same on both data paths, seen by the model as a static input, and the
forecasts back in each instrument's units."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from foxhunt_serve.scaling import FLOOR, MIN_ROWS, SCALE_INPUT, of_instruments

import foxhunt
from foxhunt.app.train.phases import train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.serving import target_section
from tests.data.test_lazy import assert_same
from tests.helpers import FIVE_MIN, T0, compose_train, tiny_overrides, with_, write_table

# name: (first bar, last bar, the std of its returns); the timeline is 1000 bars, cut at 60%
# (train) and 80% (test): QUIET and LOUD trade throughout, LATE lists in the test period (no
# training rows), SHORT has MIN_ROWS - 10 training rows, HALTED barely moves
PANEL = {
    "QUIET": (0, 1000, 0.001),
    "LOUD": (0, 1000, 0.008),
    "LATE": (850, 1000, 0.004),
    "SHORT": (600 - MIN_ROWS + 10, 1000, 0.004),
    "HALTED": (0, 1000, 1e-7),
}


def panel(tmp_path: Path, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """Returns `y` with each instrument's own volatility, and noise features, on one grid."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, (a, b, vol) in PANEL.items():
        bars = np.arange(a, b)
        cols["timestamp"].append(T0 + FIVE_MIN * bars)
        cols["symbol"].append(np.full(len(bars), symbol))
        for c in ("f1", "f2"):
            cols[c].append(rng.normal(size=len(bars)))
        cols["k1"].append(np.sin(bars / 10))
        cols["y"].append(rng.normal(size=len(bars)) * vol)
    cols = {k: np.concatenate(v) for k, v in cols.items()}
    return write_table(tmp_path / "panel.parquet", cols), cols


def set_up(cfg) -> ParquetDataModule:
    dm = ParquetDataModule(cfg)
    dm.setup()
    return dm


@pytest.fixture
def returns_cfg(data_cfg):
    return with_(data_cfg, target_kind="return", val_fraction=0.2, test_fraction=0.2)


@pytest.mark.parametrize("lazy", [False, True])
def test_each_instrument_is_scaled_by_its_own_training_rows(tmp_path, returns_cfg, lazy):
    """Over the whole panel: a name with a training history is normalized to unit std on its
    own training rows; one without enough of them takes the pooled scale; none under the floor;
    the batches carry each window's scale, and the model's static input its log."""
    path, cols = panel(tmp_path)
    cfg = with_(returns_cfg, path=str(path), lazy=lazy, cache_dir=str(tmp_path / "cache"))
    dm = set_up(cfg)
    schema = dm.schema
    scales = dict(zip(schema.groups, schema.target_scales, strict=True))
    train_end = T0 + FIVE_MIN * 600  # the first validation target (val_start)
    train = {n: cols["y"][(cols["symbol"] == n) & (cols["timestamp"] < train_end)] for n in PANEL}
    pooled = np.concatenate(list(train.values())).std()
    assert schema.target_scale == pytest.approx(pooled) and schema.target_center == 0
    assert scales["QUIET"] == pytest.approx(train["QUIET"].std())
    assert scales["LOUD"] == pytest.approx(train["LOUD"].std())
    assert 6 < scales["LOUD"] / scales["QUIET"] < 10  # 8x, each in its own unit
    assert scales["LATE"] == scales["SHORT"] == pytest.approx(pooled)  # too short a history
    assert scales["HALTED"] == pytest.approx(FLOOR * pooled)
    # the rows as the model sees them: each name's training targets at unit std
    ds = dm.datasets["train"]
    for name in ("QUIET", "LOUD"):
        g = schema.groups.index(name)
        rows = (ds.group == g).numpy()
        first = np.flatnonzero(rows)[0]
        normalized = ds.target.numpy()[first : first + len(train[name])]
        assert normalized.std() == pytest.approx(1.0, rel=1e-5)
    # each window carries its instrument's scale; the static input orders the names by it
    test = dm.datasets["test"]
    batch = test.__getitems__(list(range(len(test))))
    names = np.array(test.series.names)[test.group[batch["index"]].numpy()]
    assert set(names) == set(PANEL)  # LATE is forecast and scored too
    # without a training window, LATE and SHORT take the embedding's unseen row
    assert sorted(schema.untrained) == ["LATE", "SHORT"]
    unseen = batch["static_cat"][:, 0].numpy() == len(schema.groups)
    assert unseen.tolist() == np.isin(names, ["LATE", "SHORT"]).tolist()
    want = np.array([scales[n] for n in names], np.float32)
    np.testing.assert_array_equal(batch["target_scale"].numpy(), want)
    assert schema.static_inputs[-1] == SCALE_INPUT
    loudness = {n: float(batch["static_real"][names == n][0, -1]) for n in PANEL}
    assert loudness["HALTED"] < loudness["QUIET"] < loudness["LATE"] < loudness["LOUD"]
    assert loudness["LATE"] == loudness["SHORT"]


def test_both_data_paths_scale_alike(tmp_path, returns_cfg):
    path, _ = panel(tmp_path)
    cfg = with_(returns_cfg, path=str(path), cache_dir=str(tmp_path / "cache"))
    assert_same(set_up(with_(cfg, lazy=False)), set_up(with_(cfg, lazy=True)))


def test_global_scaling_gives_every_name_the_pooled_scale(tmp_path, returns_cfg):
    path, cols = panel(tmp_path)
    dm = set_up(with_(returns_cfg, path=str(path), target_scale="global"))
    schema = dm.schema
    assert schema.target_scales == [] and schema.static_inputs == schema.static
    ds = dm.datasets["train"]
    y = cols["y"][np.argsort(cols["symbol"], kind="stable")]  # the rows in the order read
    np.testing.assert_array_equal(ds.target.numpy(), (y / schema.target_scale).astype(np.float32))
    assert schema.target_summary()["scale"] == "global"


def test_a_level_is_scaled_by_its_moves_and_anchored(tmp_path, data_cfg):
    """A level target (a price): each name's centre is its training mean and its scale the std
    of its one-bar changes, whatever its price."""
    rng = np.random.default_rng(0)
    cols = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, (price, move) in {"PENNY": (2.0, 0.01), "GIANT": (4000.0, 5.0)}.items():
        cols["timestamp"].append(T0 + FIVE_MIN * np.arange(500))
        cols["symbol"].append(np.full(500, symbol))
        for c in ("f1", "f2", "k1"):
            cols[c].append(rng.normal(size=500))
        cols["y"].append(price + np.cumsum(rng.normal(size=500) * move))
    cols = {k: np.concatenate(v) for k, v in cols.items()}
    dm = set_up(with_(data_cfg, path=str(write_table(tmp_path / "levels.parquet", cols))))
    schema = dm.schema
    assert schema.target_kind == "level" and schema.target_anchor
    for name, centre, scale in zip(
        schema.groups, schema.target_centres, schema.target_scales, strict=True
    ):
        y = cols["y"][cols["symbol"] == name][:300]  # its rows before val_start (60%)
        assert centre == pytest.approx(y.mean()) and scale == pytest.approx(np.diff(y).std())
    assert dm.datasets["train"].target.abs().max() < 1e4  # no z-scored 4000-point level


# name: (first bar, price, the std of its one-bar moves); 1000 bars, validation from bar 600:
# a 4000-point future and stocks, LATE listed MIN_ROWS - 20 bars before the cut, NEW after it
LEVELS = {
    "FUT": (0, 4000.0, 5.0),
    "STK": (0, 50.0, 0.06),
    "LATE": (600 - MIN_ROWS + 20, 20.0, 0.024),
    "NEW": (700, 20.0, 0.024),
}


@pytest.mark.parametrize("lazy", [False, True])
def test_a_short_level_falls_back_on_the_pooled_relative_move(tmp_path, data_cfg, lazy):
    """A late-listed $20 stock beside a 4000-point future: with too short a history (or none)
    its scale is the pooled relative move times its own level (its training mean, or its first
    price), not the future's points; its moves come out near unit size, and serving reads the
    same scale from model.json's target."""
    rng = np.random.default_rng(0)
    cols = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, (a, price, move) in LEVELS.items():
        bars = np.arange(a, 1000)
        cols["timestamp"].append(T0 + FIVE_MIN * bars)
        cols["symbol"].append(np.full(len(bars), symbol))
        for c in ("f1", "f2", "k1"):
            cols[c].append(rng.normal(size=len(bars)))
        cols["y"].append(price + np.cumsum(rng.normal(size=len(bars)) * move))
    cols = {k: np.concatenate(v) for k, v in cols.items()}
    path = write_table(tmp_path / "levels.parquet", cols)
    dm = set_up(with_(data_cfg, path=str(path), lazy=lazy, cache_dir=str(tmp_path / "cache")))
    schema = dm.schema
    y = {n: cols["y"][cols["symbol"] == n] for n in LEVELS}
    train = {n: y[n][: max(600 - LEVELS[n][0], 0)] for n in LEVELS}
    relative = np.concatenate([np.diff(t) / t[:-1] for t in train.values() if len(t)]).std()
    centre = dict(zip(schema.groups, schema.target_centres, strict=True))
    scale = dict(zip(schema.groups, schema.target_scales, strict=True))
    assert 0 < len(train["LATE"]) < MIN_ROWS and len(train["NEW"]) == 0
    assert centre["LATE"] == pytest.approx(train["LATE"].mean())
    assert centre["NEW"] == pytest.approx(y["NEW"][0])  # its first price: no window's target
    for name in ("LATE", "NEW"):
        assert scale[name] == pytest.approx(relative * centre[name])
        assert 0.5 < scale[name] / np.diff(y[name]).std() < 2  # a stock's moves, not points
    assert scale["FUT"] > 100 * scale["LATE"]
    # the test windows' targets as the model sees them: a late name's moves near unit size
    ds = dm.datasets["test"]
    for name in ("LATE", "NEW"):
        rows = (ds.group == ds.series.names.index(name)).numpy()
        assert 0.5 < np.diff(ds.target.numpy()[rows]).std() < 2
    # serving's scale (model.json's target) is the same, an unseen name the pooled one
    names = np.array([*LEVELS, "UNSEEN"])
    got = of_instruments(target_section(schema), schema.groups, names)
    np.testing.assert_allclose(got[1], [*(scale[n] for n in LEVELS), schema.target_scale])
    np.testing.assert_allclose(got[0], [*(centre[n] for n in LEVELS), schema.target_center])


@pytest.mark.slow  # 25 CPU-s: its own training on names 8x apart (#70)
def test_forecasts_come_back_in_each_instruments_units(tmp_path):
    """Trained on names whose returns differ 8x in size: the forecast intervals differ about as
    much, each in its own units (predict, from the checkpoint, uncalibrated)."""
    path, cols = panel(tmp_path)
    overrides = tiny_overrides(path, "data.target_kind=return", "trainer.max_epochs=1")
    summary = train(compose_train(*overrides), tmp_path / "run")
    assert summary["target"]["scale"] == "instrument"
    assert summary["target"]["by_instrument"]["LOUD"] > summary["target"]["by_instrument"]["QUIET"]
    # the model's own quantiles: a calibration that adapts to the outcomes would hide a wrong unit
    model = foxhunt.load(summary["best_checkpoint"], calibration="none")
    out = model.predict(path, all_windows=True)
    width = {}
    for name in ("QUIET", "LOUD"):
        rows = out.filter(out["instrument"].to_numpy(zero_copy_only=False) == name)
        width[name] = np.median(rows["q0.9"].to_numpy() - rows["q0.1"].to_numpy())
    assert 4 < width["LOUD"] / width["QUIET"] < 16


@pytest.mark.slow  # trains its own model, 14 s: the full tier (#70)
def test_a_checkpoint_saved_before_instrument_scaling_loads_on_one_scale(tmp_path):
    """A checkpoint whose schema lacks the per-instrument keys (saved before #45) loads and
    forecasts on its one pooled scale, as it was trained."""
    path, _ = panel(tmp_path)
    overrides = tiny_overrides(
        path, "data.target_kind=return", "data.target_scale=global", "trainer.max_epochs=1"
    )
    summary = train(compose_train(*overrides), tmp_path / "run")
    ckpt = torch.load(summary["best_checkpoint"], weights_only=True)
    for key in ("target_centres", "target_scales", "target_anchor"):
        del ckpt["hyper_parameters"]["schema"][key]
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    want = foxhunt.load(summary["best_checkpoint"]).predict(path, all_windows=True)
    got = foxhunt.load(old)
    assert got.schema.target_scales == [] and got.schema.static_inputs == got.schema.static
    assert got.predict(path, all_windows=True).equals(want)
