"""The precisions as objects: each chosen from its config group or a checkpoint's
hyperparameters, each its own module and YAML file."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException

from foxhunt.app.train.assemble import check_same_model as _check_same_model
from foxhunt.conf import CONF_DIR
from foxhunt.errors import CheckpointError, ConfigError
from foxhunt.precision import precision_of
from foxhunt.quantization.schedule import QATSchedule
from foxhunt.training.module import upgrade
from tests.helpers import compose_train


def test_every_precision_name_has_its_module_and_yaml():
    yaml = {p.stem for p in (CONF_DIR / "precision").glob("*.yaml")}
    assert yaml == {"fp32", "bf16", "int8"}
    for name in yaml:
        cfg = compose_train(f"precision={name}")
        precision = precision_of(cfg)
        assert precision.name == name
        assert precision.trainer_precision == cfg.precision.trainer_precision


def test_chosen_from_a_group_a_config_or_a_checkpoints_hyperparameters():
    cfg = compose_train("precision=int8", "precision.qat_start_epoch=2")
    for source in (cfg, cfg.precision, {"precision": {"name": "int8", "qat_start_epoch": 2}}):
        int8 = precision_of(source)
        assert (int8.name, int8.qat_start_epoch, int8.observer_epochs) == ("int8", 2, 1)
        assert [type(c) for c in int8.callbacks()] == [QATSchedule]
    # checkpoints before precisions: precision None, or none at all
    for hparams in ({"model": {}, "precision": None}, {"model": {}}, None):
        assert precision_of(hparams).name == "fp32"
    with pytest.raises(CheckpointError, match="unknown precision 'fp8'"):
        precision_of({"name": "fp8"})


def test_what_a_precision_sets_names_it_and_no_label_contradicts_it():
    assert precision_of(compose_train("precision=bf16")).name == "bf16"
    # bf16's flag set back to float32's: what it then trains in is fp32, by what it sets
    assert (
        precision_of(compose_train("precision=bf16", "precision.trainer_precision=32-true")).name
        == "fp32"
    )
    with pytest.raises(ConfigCompositionException):
        compose_train("precision=bf16", "precision.name=fp32")  # the label is gone


def test_families_predictions_and_trainer_flags():
    fp32, bf16, int8 = (precision_of({"name": n}) for n in ("fp32", "bf16", "int8"))
    assert fp32.same_family(bf16) and not bf16.same_family(int8) and int8.same_family(int8)
    assert [p.predicts_as for p in (fp32, bf16, int8)] == ["fp32", "fp32", "int8"]
    assert bf16.autocast("cpu").fast_dtype == torch.bfloat16
    assert fp32.callbacks() == bf16.callbacks() == []


@pytest.mark.parametrize(
    "override, message",
    [
        ("precision.qat_start_epoch=-1", "precision.qat_start_epoch must be >= 0"),
        ("precision.observer_epochs=0", "precision.observer_epochs must be >= 1"),
    ],
)
def test_int8_settings_are_checked_when_chosen(override, message):
    with pytest.raises(ConfigError, match=message):
        precision_of(compose_train("precision=int8", override))


def test_a_checkpoint_resumes_only_into_its_precision_family():
    model = {"hidden_dim": 16}
    fp32, int8 = precision_of({"name": "fp32"}), precision_of({"name": "int8"})
    _check_same_model({"model": model, "precision": {"name": "bf16"}}, model, fp32)
    _check_same_model({"model": model, "precision": None}, model, fp32)  # before precisions
    with pytest.raises(ConfigError, match="trained with precision=int8, not precision=fp32"):
        _check_same_model({"model": model, "precision": {"name": "int8"}}, model, fp32)
    with pytest.raises(ConfigError, match="trained with precision=fp32, not precision=int8"):
        _check_same_model({"model": model}, model, int8)


def test_a_checkpoint_saved_before_a_model_key_resumes_only_as_it_was_built():
    # a checkpoint saved before #45 lacks highway_first: its highway came before the monotone
    # head, a different model from today's default, refused with the override that resumes it
    # (as read: `upgrade` fills in the keys of its format)
    def read(model):
        return upgrade({"model": model, "optim": {}}, "ckpt")

    saved = {"hidden_dim": 16, "highway": True, "monotone": True}
    fp32 = precision_of({"name": "fp32"})
    with pytest.raises(ConfigError, match=r"different model: model.highway_first=True$"):
        _check_same_model(read(saved), {**saved, "highway_first": False}, fp32)
    _check_same_model(read(saved), {**saved, "highway_first": True}, fp32)
    # and one saved before the highway: model.highway=false resumes it
    with pytest.raises(ConfigError, match=r"different model: model.highway=False$"):
        _check_same_model(read({"hidden_dim": 16}), {"hidden_dim": 16, "highway": True}, fp32)
    _check_same_model(read({"hidden_dim": 16}), {"hidden_dim": 16, "highway": False}, fp32)
