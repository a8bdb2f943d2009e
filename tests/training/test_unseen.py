"""A name the model was not trained on (#60): the instrument embedding's unseen row, learned by
hiding names in training, or no embedding at all (model.instrument_embedding=false)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import foxhunt
from foxhunt.app.report.console import console_summary
from foxhunt.app.train.phases import train
from foxhunt.config import ModelConfig, OptimConfig
from foxhunt.data.schema import DataSchema
from foxhunt.precision.onnx import onnx_inputs
from foxhunt.training.module import TFTModule, forecasts_unseen, instrument_rows, upgrade
from tests.helpers import (
    FIVE_MIN,
    PREDICT_BATCH,
    compose_train,
    make_table,
    tiny_overrides,
    write_table,
)


def _schema(groups: list[str]) -> DataSchema:
    return DataSchema(
        observed=["f1"],
        known=[],
        static=[],
        groups=groups,
        target="y",
        target_kind="return",
        encoder_length=8,
        prediction_length=2,
        input_mean=[0.0, 0.0],
        input_std=[1.0, 1.0],
    )


def _module(**model: object) -> TFTModule:
    cfg = {k: v for k, v in vars(ModelConfig()).items() if k != "compile"}
    cfg |= {"instrument_embedding": True} | model
    optim = {k: getattr(OptimConfig(), k) for k in ("lr", "weight_decay", "warmup_fraction")}
    optim |= {"schedule": "none", "schedule_epochs": None}
    return TFTModule(cfg, _schema(["AAA", "BBB", "CCC"]).to_dict(), optim)


def test_training_hides_the_name_on_its_share_of_the_windows_with_the_unseen_row():
    module = _module(unseen_share=0.1)
    assert module.model.instrument_rows == 4  # three names, then the unseen one
    names = torch.randint(0, 3, (20_000, 1))
    torch.manual_seed(0)
    got = module._hide_names({"static_cat": names})["static_cat"]
    hidden = got[:, 0] == 3
    assert 0.09 < hidden.float().mean() < 0.11
    assert torch.equal(got[~hidden], names[~hidden])  # the others keep their own row
    torch.manual_seed(0)  # seeded: the same windows again
    assert torch.equal(module._hide_names({"static_cat": names})["static_cat"], got)
    untouched = _module(unseen_share=0.0)._hide_names({"static_cat": names})["static_cat"]
    assert torch.equal(untouched, names)


def test_without_the_embedding_the_model_has_no_id_input():
    module = _module(instrument_embedding=False)
    schema = module.schema
    assert module.model.instrument_rows == 0 and not module.model.static_embeddings
    assert forecasts_unseen(module.model, schema)  # only the data tells the names apart
    assert "instrument" not in {i["name"] for i in onnx_inputs(schema, 0)}
    assert "instrument" in {i["name"] for i in onnx_inputs(schema, 4)}
    # a model saved before #60 (format 0): one row per name, none for an unseen one
    hparams = dict(module.hparams)
    hparams["model"] = {k: v for k, v in hparams["model"].items() if k != "instrument_embedding"}
    del hparams["format_version"]
    saved_before = upgrade(hparams, "ckpt")
    assert saved_before["format_version"] == 0
    assert instrument_rows(saved_before["model"], schema, 0) == 3


@pytest.mark.slow  # a training of its own: the full tier (#70)
def test_a_model_without_the_embedding_forecasts_a_name_listed_after_training(tmp_path):
    """Trained on AAA and BBB with model.instrument_embedding=false, it forecasts BBB's bars
    renamed CCC, and AAA as before."""
    cols = make_table({"AAA": 300, "BBB": 200})
    path = write_table(tmp_path / "train.parquet", cols)
    cfg = compose_train(*tiny_overrides(path, "model.instrument_embedding=false"))
    summary = train(cfg, tmp_path / "run")
    predictor = foxhunt.load(summary["best_checkpoint"], device="cpu", batch_size=PREDICT_BATCH)
    before = predictor.predict(path, all_windows=True)
    cols["symbol"] = np.where(cols["symbol"] == "BBB", "CCC", cols["symbol"])
    renamed = write_table(tmp_path / "renamed.parquet", cols)
    after = predictor.predict(renamed, all_windows=True)
    assert sorted(set(after["instrument"].to_pylist())) == ["AAA", "CCC"]

    def of(table, name):
        return table.filter(np.array(table["instrument"].to_pylist()) == name)

    assert of(after, "AAA").equals(of(before, "AAA"))
    ccc, bbb = of(after, "CCC"), of(before, "BBB")
    assert ccc.num_rows == bbb.num_rows > 0 and np.isfinite(ccc["q0.5"].to_numpy()).all()


@pytest.mark.slow  # 12 CPU-s: its own training (#70)
def test_a_name_listed_in_the_test_period_is_forecast_and_scored_apart(tmp_path):
    """NEW lists at bar 240 of 300, after the training and validation periods: it is forecast
    through the unseen row, and summary.json, the console and the report score it apart."""
    cols = make_table({"AAA": 300, "BBB": 300, "NEW": 60})
    new = cols["symbol"] == "NEW"
    cols["timestamp"] = np.where(new, cols["timestamp"] + 240 * FIVE_MIN, cols["timestamp"])
    path = write_table(tmp_path / "listed.parquet", cols)
    cfg = compose_train(*tiny_overrides(path, "report=true"))
    summary = train(cfg, tmp_path / "run")
    schema = DataSchema.from_dict(
        torch.load(summary["best_checkpoint"], weights_only=True)["hyper_parameters"]["schema"]
    )
    assert schema.untrained == ["NEW"]
    unseen = summary["metrics"]["unseen"]
    assert unseen["names"] == ["NEW"] and unseen["windows"] > 0
    assert unseen["skill"] is not None and unseen["best_baseline"]
    assert unseen["windows"] == summary["metrics"]["by_instrument"]["NEW"]["windows"]
    line = next(s for s in console_summary(summary) if s.startswith("names not seen"))
    assert "(1: NEW)" in line and f"skill {unseen['skill']:+.1%}" in line
    assert "Names not seen in training (1: NEW)" in (tmp_path / "run" / "report.md").read_text()
