"""Every config group composes against its schema; bad values fail before any data is read."""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import fields

import lightning as L
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from foxhunt.app.train.assemble import make_callbacks, make_logger, make_trainer
from foxhunt.config import SET_BY_FOXHUNT, TrainerConfig, parse_time, register_configs, validate
from foxhunt.errors import ConfigError
from foxhunt.training.checkpointing import BestCheckpoint, StaysStopped
from tests.helpers import CONF, ROOT, compose_train


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
def test_groups_compose_and_validate(overrides, tmp_path):
    cfg = compose_train(*overrides)
    validate(cfg)
    assert OmegaConf.to_container(cfg, resolve=True)["trainer"]["max_epochs"] > 0
    # and Hydra builds their objects (before any data is read)
    callbacks = make_callbacks(cfg.callbacks, tmp_path / "checkpoints")
    assert [type(c) for c in callbacks] == [BestCheckpoint, StaysStopped]  # patience 3
    assert callbacks[0].dirpath == str(tmp_path / "checkpoints")
    # Lightning's TensorBoardLogger writes with tensorboard or, without it, tensorboardX
    writers = [importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")]
    if cfg.logger.name == "tensorboard" and not any(writers):
        with pytest.raises(ConfigError, match="invalid logger setting: .*tensorboard"):
            make_logger(cfg.logger, tmp_path, resumed_in_place=False)
        return
    logger = make_logger(cfg.logger, tmp_path, resumed_in_place=False)
    trainer = make_trainer(cfg.trainer, logger=logger, callbacks=callbacks)
    assert trainer.max_epochs == cfg.trainer.max_epochs
    assert trainer.gradient_clip_val is None  # foxhunt's step clips, not Lightning


@pytest.mark.parametrize(
    "command, bad",
    [
        ("train", "seed=x"),
        ("predict", "predict.all_windows=maybe"),
        ("export", "export.opset=x"),
        ("interpret", "top_k=x"),
    ],
)
def test_register_configs_registers_every_command_schema(command, bad):
    """One place registers every schema: each conf/<command>.yaml composes against its own,
    which types its keys (and no other module uses the ConfigStore)."""
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        compose(command)
        with pytest.raises(ConfigCompositionException):
            compose(command, overrides=[bad])
    stores = [p.name for p in (ROOT / "src").rglob("*.py") if "ConfigStore" in p.read_text()]
    assert stores == ["config.py"]


def test_trainer_schema_has_every_trainer_argument_but_those_foxhunt_sets():
    arguments = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    assert {f.name for f in fields(TrainerConfig)} == arguments - set(SET_BY_FOXHUNT) | {"_target_"}


def test_any_trainer_argument_composes_and_a_misspelled_one_does_not():
    cfg = compose_train("trainer.num_sanity_val_steps=0", "trainer.check_val_every_n_epoch=2")
    assert (cfg.trainer.num_sanity_val_steps, cfg.trainer.check_val_every_n_epoch) == (0, 2)
    for wrong in ("trainer.max_epoch=2", "trainer.max_epochs=abc", "trainer.precision=16"):
        with pytest.raises(ConfigCompositionException):
            compose_train(wrong)


def test_early_stopping_patience_adds_early_stopping(tmp_path):
    cfg = compose_train("callbacks.early_stopping_patience=3", "callbacks.monitor=test_loss")
    best, stop = make_callbacks(cfg.callbacks, tmp_path)
    assert (best.monitor, stop.monitor, stop.patience) == ("test_loss", "test_loss", 3)


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("data.nan_policy=zero", "[error, ffill, drop]"),
        ("data.target_kind=up", "[auto, return, level]"),
        ("data.target_scale=per_name", "[instrument, global]"),
        ("data.time_unit=min", "[s, ms, us, ns]"),
        ("data.calendar.session=rth", "[bars, continuous]"),
        ("optim.schedule=linear", "[cosine, onecycle, none]"),
        ("precision.trainer_precision=16-mixed", "[32-true, bf16-mixed]"),
        ("precision.backend=tensorrt", "[torch.ao, torchao]"),
        ("memory.device=tpu", "[auto, cpu, cuda]"),
        ("resume=latest", "[auto, auto_or_new]"),
        ("optimized_metric=accuracy", "[val_loss, test_loss, test_mae,"),
    ],
)
def test_a_value_outside_its_set_fails_at_composition(override, allowed):
    with pytest.raises(ConfigCompositionException) as info:
        compose_train(override)
    assert f"expected one of {allowed}" in str(info.value.__cause__)


def test_enum_values_are_their_strings():
    cfg = compose_train("data.nan_policy=ffill", "data.target_kind=return", "precision=int8")
    d = cfg.data
    assert d.nan_policy == "ffill" and f"{d.nan_policy}" == "ffill" and d.target_kind == "return"
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    kinds = (plain["data"]["nan_policy"], plain["precision"]["backend"], plain["optim"]["schedule"])
    assert kinds == ("ffill", "torch.ao", "cosine")
    assert all(type(v) is str for v in kinds)  # a checkpoint's hyperparameters take no Enum


def test_tft_base_is_the_seed_size():
    cfg = compose_train("model=tft_base")
    m = cfg.model
    assert (m.hidden_dim, m.num_heads, m.lstm_layers, cfg.data.ohlcv.num_features) == (
        256,
        8,
        2,
        225,
    )
    assert (
        compose_train("model=tft_base", "data.ohlcv.num_features=100").data.ohlcv.num_features
        == 100
    )


def test_the_seed_experiment_pairs_the_model_with_a_4gb_budget():
    cfg = compose_train("experiment=seed_4gb_gpu")
    assert (cfg.model.hidden_dim, cfg.model.num_heads, cfg.model.lstm_layers) == (256, 8, 2)
    assert cfg.data.ohlcv.num_features == 225 and cfg.memory.budget_mb == 4096
    assert cfg.memory.batch_size_search.enabled and cfg.memory.release_optimizer_state


@pytest.mark.parametrize("label", ["model.name=tft_base", "memory.name=off", "precision.name=int8"])
def test_no_key_repeats_a_groups_choice(label):
    with pytest.raises(ConfigCompositionException):
        compose_train(label)


def test_one_place_holds_each_model_default():
    """tft_small is ModelConfig's defaults; the TFT's constructor has none of its own."""
    import inspect

    from foxhunt.config import ModelConfig
    from foxhunt.models import TemporalFusionTransformer

    assert OmegaConf.to_container(compose_train().model) == OmegaConf.to_container(
        OmegaConf.structured(ModelConfig)
    )
    not_the_tft = {"compile", "instrument_embedding", "unseen_share", "ensemble"}  # (module's)
    arch = set(ModelConfig.__dataclass_fields__) - not_the_tft
    params = inspect.signature(TemporalFusionTransformer).parameters
    assert {p for p in arch if params[p].default is not inspect.Parameter.empty} == set()


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
        ("model.compile=fast", "model.compile must be auto, true, false or one of default, "),
        ("model.quantiles=[0.5,1.0]", "strictly increasing"),
        ("data.encoder_length=0", "data.encoder_length must be positive"),
        ("data.val_fraction=0.9", "sum to less than 1"),
        ("memory.val_batch_size=big", "memory.val_batch_size must be a positive number"),
        ("memory.oom_backoff.factor=1", "memory.oom_backoff.factor must be > 1"),
        ("trainer.accumulate_grad_batches=2", "trainer.accumulate_grad_batches=2 does not work"),
        ("trainer.gradient_clip_algorithm=value", "its step clips the gradient norm"),
        ("data.split.val_start=yesterday", "data.split.val_start=yesterday is not an ISO date"),
        ("data.split.embargo=-1", "data.split.embargo must be >= 0 bars"),
        ("data.calendar.time_zone=Mars/Olympus", "data.calendar: no time zone 'Mars/Olympus'"),
        ("eval.execution_lag=100000", "eval.execution_lag=100000 trades the forecast of bar"),
        (
            ["eval.execution_lag=8", "data.prediction_length=8"],
            "beyond data.prediction_length=8: lower the lag or forecast further",
        ),
        ("eval.book_min_names=1", "eval.book_min_names must be >= 2, got 1"),
        ("data.target=timestamp", "data.target=timestamp is the data.time_column: name the"),
        (
            ["data.group_column=symbol", "data.target=symbol"],
            "data.target=symbol is the data.group_column: name the numeric column to forecast",
        ),
        ("eval.cost_bps=-1", "eval.cost_bps must be >= 0"),
        ("optim.xs_weight=-0.1", "optim.xs_weight must be auto or a number >= 0, got -0.1"),
        ("optim.xs_weight=rank", "optim.xs_weight must be auto or a number >= 0, got 'rank'"),
        ("data.calendar.close=25:00", "data.calendar: calendar close '25:00' is not a time"),
        ("data.calendar.holidays=[xmas]", "data.calendar: calendar holiday 'xmas' is not an"),
        (
            ["data.split.val_start=2026-03-01", "data.split.test_start=2026-02-01T12:00"],
            "data.split.val_start=2026-03-01 is after data.split.test_start=2026-02-01T12:00",
        ),
        (
            # (test_start = test_end is a run without a test period: a tuning study's fold)
            ["data.split.val_start=2026-03-01", "data.split.test_end=2026-03-01"],
            "data.split.val_start=2026-03-01 is not before data.split.test_end=2026-03-01",
        ),
    ],
)
def test_semantic_checks(override, message):
    overrides = override if isinstance(override, list) else [override]
    with pytest.raises(ConfigError, match=message):
        validate(compose_train(*overrides))


def test_split_times_are_utc_unless_they_name_an_offset():
    assert parse_time("k", "2026-03-02") == np.datetime64("2026-03-02", "ns").astype(np.int64)
    assert parse_time("k", "2026-03-02T09:30-05:00") == parse_time("k", "2026-03-02T14:30Z")
