"""The LightGBM baseline a quant would bring (foxhunt.evaluation.gbm), and the judgement like for
like (foxhunt.evaluation.run): checked on small daily panels with a planted signal and without."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.evaluation import gbm, stats
from foxhunt.evaluation.baselines import fit_baselines, forecast_all, score_baselines
from foxhunt.evaluation.forecasts import window_facts
from foxhunt.evaluation.run import evaluate_run
from tests.helpers import T0, write_table

pytest.importorskip("lightgbm")

DAY = 86_400 * 10**9
QUANTILES = [0.1, 0.5, 0.9]


def panel(path, strength: float, names: int = 20, days: int = 400, seed: int = 0):
    """Daily returns of `names` names listed on staggered days, whose next return is
    `strength` x their `signal` (plus a market factor and noise): 0 is the negative control."""
    rng = np.random.default_rng(seed)
    market = rng.normal(0, 0.01, days)
    cols = {"timestamp": [], "symbol": [], "ret": [], "signal": []}
    for i in range(names):
        first = rng.integers(0, days // 5)  # a listing date of its own
        signal = rng.normal(size=days)
        ret = market + rng.normal(0, 0.01, days)
        ret[1:] += strength * 0.01 * signal[:-1]
        cols["timestamp"].append(T0 + DAY * np.arange(first, days))
        cols["symbol"].append(np.full(days - first, f"S{i:02d}"))
        cols["ret"].append(ret[first:])
        cols["signal"].append(signal[first:])
    return write_table(path, {k: np.concatenate(v) for k, v in cols.items()})


def datamodule(path) -> ParquetDataModule:
    cfg = DataConfig(
        path=str(path),
        group_column="symbol",
        target="ret",
        target_kind="return",
        features=["signal"],
        encoder_length=24,
        prediction_length=2,
        calibration_share=0.5,
        lazy=False,
    )
    dm = ParquetDataModule(cfg)
    dm.setup()
    return dm


def h1_rank_ic(dm: ParquetDataModule, pred: np.ndarray) -> float:
    test = window_facts(dm.datasets["test"], dm.schema)
    median = pred[:, 0, QUANTILES.index(0.5)]
    return stats.ic(median, test.actual[:, 0], test.origin_ns, lags=1, rank=True)["mean"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return datamodule(panel(tmp_path_factory.mktemp("gbm") / "planted.parquet", 0.5))


def test_it_finds_a_planted_signal_early_stopped_and_states_its_fit(planted):
    predictors, out = fit_baselines(
        planted.datasets["train"], "return", QUANTILES, 0, planted.datasets["val"]
    )
    facts = out["lightgbm"]
    assert facts["early_stopped"] and len(facts["rounds"]) == 2  # a model per step
    assert 0 < min(facts["rounds"]) and max(facts["rounds"]) < gbm.MAX_ROUNDS
    assert facts["cross_sectional_ranks"] and facts["label"].startswith("move z-scored")
    assert facts["inputs"] > 20 and facts["fit_s"] > 0 and "subsampled" not in facts
    assert facts["training_rows"] == 2 * len(planted.datasets["train"])  # every window, 2 steps
    pred = forecast_all(predictors["lightgbm"], planted.datasets["test"], "return")
    # the signal explains about half of each name's own next move: ranked by date, it shows
    assert h1_rank_ic(planted, pred) > 0.3
    assert (np.diff(pred, axis=-1) >= 0).all()  # sorted quantiles


def test_it_finds_nothing_in_noise(tmp_path):
    dm = datamodule(panel(tmp_path / "noise.parquet", 0.0, seed=1))
    predictors, out = fit_baselines(
        dm.datasets["train"], "return", QUANTILES, 0, dm.datasets["val"]
    )
    pred = forecast_all(predictors["lightgbm"], dm.datasets["test"], "return")
    assert abs(h1_rank_ic(dm, pred)) < 0.05
    assert max(out["lightgbm"]["rounds"]) < 300  # stopped early, with little to learn


def test_a_memory_budget_drops_whole_dates_evenly():
    dates = np.repeat(np.arange(100), 7)  # 100 dates of 7 windows
    kept = gbm.by_dates(dates, 300)
    assert len(kept) <= 300 and len(np.unique(dates[kept])) == len(kept) // 7
    assert all((dates[kept] == d).sum() == 7 for d in np.unique(dates[kept]))  # whole dates
    assert np.diff(np.unique(dates[kept])).max() == 3  # evenly: every third date
    assert len(gbm.by_dates(dates, 700)) == 700  # within budget: all of them


@pytest.mark.slow
def test_the_budget_subsamples_by_date_and_says_so(planted, monkeypatch):
    monkeypatch.setattr(gbm, "BUDGET_MB", 0.2)  # about 1,000 of the ~5,000 windows
    _, out = fit_baselines(
        planted.datasets["train"], "return", QUANTILES, 0, planted.datasets["val"]
    )
    sub = out["lightgbm"]["subsampled"]
    assert sub["by"] == "date" and sub["to"] < sub["from"] == len(planted.datasets["train"])


@pytest.mark.slow
def test_the_skill_is_judged_like_for_like(planted):
    # a "model" whose own forecasts are the strongest baseline's: raw against raw, and both
    # calibrated alike, it ties that baseline exactly (calibrating one side alone would not)
    datasets = planted.datasets
    _, _, strongest, predict = score_baselines(datasets, "return", QUANTILES, planted.schema.groups)
    val_pred = forecast_all(predict, datasets["calibration"], "return")
    e = SimpleNamespace(
        stride=None,
        strategy="sign",
        cost_bps=5.0,
        execution_lag=1,
        book="none",
        book_top=0.2,
        book_weights="equal",
        book_rank="forecast",
        book_min_names=10,
    )
    cal = SimpleNamespace(method="aci", gamma=0.005, per_instrument=True, min_windows=200)
    done = evaluate_run(
        datasets, planted.schema, val_pred, strongest, None, QUANTILES, cal, e, seed=0
    )
    m = done.summary["metrics"]
    assert m["skill"] == pytest.approx(0.0, abs=1e-9)
    assert m["calibrated_skill"] == pytest.approx(0.0, abs=1e-9)
    assert m["calibrated_test_loss"] == pytest.approx(m["calibrated_baseline_test_loss"])
    assert m["calibrated_test_loss"] != pytest.approx(m["raw_test_loss"])  # it calibrated
