"""Every config group composes against its schema; bad values fail before any data is read."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from foxhunt.config import validate
from foxhunt.errors import ConfigError
from tests.helpers import compose_train


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=tft_base"],
        ["logger=tensorboard"],
        ["memory=gpu_4gb"],
        ["memory=off"],
        ["memory=search"],
        ["precision=int8"],
        ["precision=bf16"],
        ["trainer=ddp"],
        ["data=parquet", "data.path=/tmp/x.parquet", "data.target=close"],
    ],
)
def test_groups_compose_and_validate(overrides):
    cfg = compose_train(*overrides)
    validate(cfg)
    assert OmegaConf.to_container(cfg, resolve=True)["trainer"]["max_epochs"] > 0


def test_tft_base_is_the_seed_size():
    m = compose_train("model=tft_base").model
    assert (m.hidden_dim, m.num_heads, m.lstm_layers) == (256, 8, 2)


def test_wrong_type_fails_at_composition():
    with pytest.raises(ConfigCompositionException) as info:
        compose_train("model.hidden_dim=abc")
    assert "model.hidden_dim" in str(info.value.__cause__) + str(info.value)


def test_unknown_key_fails_at_composition():
    with pytest.raises(ConfigCompositionException):
        compose_train("model.hiden_dim=32")


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.num_heads=3", "not divisible by model.num_heads=3"),
        ("model.quantiles=[0.9,0.5]", "strictly increasing"),
        ("model.quantiles=[0.5,1.0]", "strictly increasing"),
        ("data.encoder_length=0", "data.encoder_length must be positive"),
        ("data.nan_policy=zero", "data.nan_policy must be error, ffill or drop"),
        ("data.val_fraction=0.9", "sum to less than 1"),
        ("memory.val_batch_size=big", "memory.val_batch_size must be a positive number"),
        ("memory.oom_backoff.factor=1", "memory.oom_backoff.factor must be > 1"),
        ("precision.backend=tensorrt", "precision.backend must be torch.ao or torchao"),
        ("precision.name=fp8", "precision.name must be fp32, bf16 or int8"),
    ],
)
def test_semantic_checks(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_train(override))
