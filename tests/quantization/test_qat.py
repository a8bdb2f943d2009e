"""int8 quantization-aware training: prepare, checkpoint, export, load; and bf16 runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from foxhunt.app.train.phases import train
from foxhunt.data.schema import footer_schema, random_batch
from foxhunt.models import TemporalFusionTransformer
from foxhunt.precision.int8 import fp32_export_bytes
from foxhunt.quantization import export_int8, load_int8, prepare_qat, set_qat_phase
from foxhunt.training.module import build_model, model_init
from tests.helpers import ARCH, ROOT, compose_train, make_batch, tiny_overrides

INIT = dict(
    ARCH,
    num_observed=4,
    num_known=2,
    prediction_length=5,
    static_cardinalities=[3],
    hidden_dim=16,
    num_heads=4,
    variable_dim=8,
    quantiles=[0.1, 0.5, 0.9],
)


BACKENDS = [
    "torch.ao",
    pytest.param(
        "torchao",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("torchao") is None, reason="torchao is not installed"
        ),
    ),
]


def trained_qat_model(
    steps: int = 5, backend: str = "torch.ao"
) -> tuple[TemporalFusionTransformer, dict]:
    torch.manual_seed(0)
    model = prepare_qat(TemporalFusionTransformer(**INIT), backend=backend)
    batch = make_batch(model, cardinalities=(3,))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
    model.eval()
    set_qat_phase(model, observe=False, fake_quant=True)
    return model, batch


def test_prepare_fake_quantizes_weights_but_not_the_head_or_lstm():
    model, _ = trained_qat_model(steps=1)
    w = model.static_enrichment.fc2.weight  # parametrized: int8 levels per output channel
    scale = model.static_enrichment.fc2.parametrizations.weight[0].fq.scale
    levels = w / scale[:, None]
    assert torch.allclose(levels, levels.round(), atol=1e-3)
    assert levels.abs().max() <= 128
    stacked = model.encoder_variable_selection.single_variable_grns.glu.weight
    assert stacked.shape == (model.num_encoder_vars, 8, 32)
    assert not hasattr(model.output_layer, "parametrizations")
    assert not hasattr(model.lstm_encoder, "parametrizations")


def test_qat_state_survives_a_checkpoint_round_trip():
    model, batch = trained_qat_model()
    state = model.state_dict()
    assert any("activation_post_process.min_val" in k for k in state)
    fresh = prepare_qat(TemporalFusionTransformer(**INIT)).eval()
    fresh.load_state_dict(state)
    set_qat_phase(fresh, observe=False, fake_quant=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(batch), model(batch))


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_is_small_loads_in_one_call_and_matches_the_fake_quant_model(tmp_path, backend):
    model, batch = trained_qat_model(backend=backend)
    path = tmp_path / "model_int8.safetensors"
    int8_bytes = export_int8(model, INIT, path)
    assert path.stat().st_size == int8_bytes
    loaded = load_int8(path)
    with torch.no_grad():
        reference, out = model(batch), loaded(batch)
    assert out.shape == reference.shape
    assert ((out - reference).abs().mean() / reference.std()) < 0.02


def test_the_int8_export_of_tft_small_is_at_most_035x_of_its_fp32_export(tmp_path):
    """tft_small as the bundled sample sizes it, its ranges observed on one random batch (the
    sizes do not depend on training), against the float32 export with the same metadata."""
    cfg = compose_train("model=tft_small", "precision=int8")
    schema = footer_schema(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, schema, {"name": "int8"}).train()
    with torch.no_grad():
        model(random_batch(schema, 8))
    set_qat_phase(model.eval(), observe=False, fake_quant=True)
    init = model_init(cfg.model, schema)
    int8_bytes = export_int8(model, init, tmp_path / "model_int8.safetensors", schema.to_dict())
    fp32_bytes = fp32_export_bytes(init, schema.to_dict(), tmp_path)
    ratio = int8_bytes / fp32_bytes
    assert ratio <= 0.35, f"int8 export {int8_bytes} bytes, {ratio:.3f}x of fp32's {fp32_bytes}"


def tiny(path, *extra):
    return compose_train(
        *tiny_overrides(
            path, "model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4", *extra
        )
    )


@pytest.mark.slow  # 10 CPU-s: the full tier
@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_run_exports_and_scores_the_int8_model(tmp_path, table_path, backend):
    cfg = tiny(table_path, "precision=int8", f"precision.backend={backend}", "trainer.max_epochs=2")
    summary = train(cfg, tmp_path / "run")
    for key in ("int8_test_loss", "fp32_equivalent_test_loss", "export_bytes_int8"):
        assert summary[key] > 0
    assert summary["export_bytes_int8"] < summary["export_bytes_fp32"]
    assert summary["int8_test_loss"] == torch.tensor(
        summary["fp32_equivalent_test_loss"]
    ).item() or (abs(summary["int8_test_loss"] / summary["fp32_equivalent_test_loss"] - 1) < 0.05)
    loaded = load_int8(summary["int8_model"])
    assert isinstance(loaded, TemporalFusionTransformer)


def _final_weights(summary):
    return torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)[
        "state_dict"
    ]


@pytest.mark.slow  # 14 CPU-s: the full tier
def test_int8_resume_matches_an_uninterrupted_run(tmp_path, table_path):
    # (a schedule sized from max_epochs would differ between a 2-epoch and a 3-epoch run)
    common = ("precision=int8", "trainer.deterministic=true", "optim.schedule=none")
    straight = train(tiny(table_path, *common, "trainer.max_epochs=3"), tmp_path / "straight")
    first = train(tiny(table_path, *common, "trainer.max_epochs=2"), tmp_path / "first")
    resumed = train(
        tiny(table_path, *common, "trainer.max_epochs=3", f"ckpt_path={first['last_checkpoint']}"),
        tmp_path / "resumed",
    )
    a, b = _final_weights(straight), _final_weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow  # a training of its own: the full tier (#70)
def test_bf16_trains_on_cpu(tmp_path, table_path):
    summary = train(tiny(table_path, "precision=bf16", "trainer.max_epochs=1"), tmp_path / "run")
    assert summary["metrics"]["test_loss"] > 0


@pytest.mark.slow  # 10 CPU-s: the full tier
def test_bf16_trains_on_a_cpu_whose_onednn_has_no_bf16(tmp_path, table_path):
    """A CPU without AVX-512 (a 2-core AMD EPYC with AVX2): oneDNN has no bf16 LSTM, which
    autocast would hand it (`could not create a primitive descriptor for the LSTM forward
    propagation primitive`). ONEDNN_MAX_CPU_ISA=AVX2 makes this CPU such a one: the LSTMs run
    in float32 under autocast, the rest in bf16."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    overrides = tiny_overrides(
        table_path, "model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4"
    )
    run = tmp_path / "run"
    args = [*overrides, "precision=bf16", "trainer.max_epochs=1", f"hydra.run.dir={run}"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "oneDNN has no bfloat16 on this CPU" in done.stdout + done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["metrics"]["test_loss"] < float("inf")
