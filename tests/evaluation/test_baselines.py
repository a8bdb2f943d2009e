"""The baselines: fit on the training windows only, scored on exactly the model's windows, each
beating the unconditional quantiles where its structure is in the data, and wired into a run's
summary and report."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from foxhunt.app.report.scores import baselines_section as _baselines_section
from foxhunt.app.train.phases import train
from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.evaluation import baselines
from foxhunt.evaluation.baselines import (
    DAY_NS,
    fit_baselines,
    gather,
    score_baselines,
    seasons,
    skill,
)
from foxhunt.evaluation.loss import quantile_loss
from tests.helpers import (
    FIVE_MIN,
    T0,
    compose_train,
    make_table,
    tiny_overrides,
    without_lightgbm,
    write_table,
)

QUANTILES = [0.1, 0.5, 0.9]
BARS = 4000  # 5-minute bars, ~14 days: 30-minute cells of ~58 training moves per step
E, H = 32, 4
NAMES = {"zero", "unconditional", "volatility_scaled", "seasonal", "linear", "lightgbm"}
# the dev extra installs lightgbm (CI); without it, that baseline is skipped
FITTED = NAMES if importlib.util.find_spec("lightgbm") else NAMES - {"lightgbm"}


def noise_panel(path, vol: np.ndarray, symbols=("A", "B"), seed=0):
    """Noise returns scaled by `vol` [BARS] on one 5-minute grid for each instrument."""
    rng = np.random.default_rng(seed)
    cols = {"timestamp": [], "symbol": [], "ret": [], "noise": []}
    for symbol in symbols:
        cols["timestamp"].append(T0 + FIVE_MIN * np.arange(BARS))
        cols["symbol"].append(np.full(BARS, symbol))
        cols["ret"].append(rng.normal(size=BARS) * vol)
        cols["noise"].append(rng.normal(size=BARS))
    return write_table(path, {k: np.concatenate(v) for k, v in cols.items()})


def windows_of(path) -> ParquetDataModule:
    cfg = DataConfig(
        path=str(path),
        group_column="symbol",
        target="ret",
        target_kind="return",
        features=["noise"],
        encoder_length=E,
        prediction_length=H,
        lazy=False,
    )
    dm = ParquetDataModule(cfg)
    dm.setup()
    return dm


def hour_of(bar: np.ndarray) -> np.ndarray:
    return (T0 + FIVE_MIN * bar) % DAY_NS // (3600 * 10**9)


def targets(ds) -> tuple[np.ndarray, np.ndarray]:
    """Every window's targets [n, H] and instrument [n]."""
    return ds.target[ds.starts[:, None] + ds.dec_offsets].numpy(), ds.group[ds.starts].numpy()


def test_quantile_baselines_are_fit_on_training_windows_and_scored_on_the_models(tmp_path):
    # a calm training period and a wild one after it: quantiles fit on the test windows (or
    # scored on the training ones) would give other numbers than these
    vol = np.where(np.arange(BARS) < 0.7 * BARS, 1.0, 3.0)
    dm = windows_of(noise_panel(tmp_path / "panel.parquet", vol))
    with without_lightgbm():  # LightGBM's windows: test_no_baseline_sees_a_row_after_...
        out, test, _, _ = score_baselines(dm.datasets, "return", QUANTILES, dm.schema.groups)

    y_train, g_train = targets(dm.datasets["train"])
    q = torch.tensor(QUANTILES)
    for split in ("val", "test"):
        y, g = targets(dm.datasets[split])
        per_instrument = {
            k: np.quantile(y_train[g_train == k], QUANTILES, axis=0).T for k in np.unique(g)
        }
        pred = torch.from_numpy(np.stack([per_instrument[k] for k in g])).float()
        expected = float(quantile_loss(pred, torch.from_numpy(y), q))
        assert out["unconditional"][f"{split}_loss"] == pytest.approx(expected, rel=1e-5)
        zero = float(quantile_loss(torch.zeros(*y.shape, 3), torch.from_numpy(y), q))
        assert out["zero"][f"{split}_loss"] == pytest.approx(zero, rel=1e-5)
    y_test, _ = targets(dm.datasets["test"])
    assert test[None]["up_share"] == pytest.approx((y_test > 0).sum() / (y_test != 0).sum())
    assert out["zero"]["test_directional_accuracy"] is None  # no move: no direction


def test_the_model_is_scored_beside_the_baselines_per_instrument(tmp_path):
    # instruments of different volatility; the "model" forecasts A's windows with the
    # unconditional quantiles and B's with zeros: per instrument it must score exactly as
    # those baselines do there, and its skill is against each instrument's own strongest
    vol = np.where(np.arange(BARS) < 0.7 * BARS, 1.0, 2.0)
    dm = windows_of(noise_panel(tmp_path / "panel.parquet", vol))
    ds = dm.datasets["test"]
    y_train, g_train = targets(dm.datasets["train"])
    _, g = targets(ds)
    table = {k: np.quantile(y_train[g_train == k], QUANTILES, axis=0).T for k in (0, 1)}
    model = np.stack([table[0] if k == 0 else np.zeros((H, 3)) for k in g]).astype(np.float32)
    with without_lightgbm():  # the skill is against the strongest of those that ran
        out, test, strongest, _ = score_baselines(
            dm.datasets, "return", QUANTILES, dm.schema.groups, model
        )

    assert set(test) == {None, "A", "B"}
    a, b = test["A"], test["B"]
    assert a["windows"] == (g == 0).sum() and b["windows"] == (g == 1).sum()
    by = {n: out[n]["test_by_instrument"] for n in ("unconditional", "zero")}
    assert a["test_loss"] == pytest.approx(by["unconditional"]["A"]["test_loss"], rel=1e-6)
    assert b["test_loss"] == pytest.approx(by["zero"]["B"]["test_loss"], rel=1e-6)
    pooled = (a["test_loss"] * a["windows"] + b["test_loss"] * b["windows"]) / len(g)
    assert test[None]["test_loss"] == pytest.approx(pooled, rel=1e-9)
    for name, found in (("A", a), ("B", b)):
        rivals = {n: o["test_by_instrument"][name] for n, o in out.items() if "skipped" not in o}
        best = min(rivals, key=lambda n: rivals[n]["test_loss"])
        assert found["best_baseline"] == best
        assert found["skill"] == pytest.approx(1 - found["test_loss"] / rivals[best]["test_loss"])
    assert b["skill"] < 0  # zeros lose to any spread
    # the strongest baseline's own forecasts of the test windows, for its strategy
    best = test[None]["best_baseline"]
    y = torch.from_numpy(targets(ds)[0])
    loss = float(quantile_loss(torch.from_numpy(strongest), y, torch.tensor(QUANTILES)))
    assert loss == pytest.approx(out[best]["test_loss"], rel=1e-5)


@pytest.mark.slow  # three LightGBM fits, 3 s: the full tier (#70)
def test_no_baseline_sees_a_row_after_the_training_period(tmp_path):
    # two panels equal up to the validation cut (70% of the bars) and different after it: every
    # baseline fit on each forecasts the same; refit on the test windows, they would not
    vol = np.ones(BARS)
    same = windows_of(noise_panel(tmp_path / "a.parquet", vol))
    wilder = windows_of(noise_panel(tmp_path / "b.parquet", np.where(np.arange(BARS) < 3000, 1, 5)))
    test = gather(same.datasets["test"], np.arange(len(same.datasets["test"])), "return")
    assert not np.array_equal(test.target.numpy(), targets(wilder.datasets["test"])[0])

    fits = [fit_baselines(dm.datasets["train"], "return", QUANTILES)[0] for dm in (same, wilder)]
    assert set(fits[0]) == FITTED
    for name in fits[0]:
        np.testing.assert_array_equal(fits[0][name](test), fits[1][name](test), err_msg=name)
    on_test = fit_baselines(wilder.datasets["test"], "return", QUANTILES)[0]
    assert not np.allclose(on_test["unconditional"](test), fits[1]["unconditional"](test))


@pytest.mark.slow  # 7 CPU-s (#70)
def test_seasonal_quantiles_beat_unconditional_ones_on_time_of_day_volatility(tmp_path):
    vol = np.where(hour_of(np.arange(BARS)) >= 12, 5.0, 1.0)  # a calm morning (UTC)
    dm = windows_of(noise_panel(tmp_path / "seasonal.parquet", vol))
    ds = dm.datasets["test"]
    first = int(ds.starts[0])  # instrument A's rows come first, one per bar from T0
    np.testing.assert_array_equal(
        ds.target_times([0])[0], T0 + FIVE_MIN * (first + E + np.arange(H))
    )

    out, _, _, _ = score_baselines(dm.datasets, "return", QUANTILES, dm.schema.groups)
    assert out["seasonal"]["about"] == "training quantiles by time of day (UTC, 30-minute buckets)"
    assert out["seasonal"]["test_loss"] < 0.92 * out["unconditional"]["test_loss"]
    assert out["seasonal"]["val_loss"] < 0.92 * out["unconditional"]["val_loss"]


@pytest.mark.slow  # 6 CPU-s (#70)
def test_volatility_scaled_quantiles_beat_unconditional_ones_on_volatility_clustering(tmp_path):
    regimes = np.random.default_rng(1).choice([0.3, 3.0], BARS // 200)
    dm = windows_of(noise_panel(tmp_path / "clusters.parquet", np.repeat(regimes, 200)))
    out, _, _, _ = score_baselines(dm.datasets, "return", QUANTILES, dm.schema.groups)
    assert out["volatility_scaled"]["test_loss"] < 0.8 * out["unconditional"]["test_loss"]


def test_seasons_are_times_of_day_for_intraday_bars_and_weekdays_for_daily_ones():
    monday = T0  # 2026-01-05
    season, count, _ = seasons(FIVE_MIN)
    assert count == 48 and season(np.array([monday + 90 * 60 * 10**9])) == [3]  # 01:30
    season, count, about = seasons(24 * FIVE_MIN)  # two-hour bars: two-hour buckets
    assert count == 12 and "120-minute" in about
    season, count, about = seasons(DAY_NS)
    assert count == 7 and about == "weekday (UTC)"
    assert season(monday + DAY_NS * np.arange(7)).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_skill_is_against_the_strongest_scored_baseline():
    found = {
        "zero": {"test_loss": 0.4},
        "seasonal": {"test_loss": 0.25},
        "linear": {"test_loss": 0.3},
        "lightgbm": {"skipped": "not installed"},
    }
    assert skill(0.2, found) == (pytest.approx(1 - 0.2 / 0.25), "seasonal")
    assert skill(None, found) == (None, None)


def test_lightgbm_is_skipped_with_the_reason_when_not_installed(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "lightgbm" else real(n)
    )
    dm = windows_of(noise_panel(tmp_path / "panel.parquet", np.ones(BARS)))
    out, _, _, _ = score_baselines(dm.datasets, "return", QUANTILES, dm.schema.groups)
    assert out["lightgbm"] == {
        "skipped": 'lightgbm is not installed (pip install -e ".[baselines]")'
    }
    assert skill(0.1, out)[1] != "lightgbm"


@pytest.mark.slow  # 3 CPU-s: the full tier
def test_a_run_records_every_baseline_and_the_skill_against_the_strongest(tmp_path):
    # the tiny table's target is a level: the baselines forecast moves from the last value
    path = write_table(tmp_path / "bars.parquet", make_table({"AAA": 300, "BBB": 300}))
    summary = train(compose_train(*tiny_overrides(path)), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    found, m = summary["baselines"], summary["metrics"]
    assert set(found) == NAMES
    scored = {n: b["test_loss"] for n, b in found.items() if "skipped" not in b}
    assert set(scored) == FITTED
    assert all(found[n]["val_loss"] > 0 for n in scored)
    assert found["volatility_scaled"]["about"].endswith(
        "encoder's differences x training quantiles"
    )
    # the zero move is the naive forecast the module scores
    assert scored["zero"] == pytest.approx(m["baseline_test_loss"], rel=1e-6)
    best = min(scored, key=scored.__getitem__)
    assert m["best_baseline"] == best
    # like for like: the skill of the model's own (summary.json's calibration.before) against
    # the baselines' own; the delivered (calibration.after) against the strongest calibrated
    own, delivered = m["raw_test_loss"], m["calibrated_test_loss"]
    # (a level's forecasts carry its price: dividing them by its scale rounds at ~1e-9)
    assert delivered == pytest.approx(summary["calibration"]["after"]["pinball"], rel=1e-8)
    assert own == pytest.approx(summary["calibration"]["before"]["pinball"], rel=1e-5)
    assert m["skill"] == pytest.approx(1 - own / scored[best])
    theirs = m["calibrated_baseline_test_loss"]
    assert m["calibrated_skill"] == pytest.approx(1 - delivered / theirs)
    assert 0 < m["test_up_share"] < 1
    # the one forecast pass reproduces the test step's loss before calibration; per
    # instrument, its rows are test_forecasts.parquet's
    assert summary["calibration"]["before"]["pinball"] == pytest.approx(m["test_loss"], rel=1e-5)
    per = m["by_instrument"]
    assert set(per) == {"AAA", "BBB"}
    windows = sum(p["windows"] for p in per.values())
    pooled = sum(p["test_loss"] * p["windows"] for p in per.values()) / windows
    assert pooled == pytest.approx(own, rel=1e-5)
    for name, p in per.items():
        rivals = {n: found[n]["test_by_instrument"][name]["test_loss"] for n in scored}
        assert p["skill"] == pytest.approx(1 - p["test_loss"] / min(rivals.values()))
    forecasts = pq.read_table(tmp_path / "run" / "test_forecasts.parquet")
    assert forecasts.num_rows == windows * 4
    assert set(forecasts["instrument"].to_pylist()) == {"AAA", "BBB"}


def test_the_report_names_the_strongest_baseline_and_the_base_rate():
    summary = {
        "metrics": {
            "test_loss": 0.19,
            "val_loss": 0.3,
            "test_directional_accuracy": 0.52,
            "skill": 0.05,
            "best_baseline": "seasonal",
            "test_up_share": 0.45,
        },
        "baselines": {
            "seasonal": {"test_loss": 0.2, "val_loss": 0.31, "about": "by time of day"},
            "lightgbm": {"skipped": "lightgbm is not installed"},
        },
    }
    text = "\n".join(_baselines_section(summary))
    assert "| seasonal | 0.2 | 0.31 | +5.0% | - | by time of day |" in text
    assert "skipped: lightgbm is not installed" in text
    assert "Skill against the strongest baseline (seasonal): +5.00%" in text
    assert "Directional accuracy 52.0% against a base rate of 55.0% (always down" in text


@pytest.mark.slow  # 7 CPU-s (#70)
def test_past_the_bound_baselines_fit_on_an_evenly_spaced_subsample_and_say_so(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(baselines, "TABLE_WINDOWS", 500)
    monkeypatch.setattr(baselines, "MODEL_WINDOWS", 200)
    dm = windows_of(noise_panel(tmp_path / "panel.parquet", np.ones(BARS)))
    train = dm.datasets["train"]
    n = len(train)
    predictors, out = fit_baselines(train, "return", QUANTILES, seed=3)
    tables = {"from": n, "to": 500}
    assert {k: out[k].get("subsampled") for k in out if "skipped" not in out[k]} == {
        "zero": None,  # fit on nothing
        "unconditional": tables,
        "volatility_scaled": tables,
        "seasonal": tables,
        "linear": {"from": n, "to": 200},
        **({"lightgbm": None} if "lightgbm" in FITTED else {}),  # all of them (test_gbm.py)
    }
    assert out["linear"]["about"].endswith("(200 training windows)")
    # the windows fit on: evenly spaced from a seeded offset, so each instrument's share
    rng = np.random.default_rng(3)
    chosen = baselines._sample(n, 500, rng)
    assert len(set(chosen)) == 500 and set(np.diff(chosen)) <= {n // 500, n // 500 + 1}
    per_instrument = np.bincount(train.group[train.starts[chosen]].numpy())
    assert np.abs(per_instrument - 500 * np.bincount(targets(train)[1]) / n).max() <= 1
    test = gather(dm.datasets["test"], np.arange(len(dm.datasets["test"])), "return")
    expected, _ = baselines.fit_unconditional(gather(train, chosen, "return"), np.array(QUANTILES))
    np.testing.assert_array_equal(predictors["unconditional"](test), expected(test))
    # and said in the report
    text = "\n".join(_baselines_section({"metrics": {}, "baselines": out}))
    assert (
        f"Fit on evenly spaced subsamples of the {n:,} training windows: 500 for unconditional, "
        "volatility_scaled, seasonal; 200 for linear" in text
    )
    # under the bound: every window, nothing said
    monkeypatch.setattr(baselines, "MODEL_WINDOWS", n)
    monkeypatch.setattr(baselines, "TABLE_WINDOWS", n)
    _, out = fit_baselines(train, "return", QUANTILES, seed=3)
    assert not [k for k in out if "subsampled" in out[k]]
    assert "subsamples" not in "\n".join(_baselines_section({"metrics": {}, "baselines": out}))
