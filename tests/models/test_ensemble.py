"""model.ensemble=k (`foxhunt.models.ensemble`): k TFTs trained side by side, each as if alone,
forecasting their quantiles' mean; one model to everything after training."""

from __future__ import annotations

import copy

import pytest
import torch

from foxhunt.models.ensemble import MEMBERS, Ensemble, build
from foxhunt.precision.fp32 import export_weights, load_weights
from foxhunt.training.module import make_optimizer
from foxhunt.training.step import forecast_loss, train_step
from tests.helpers import ARCH, make_batch

QUANTILES = torch.tensor([0.1, 0.5, 0.9])
INIT = dict(
    ARCH,
    num_observed=3,
    num_known=1,
    prediction_length=4,
    hidden_dim=16,
    variable_dim=8,
    static_cardinalities=[5],
    monotone=True,
    highway=True,
)


def _ensemble(k: int, **changes) -> Ensemble:
    torch.manual_seed(0)
    return build({**INIT, **changes, MEMBERS: k})


def test_it_forecasts_its_members_mean_in_order_and_interprets_as_one():
    model = _ensemble(3).eval()
    x = make_batch(model.members[0], batch=6, cardinalities=(5,))
    with torch.no_grad():
        each = torch.stack([m(x) for m in model.members])
        got, weights = model(x), model.interpret(x)
    assert not torch.equal(each[0], each[1])  # members start apart
    torch.testing.assert_close(got, each.mean(0))
    assert (got.diff(dim=-1) >= 0).all()  # each member's in order: their mean too
    torch.testing.assert_close(weights["prediction"], got)
    torch.testing.assert_close(weights["attention"].sum(-1), torch.ones(6, 4))
    assert model.instrument_rows == 5
    assert model.num_parameters() == 3 * model.members[0].num_parameters()
    assert isinstance(build({**INIT, MEMBERS: 1}), type(model.members[0]))


def test_a_step_trains_each_member_as_it_would_alone():
    """Each member's own loss and its own clipped gradient: the ensemble's step moves every
    member exactly as a step of that member alone (clipping active, no dropout)."""
    model = _ensemble(2, dropout=0.0)
    alone = [copy.deepcopy(m) for m in model.members]
    x = make_batch(alone[0], batch=8, cardinalities=(5,)) | {"target": torch.randn(8, 4)}
    x["target"] += 5  # far from the forecasts: large gradients, which the clip cuts
    loss = train_step(model, make_optimizer(model.parameters(), OPTIM), x, QUANTILES, clip=0.05)
    losses = [
        train_step(m, make_optimizer(m.parameters(), OPTIM), x, QUANTILES, clip=0.05) for m in alone
    ]
    torch.testing.assert_close(loss, torch.stack(losses).mean())
    for member, one in zip(model.members, alone, strict=True):
        for (name, got), want in zip(member.named_parameters(), one.parameters(), strict=True):
            torch.testing.assert_close(got, want, msg=name)


OPTIM = {"lr": 1e-2, "weight_decay": 1e-2}


def test_the_loss_is_the_sum_of_the_members_own_not_their_mean_s():
    model = _ensemble(2, dropout=0.0)
    x = make_batch(model.members[0], batch=8, cardinalities=(5,)) | {"target": torch.randn(8, 4)}
    x["origin"] = torch.arange(8) // 4
    got = forecast_loss(model, x, QUANTILES, xs_weight=0.3)
    want = sum(forecast_loss(m, x, QUANTILES, xs_weight=0.3) for m in model.members)
    torch.testing.assert_close(got, want)


def test_its_float32_export_loads_as_the_same_ensemble(tmp_path):
    model = _ensemble(2).eval()
    init = {**INIT, MEMBERS: 2}
    export_weights(model, init, tmp_path / "m.safetensors", schema={})
    loaded, meta = load_weights(tmp_path / "m.safetensors")
    assert isinstance(loaded, Ensemble) and meta["init"][MEMBERS] == 2
    x = make_batch(model.members[0], batch=3, cardinalities=(5,))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.ensemble=0"], "model.ensemble must be at least 1"),
        (["model.ensemble=2", "precision=int8"], "model.ensemble=2 with precision=int8"),
    ],
)
def test_a_bad_ensemble_is_one_config_error(overrides, message):
    from foxhunt.config import validate
    from foxhunt.errors import ConfigError
    from tests.helpers import compose_train

    with pytest.raises(ConfigError, match=message):
        validate(compose_train(*overrides))
