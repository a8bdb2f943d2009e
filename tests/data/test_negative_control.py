"""A negative control for the splits: on pure noise no learner can forecast direction, so a
memorising one that does has seen its test targets in training.

The panel copies what leaked on the bundled sample: futures contracts whose lives overlap and
whose returns at equal times are nearly the same (one underlying). Split per instrument (70/15/15
of each contract's own rows), one contract's test bars are the next one's training bars, and a
1-nearest-neighbour on the encoder's returns scored 87-100% directional accuracy on them. On one
calendar with an embargo it must score a coin's 50%."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from tests.helpers import FIVE_MIN, T0, write_table

LOOKBACK = 32  # the returns the neighbour compares


def overlapping_contracts(path, contracts=5, life=8000, roll=4000, seed=0):
    """Noise returns of one underlying, traded as `contracts` contracts of `life` bars each, a
    new one every `roll` bars; each contract's return is the underlying's plus 10% own noise
    (correlation 0.995, as ESH6 and ESM6 at equal times)."""
    rng = np.random.default_rng(seed)
    underlying = rng.normal(size=roll * (contracts - 1) + life)
    cols = {"timestamp": [], "symbol": [], "ret": [], "noise": []}
    for k in range(contracts):
        bars = np.arange(k * roll, k * roll + life)
        cols["timestamp"].append(T0 + FIVE_MIN * bars)
        cols["symbol"].append(np.full(life, f"C{k}"))
        cols["ret"].append(underlying[bars] + 0.1 * rng.normal(size=life))
        cols["noise"].append(rng.normal(size=life))  # a feature (data.features=all needs one)
    return write_table(path, {k: np.concatenate(v) for k, v in cols.items()})


def windows(dataset) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The encoder's last returns, the first target and the instrument of every window."""
    batch = dataset.__getitems__(list(range(len(dataset))))
    return batch["encoder_cont"][:, -LOOKBACK:, 0], batch["target"][:, 0], batch["static_cat"][:, 0]


def nearest_neighbour(train_x, train_y, test_x, chunk=512) -> torch.Tensor:
    """Each test window's forecast: the target of the training window nearest to it."""
    return torch.cat(
        [train_y[torch.cdist(part, train_x).argmin(dim=1)] for part in test_x.split(chunk)]
    )


def rank_ic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation (the information coefficient)."""
    ra, rb = (x.argsort().argsort().double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


@pytest.mark.parametrize("lazy", [False, True])
def test_a_memorising_learner_cannot_forecast_noise_on_any_instruments_test_split(tmp_path, lazy):
    cfg = DataConfig(
        path=str(overlapping_contracts(tmp_path / "contracts.parquet")),
        group_column="symbol",
        target="ret",
        target_kind="return",
        encoder_length=LOOKBACK,
        prediction_length=4,
        lazy=lazy,
        cache_dir=str(tmp_path / "cache"),
    )
    dm = ParquetDataModule(cfg)
    dm.setup()
    train_x, train_y, _ = windows(dm.datasets["train"])
    test_x, test_y, test_group = windows(dm.datasets["test"])
    forecast = nearest_neighbour(train_x, train_y, test_x)
    scored = []
    for g in test_group.unique():
        own = test_group == g
        accuracy = float((forecast[own].sign() == test_y[own].sign()).double().mean())
        ic = rank_ic(forecast[own], test_y[own])
        name = dm.schema.groups[int(g)]
        assert abs(accuracy - 0.5) <= 0.03, f"{name}: directional accuracy {accuracy:.3f}"
        assert abs(ic) <= 0.05, f"{name}: IC {ic:.3f}"
        scored.append(name)
    assert scored == ["C4"]  # the only contract alive in the test period
