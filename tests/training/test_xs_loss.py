"""#69's cross-sectional loss term (optim.xs_weight): 1 - the median's correlation with the
target across the names of each date in a batch, and the training sampler that puts a date's
windows together so that a batch holds one date's names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxhunt.data.datamodule import EpochShuffle, ParquetDataModule
from foxhunt.evaluation.loss import XS_WEIGHT, cross_sectional_loss, xs_weight_of
from foxhunt.training.step import forecast_loss


def test_the_term_is_one_less_each_date_s_correlation_across_its_names_and_steps():
    rng = np.random.default_rng(0)
    dates = np.repeat([5, 9, 2, 7], [40, 25, 2, 30])  # date 2: too few names to count
    pred, target = rng.normal(size=(2, len(dates), 3))
    target += 0.5 * pred
    got = cross_sectional_loss(*map(torch.tensor, (pred, target, dates)))
    want = [
        np.corrcoef(pred[dates == d, h], target[dates == d, h])[0, 1]
        for d in (5, 9, 7)
        for h in range(3)
    ]
    np.testing.assert_allclose(got.item(), 1 - np.mean(want), rtol=1e-9)
    # what the pinball loss sees name by name, this term does not: a date's level, a scale
    shifted = pred + np.array([0.0, 3.0, -1.0])[None] + 10 * (dates == 9)[:, None]
    again = cross_sectional_loss(*map(torch.tensor, (2 * shifted, target, dates)))
    np.testing.assert_allclose(again.item(), got.item(), rtol=1e-9)
    lone = cross_sectional_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([1, 2]))
    assert lone.item() == 0.0


@pytest.mark.parametrize(
    "setting, transform, weight",
    [("auto", "xs_demean", XS_WEIGHT), ("auto", "xs_rank", XS_WEIGHT), ("auto", "none", 0.0)]
    + [(0.5, "none", 0.5), (0, "xs_demean", 0.0)],
)
def test_auto_weighs_the_term_only_for_a_cross_sectional_target(setting, transform, weight):
    assert xs_weight_of(setting, transform) == weight


def test_the_loss_adds_the_term_by_its_weight_and_its_gradient_reaches_the_forecast():
    quantiles = torch.tensor([0.1, 0.5, 0.9])
    pred = torch.randn(60, 4, 3, requires_grad=True)
    batch = {"target": torch.randn(60, 4), "origin": torch.arange(60) // 20}
    model = lambda b: pred  # noqa: E731  (the forecast itself, as a model's output)
    plain, ranked = (
        forecast_loss(model, batch, quantiles),
        forecast_loss(model, batch, quantiles, 0.5),
    )
    term = cross_sectional_loss(pred[..., 1], batch["target"], batch["origin"])
    torch.testing.assert_close(ranked, plain + 0.5 * term)
    ranked.backward()
    assert pred.grad[..., 1].abs().sum() > pred.grad[..., 0].abs().sum()  # the median moves


@pytest.mark.parametrize("world", [1, 2])
def test_batches_by_date_hold_each_date_together_in_a_fresh_order_each_epoch(world):
    dates = np.repeat(np.arange(30) * 86_400, 13)[np.random.default_rng(1).permutation(390)]
    orders = {}
    for epoch in (0, 1):
        for rank in range(world):
            sampler = EpochShuffle(len(dates), seed=3, rank=rank, world=world, dates=dates)
            sampler.set_epoch(epoch)
            orders[epoch, rank] = list(sampler)
            runs = np.flatnonzero(np.diff(dates[orders[epoch, rank]])) + 1
            assert len(runs) == 29  # one run of windows per date
        seen = sorted(i for r in range(world) for i in orders[epoch, r])
        assert seen == list(range(390))  # every window once (390 splits evenly)
    by_run = [
        dates[orders[e, 0]][np.r_[0, np.flatnonzero(np.diff(dates[orders[e, 0]])) + 1]]
        for e in (0, 1)
    ]
    assert sorted(by_run[0]) == sorted(by_run[1]) and list(by_run[0]) != list(by_run[1])
    again = EpochShuffle(len(dates), seed=3, rank=0, world=world, dates=dates)
    again.set_epoch(1)
    again.resume(1, 50)  # a run resumed mid-epoch skips what it trained on
    assert list(again) == orders[1, 0][50:]


@pytest.mark.slow  # a whole tiny training on a panel: the full tier
def test_a_training_with_the_term_batches_by_date_and_finishes(tmp_path):
    import pyarrow.parquet as pq

    from foxhunt.data.samples import stock_panel_table
    from tests.helpers import TINY_MODEL, compose_train, run_cli

    pq.write_table(stock_panel_table(20, days=200, seed=4), tmp_path / "panel.parquet")
    args = [
        "data=parquet",
        f"data.path={tmp_path / 'panel.parquet'}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.encoder_length=16",
        "data.prediction_length=4",
        "optim.xs_weight=0.5",
        *TINY_MODEL,
        "trainer.max_epochs=1",
        "report=false",
    ]
    done = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    data = ParquetDataModule(compose_train(*args).data, by_date=True)
    data.setup("fit")
    origin = next(iter(data.train_dataloader()))["origin"].numpy()
    runs = 1 + np.count_nonzero(np.diff(origin))
    assert runs == len(set(origin)) < len(origin)  # each date's names together
