"""`foxhunt train model.ensemble=k` end to end: one run trains k members, and its checkpoint,
its float32 export, predict and the ONNX consumer all forecast their mean as one model."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

import foxhunt
from foxhunt.app.train.phases import train
from foxhunt.models.ensemble import Ensemble
from tests.helpers import (
    compose_train,
    make_table,
    needs,
    run_script,
    tiny_overrides,
    write_table,
)

pytest.importorskip("onnxruntime")
needs("onnxscript")

SMALL = ("model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4")
BRIEF = ("trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1")


@pytest.mark.slow  # 40 CPU-s: the full tier
def test_an_ensemble_run_trains_its_members_and_serves_their_mean_as_one_model(tmp_path):
    from foxhunt_serve import cli

    cols = make_table({"AAA": 300, "BBB": 200})
    train_path = write_table(tmp_path / "bars.parquet", cols)
    cfg = compose_train(*tiny_overrides(train_path, *BRIEF, "model.ensemble=3"), *SMALL)
    summary = train(cfg, tmp_path / "run")
    (tmp_path / "run" / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / "run" / ".hydra" / "config.yaml")
    ckpt = summary["best_checkpoint"]
    model = foxhunt.load(ckpt).model
    assert isinstance(model, Ensemble) and len(model.members) == 3
    assert summary["num_parameters"] == model.num_parameters()
    weights = [m.prescaler.weight.detach() for m in model.members]  # each trained from its own
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])

    # the bars to forecast: the last 4 rows of each name with their target and inputs empty
    last = np.zeros(len(cols["symbol"]), dtype=bool)
    for name in ("AAA", "BBB"):
        last[np.flatnonzero(cols["symbol"] == name)[-4:]] = True
    path = write_table(
        tmp_path / "new.parquet",
        cols | {k: np.where(last, np.nan, cols[k]) for k in ("y", "f1", "f2")},
    )
    export = tmp_path / "run" / "checkpoints" / "model_fp32.safetensors"
    table = pq.read_table(path)
    from_ckpt = foxhunt.load(ckpt).predict(table)
    from_export = foxhunt.load(export).predict(table)
    assert from_ckpt.equals(from_export)

    onnx = tmp_path / "onnx"
    code, _, stderr = run_script(
        "export.py", f"ckpt_path={ckpt}", f"export.out={onnx}", f"hydra.run.dir={tmp_path / 'x'}"
    )
    assert code == 0, stderr
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(onnx), str(path), str(tmp_path / "served.parquet")])
    assert code == 0, err.getvalue()
    served = pq.read_table(tmp_path / "served.parquet")
    quantiles = [c for c in from_ckpt.column_names if c.startswith("q")]
    assert served.num_rows == from_ckpt.num_rows > 0
    for q in quantiles:
        np.testing.assert_allclose(
            served[q].to_numpy(), from_ckpt[q].to_numpy(), rtol=1e-4, atol=1e-5
        )
