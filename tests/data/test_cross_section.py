"""Each date's cross-section (data.cross_section, data.target_transform): ranks and z-scores
among the names at the same time, over a panel whose names list, halt and delist at different
times, and the target made market-neutral."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from foxhunt_serve.cross_section import CONTEXT, by_date
from scipy.stats import rankdata

from foxhunt.config import DataConfig
from foxhunt.data.panel_inputs import PANEL_NAMES
from foxhunt.data.read import read_data
from foxhunt.data.samples import stock_panel_table
from foxhunt.errors import ConfigError
from foxhunt.evaluation.loss import XS_WEIGHT
from foxhunt.training.checkpoint_io import read_checkpoint_hparams
from tests.helpers import (
    PREDICT_BATCH,
    TINY_MODEL,
    compose_train,
    run_cli,
    run_script,
    without_lightgbm,
)


def test_ranks_match_scipy_date_by_date_with_ties_and_lone_names():
    rng = np.random.default_rng(0)
    at = rng.integers(0, 40, size=600)
    at[at == 7] = 8  # date 7 empty
    at[0] = 41  # date 41: one name alone
    values = np.round(rng.normal(size=600), 1)  # ties
    ranked = by_date(values, np.unique(at, return_inverse=True)[1], "rank")
    for d in np.unique(at):
        here = at == d
        n = here.sum()
        want = (rankdata(values[here]) - 0.5) / n - 0.5 if n > 1 else np.zeros(1)
        np.testing.assert_allclose(ranked[here], want * math.sqrt(12), atol=1e-12)
    z = by_date(values, np.unique(at, return_inverse=True)[1], "zscore")
    for d in np.unique(at)[:-1]:
        assert abs(z[at == d].mean()) < 1e-9 and abs(z[at == d].std() - 1) < 1e-9
    assert z[0] == 0.0  # alone at its time


@pytest.fixture(scope="module")
def panel(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("xs") / "panel.parquet"
    pq.write_table(stock_panel_table(40, days=300, seed=3), path)  # staggered, halts, delists
    return path


def _cfg(path, **changes) -> DataConfig:
    cfg = DataConfig(path=str(path), group_column="symbol", features="ohlcv", lazy=False)
    return replace(cfg, **{"target_transform": "none"} | changes)


def _by_time(loaded):
    series = list(loaded.series)
    times = np.concatenate([s.time_ns for s in series])
    return series, times


def test_every_date_of_the_panel_is_ranked_among_the_names_trading_then(panel):
    plain = read_data(_cfg(panel))
    loaded = read_data(_cfg(panel, cross_section="rank", target_transform="xs_demean"))
    n = len(plain.observed)
    assert loaded.observed == plain.observed + [f"{c}_xs_rank" for c in plain.observed]
    series, times = _by_time(loaded)
    raw = np.concatenate([s.observed[:, :n] for s in series])
    ranks = np.concatenate([s.observed[:, n:] for s in series])
    target = np.concatenate([s.target for s in series])
    plain_target = np.concatenate([s.target for s in plain.series]).astype(np.float64)
    np.testing.assert_array_equal(raw, np.concatenate([s.observed for s in plain.series]))
    names = np.bincount(np.unique(times, return_inverse=True)[1])
    assert names.min() < names.max()  # names list, halt and delist at different dates
    for t in np.unique(times)[::7]:
        here = times == t
        assert abs(target[here].sum()) < 1e-9  # market-neutral at every date
        np.testing.assert_allclose(
            target[here], plain_target[here] - plain_target[here].mean(), atol=1e-9
        )
        if here.sum() > 1:  # each column's ranks order the names as its values do
            for j in (0, n - 1):
                assert np.all(np.diff(ranks[here, j][np.argsort(raw[here, j])]) >= 0)


def test_the_market_context_is_every_date_s_mean_dispersion_and_breadth_of_the_names(panel):
    """data.market_context=true (#69): three inputs every name shares at a date, of the names'
    raw targets there, across a panel whose names list, halt and delist at different dates;
    under a market-neutral target too (taken before it)."""
    plain = read_data(_cfg(panel))
    loaded = read_data(_cfg(panel, market_context=True, target_transform="xs_demean"))
    n = len(plain.observed)
    assert loaded.observed == plain.observed + list(CONTEXT)
    series, times = _by_time(loaded)
    context = np.concatenate([s.observed[:, n:] for s in series])
    raw = np.concatenate([s.target for s in plain.series]).astype(np.float64)
    names = np.bincount(np.unique(times, return_inverse=True)[1])
    assert names.min() < names.max()
    for t in np.unique(times)[::5]:
        here = times == t
        r = raw[here][np.isfinite(raw[here])]
        want = [r.mean(), r.std(), (r > 0).mean()] if len(r) else [0, 0, 0]
        np.testing.assert_allclose(context[here], np.tile(want, (here.sum(), 1)), atol=1e-9)


def test_a_market_context_column_the_data_already_has_is_one_error(tmp_path):
    table = stock_panel_table(12, days=60, seed=1)
    table = table.append_column("xs_market_mean", pa.array(np.zeros(table.num_rows)))
    pq.write_table(table, tmp_path / "p.parquet")
    cfg = _cfg(tmp_path / "p.parquet", extra_features=["xs_market_mean"], market_context=True)
    with pytest.raises(ConfigError, match="adds the input.s. xs_market_mean, which the data"):
        read_data(cfg)


def test_a_level_target_is_not_made_market_neutral(tmp_path):
    table = stock_panel_table(5, days=60, seed=1)
    pq.write_table(table, tmp_path / "p.parquet")
    cfg = _cfg(tmp_path / "p.parquet", features=["volume"], target="close")
    cfg = replace(cfg, target_kind="level", target_transform="xs_demean")
    with pytest.raises(ConfigError, match="'close' is a level"):
        read_data(cfg)


@pytest.mark.parametrize(
    "overrides", [("data.lazy=true",), ("data.group_column=null",)], ids=["lazy", "one series"]
)
@pytest.mark.parametrize("asked", ["data.cross_section=zscore", "data.market_context=true"])
def test_cross_sections_need_the_names_in_memory(overrides, asked):
    from foxhunt.config import validate

    cfg = compose_train(asked, *overrides)
    with pytest.raises(ConfigError, match=f"{asked} compare the names"):
        validate(cfg)


# the ranked inputs' model trains in the full tier alone (#70: 40 s of the fast tier's)
@pytest.fixture(scope="module", params=[pytest.param("rank", marks=pytest.mark.slow), "none"])
def market_neutral(panel, tmp_path_factory: pytest.TempPathFactory, request):
    """A tiny model trained with a market-neutral target (explicit, with ranked inputs; or
    by default, alone): (summary, dir)."""
    tmp = tmp_path_factory.mktemp("neutral")
    how = request.param
    args = [
        "data=parquet",
        f"data.path={panel}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        f"data.cross_section={how}",
        *(["data.target_transform=xs_demean"] if how == "rank" else []),  # or by default
        "data.encoder_length=16",
        "data.prediction_length=4",
        *TINY_MODEL,
        "trainer.max_epochs=1",
        "report=false",
        f"hydra.run.dir={tmp / 'run'}",
    ]
    with without_lightgbm():  # 4 s of the 6 s on this panel; the baselines have their tests
        assert run_cli(*args, cwd=tmp).returncode == 0
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    return summary | {"data_path": str(panel), "ranked": how == "rank"}, tmp


@pytest.fixture(scope="module")
def predicted(market_neutral):
    """`foxhunt predict` of the market-neutral model on its panel: the forecast file."""
    summary, tmp = market_neutral
    out = tmp / "forecast.parquet"
    done = run_cli(
        f"ckpt_path={summary['best_checkpoint']}",
        f"data.path={summary['data_path']}",
        f"predict.out={out}",
        f"predict.batch_size={PREDICT_BATCH}",
        f"hydra.run.dir={tmp / 'predict'}",
        cwd=tmp,
        script="predict.py",
    )
    assert done.returncode == 0, done.stderr
    return out


def test_a_market_neutral_model_predicts_on_its_own_inputs(panel, market_neutral, predicted):
    summary, _ = market_neutral
    plain = read_data(_cfg(panel))
    ranked = 2 * len(plain.observed)  # each input's rank beside it
    assert (
        summary["num_features"] > ranked if summary["ranked"] else summary["num_features"] < ranked
    )
    assert summary["target"]["transform"] == "xs_demean"
    assert pq.read_table(predicted).num_rows > 0
    # optim.xs_weight=auto: the cross-sectional term's weight with a cross-sectional target
    optim = read_checkpoint_hparams(summary["best_checkpoint"])[1]["optim"]
    assert optim["xs_weight"] == XS_WEIGHT > 0


@pytest.fixture(scope="module")
def every_window(market_neutral):
    """predict's forecasts of every window of the market-neutral model's panel."""
    import foxhunt

    summary, _ = market_neutral
    predictor = foxhunt.load(summary["best_checkpoint"], batch_size=PREDICT_BATCH)
    return predictor.predict(summary["data_path"], all_windows=True)


def test_predict_gives_the_raw_return_beside_the_market_neutral_target(panel, every_window):
    done = every_window.filter(pc.is_valid(every_window["actual"]))
    assert done.num_rows > 0
    assert set(every_window["target_transform"].to_pylist()) == {"xs_demean"}
    np.testing.assert_array_equal(done["actual"].to_numpy(), _by_row(read_data(_cfg(panel)), done))
    neutral = _by_row(read_data(_cfg(panel, target_transform="xs_demean")), done)
    np.testing.assert_allclose(done["actual_xs_demean"].to_numpy(), neutral, rtol=1e-12)


@pytest.mark.slow  # 35 CPU-s, an export and two consumer runs; test_export's are fast (#70)
def test_the_onnx_consumer_forecasts_a_market_neutral_model_as_predict(
    market_neutral, predicted, every_window
):
    pytest.importorskip("onnxruntime")
    from foxhunt_serve import cli

    summary, tmp = market_neutral
    panel = summary["data_path"]
    code, _, stderr = run_script(
        "export.py",
        f"ckpt_path={summary['best_checkpoint']}",
        f"export.out={tmp / 'onnx'}",
        f"hydra.run.dir={tmp / 'export_run'}",
    )
    assert code == 0, stderr
    meta = json.loads((tmp / "onnx" / "model.json").read_text())
    assert meta["data"]["target_transform"] == "xs_demean"
    ranked = [f for f in meta["features"] if f.endswith("_xs_rank")]
    assert {meta["features"][f]["source"] for f in ranked} == (
        {"cross_section"} if summary["ranked"] else set()
    )
    assert bool(ranked) == summary["ranked"]
    assert cli.main([str(tmp / "onnx"), panel, str(tmp / "onnx.parquet")]) == 0
    got, want = pq.read_table(tmp / "onnx.parquet"), pq.read_table(predicted)
    assert got.num_rows == want.num_rows > 0
    assert got.column_names == want.column_names
    for column in want.column_names:
        if column.startswith("q") or column == "actual":
            a, b = got[column].to_numpy(), want[column].to_numpy()
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(b)))
    # the raw return and the model's target realised, as predict gives them
    assert cli.main([str(tmp / "onnx"), panel, str(tmp / "all.parquet"), "--all-windows"]) == 0
    every = pq.read_table(tmp / "all.parquet")
    assert every["target_transform"].to_pylist() == every_window["target_transform"].to_pylist()
    for column in ("actual", "actual_xs_demean"):
        a, b = every[column].to_numpy(), every_window[column].to_numpy()
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize(
    ("names", "group", "want"),
    [(40, "symbol", "xs_demean"), (5, "symbol", "none"), (1, None, "none")],
)
def test_auto_takes_out_the_mean_on_a_panel_of_enough_names(tmp_path, names, group, want):
    table = stock_panel_table(names, days=80, seed=2)
    if group is None:
        table = table.drop_columns(["symbol"])
    pq.write_table(table, tmp_path / "p.parquet")
    cfg = _cfg(tmp_path / "p.parquet", group_column=group, target_transform="auto")
    assert read_data(cfg).target_transform == want
    assert PANEL_NAMES <= 40


def test_a_few_names_given_to_a_market_neutral_model_get_one_warning(tmp_path, caplog):
    pq.write_table(stock_panel_table(3, days=80, seed=2), tmp_path / "p.parquet")
    read_data(_cfg(tmp_path / "p.parquet", target_transform="xs_demean"))
    said = [r.getMessage() for r in caplog.records if "name(s) only" in r.getMessage()]
    assert said == [
        "data: data.target_transform=xs_demean across 3 name(s) only: the model compares each "
        "name with the others at each time, so give it the panel it was trained on"
    ]


def test_the_run_says_its_target_is_market_neutral(panel, caplog):
    from foxhunt.data.datamodule import ParquetDataModule

    caplog.set_level("INFO")
    dm = ParquetDataModule(_cfg(panel, target_transform="auto", encoder_length=16))
    dm.setup()
    assert dm.schema.target_transform == "xs_demean"
    said = [r.getMessage() for r in caplog.records if "the target is" in r.getMessage()]
    assert said == [
        "data: the target is less the mean across the names at each time "
        "(data.target_transform=auto)"
    ]


def _by_row(loaded, table: pa.Table) -> np.ndarray:
    """The target of `loaded` (as read) at each row of a forecast table, by name and time."""
    found = {
        (s.name, int(t)): v for s in loaded.series for t, v in zip(s.time_ns, s.target, strict=True)
    }
    times = table["target_time"].cast(pa.int64()).to_pylist()
    return np.array([found[k] for k in zip(table["instrument"].to_pylist(), times, strict=True)])


def test_the_forecast_table_holds_the_raw_return_beside_the_market_neutral_target(panel):
    from foxhunt.data.datamodule import ParquetDataModule
    from foxhunt.evaluation.forecasts import forecast_table, target_column

    cfg = _cfg(panel, target_transform="xs_demean", encoder_length=16, prediction_length=2)
    dm = ParquetDataModule(cfg)
    dm.setup()
    test = dm.datasets["test"]
    table = forecast_table(test, dm.schema, np.zeros((len(test), 2, 3)), [0.1, 0.5, 0.9])
    assert table.num_rows > 0
    assert target_column(table) == "actual_xs_demean"  # what the quantiles forecast
    assert set(table["target_transform"].to_pylist()) == {"xs_demean"}

    raw = _by_row(read_data(_cfg(panel)), table)
    np.testing.assert_array_equal(table["actual"].to_numpy(), raw)
    demeaned = _by_row(read_data(cfg), table)
    np.testing.assert_allclose(table["actual_xs_demean"].to_numpy(), demeaned, atol=1e-7)
    assert np.abs(raw - demeaned).mean() > 1e-3  # the market's move: the two differ


def _lazily(tmp_path, **changes):
    """A 12-name OHLCV panel (its derived return: auto is xs_demean) read through data.lazy."""
    pq.write_table(stock_panel_table(12, days=400, seed=4), tmp_path / "p.parquet")
    cfg = _cfg(tmp_path / "p.parquet", target_transform="auto", encoder_length=16)
    return replace(cfg, cache_dir=str(tmp_path / "cache"), **changes)


def test_free_memory_never_changes_the_target(tmp_path, monkeypatch):
    """Lazy and in-memory reads give the same target or none: data.lazy=true refuses the
    transform in one line; data.lazy=auto reads it in memory, whatever it would read lazily,
    and refuses in one line where the memory free cannot hold the panel."""
    from foxhunt.data import store
    from foxhunt.data.datamodule import ParquetDataModule

    with pytest.raises(ConfigError) as refused:
        ParquetDataModule(_lazily(tmp_path, lazy=True)).setup()
    said = str(refused.value)
    assert "\n" not in said and "(xs_demean on 12 names)" in said
    assert "data.lazy=true reads the panel one name at a time: set data.lazy=false" in said
    monkeypatch.setattr(store, "LAZY_MEMORY_FRACTION", 0.0)  # auto would read it lazily
    auto = ParquetDataModule(_lazily(tmp_path, lazy="auto"))
    auto.setup()
    assert auto.store_path is None and auto.schema.target_transform == "xs_demean"
    eager = ParquetDataModule(_lazily(tmp_path, lazy=False))
    eager.setup()
    assert auto.schema.to_dict() == eager.schema.to_dict()
    monkeypatch.setattr(store, "_available_bytes", lambda: 1)
    with pytest.raises(ConfigError, match="GiB free: free memory, or set data.target_transform"):
        ParquetDataModule(_lazily(tmp_path, lazy="auto")).setup()
    # without a transform, the lazy path trains the same target as memory
    plain = ParquetDataModule(_lazily(tmp_path, lazy=True, target_transform="none"))
    plain.setup()
    assert plain.store_path is not None and plain.schema.target_transform == "none"
    memory = ParquetDataModule(_lazily(tmp_path, lazy=False, target_transform="none"))
    memory.setup()
    np.testing.assert_allclose(plain.schema.target_centres, memory.schema.target_centres)
    np.testing.assert_allclose(plain.schema.target_scales, memory.schema.target_scales)
