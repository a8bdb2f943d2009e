"""Tests for the Temporal Fusion Transformer and its grouped variable selection network."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.errors import ConfigError
from foxhunt.models import TemporalFusionTransformer, tft
from foxhunt.models.blocks import VariableSelectionNetwork
from tests.helpers import ARCH, make_batch
from tests.models.reference_tft import (
    RefVariableSelectionNetwork,
    load_from_grouped,
    parameter_pairs,
)

QUANTILES = (0.1, 0.5, 0.9)


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    # The tensors here are tiny: extra intra-op threads only add overhead, and spinning OpenMP
    # workers slow these tests down fifty-fold when another process is using the CPUs.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CONFIGS = {
    "plain": dict(num_observed=3, num_known=2),
    "statics": dict(num_observed=3, num_known=2, static_cardinalities=(5, 3), num_static_real=2),
    "one_static_real": dict(num_observed=2, num_known=1, num_static_real=1),
    "no_known": dict(num_observed=4, num_known=0, static_cardinalities=(7,)),
    "two_lstm_layers": dict(num_observed=3, num_known=1, lstm_layers=2),
    "one_head": dict(num_observed=3, num_known=1, num_heads=1),
    "variable_dim_equals_hidden": dict(num_observed=2, num_known=1, variable_dim=16),
}


def build(name: str, **overrides) -> tuple[TemporalFusionTransformer, dict[str, torch.Tensor]]:
    kwargs = dict(ARCH, prediction_length=5, hidden_dim=16, num_heads=4, variable_dim=8)
    kwargs.update(CONFIGS[name])
    kwargs.update(overrides)
    model = TemporalFusionTransformer(**kwargs)
    batch = make_batch(model, cardinalities=tuple(kwargs.get("static_cardinalities", ())))
    return model, batch


@pytest.mark.parametrize("name", CONFIGS)
def test_output_shapes(name: str) -> None:
    torch.manual_seed(0)
    model, x = build(name, quantiles=(0.1, 0.25, 0.5, 0.75, 0.9))
    batch, enc_len = x["encoder_cont"].shape[:2]
    horizon = model.prediction_length

    prediction = model(x)
    assert prediction.shape == (batch, horizon, 5)
    assert torch.isfinite(prediction).all()

    out = model.interpret(x)
    assert out["prediction"].shape == (batch, horizon, 5)
    assert out["encoder_variable_weights"].shape == (
        batch,
        enc_len,
        model.num_observed + model.num_known + 1,
    )
    assert out["decoder_variable_weights"].shape == (batch, horizon, model.num_known + 1)
    assert out["static_variable_weights"].shape == (batch, model.num_static_vars)
    assert out["attention"].shape == (batch, horizon, enc_len + horizon)


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_matches_interpret_prediction(name: str) -> None:
    # forward uses scaled_dot_product_attention, interpret explicit scores: same numbers.
    torch.manual_seed(0)
    model, x = build(name)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.interpret(x)["prediction"])


@pytest.mark.parametrize("use_interpret", [False, True])
@pytest.mark.parametrize("step", [0, 2, 4])
def test_causal_decoder(step: int, use_interpret: bool) -> None:
    torch.manual_seed(0)
    model, x = build("statics", num_heads=2)
    model.eval()

    def predict(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return model.interpret(inputs)["prediction"] if use_interpret else model(inputs)

    changed = {k: v.clone() for k, v in x.items()}
    changed["decoder_known"][:, step] += 3.0
    before, after = predict(x), predict(changed)

    torch.testing.assert_close(after[:, :step], before[:, :step], rtol=0, atol=1e-6)
    assert (after[:, step] - before[:, step]).abs().max() > 1e-3


def test_encoder_changes_reach_every_step() -> None:
    torch.manual_seed(0)
    model, x = build("plain")
    model.eval()
    changed = {k: v.clone() for k, v in x.items()}
    changed["encoder_cont"][:, 0] += 3.0
    with torch.no_grad():
        diff = (model(changed) - model(x)).abs().amax(dim=(0, 2))
    assert (diff > 1e-4).all()


@pytest.mark.parametrize("train", [False, True])
def test_variable_weights_are_distributions(train: bool) -> None:
    torch.manual_seed(0)
    model, x = build("statics")
    model.train(train)
    out = model.interpret(x)
    for key in ("encoder_variable_weights", "decoder_variable_weights", "static_variable_weights"):
        weights = out[key]
        assert (weights >= 0).all(), key
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    # The weights actually select: not a constant uniform split.
    assert out["encoder_variable_weights"].std() > 1e-3


def test_single_variable_weights_are_ones() -> None:
    model, x = build("no_known")  # decoder has only the relative time index
    out = model.interpret(x)
    assert torch.equal(out["decoder_variable_weights"], torch.ones(4, 5, 1))
    assert torch.equal(out["static_variable_weights"], torch.ones(4, 1))


@pytest.mark.parametrize("train", [False, True])
def test_attention_rows_are_causal_distributions(train: bool) -> None:
    torch.manual_seed(0)
    model, x = build("plain")
    model.train(train)
    attention = model.interpret(x)["attention"]
    enc_len = x["encoder_cont"].shape[1]
    horizon = model.prediction_length

    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]))
    assert (attention >= 0).all()
    for i in range(horizon):
        assert (attention[:, i, enc_len + i + 1 :] == 0).all()
        assert (attention[:, i, : enc_len + i + 1] > 0).all()


VSN_CASES = {
    "time_axis_with_context": dict(n=5, dim=4, hidden=8, context=6, shape=(3, 7)),
    "static_no_context": dict(n=3, dim=8, hidden=8, context=None, shape=(4,)),
    "dim_larger_than_hidden": dict(n=4, dim=12, hidden=6, context=5, shape=(2, 3)),
    "single_variable": dict(n=1, dim=4, hidden=8, context=6, shape=(2, 5)),
}


@pytest.mark.parametrize("case", VSN_CASES)
def test_grouped_vsn_matches_per_variable_reference(case: str) -> None:
    c = VSN_CASES[case]
    torch.manual_seed(0)
    vsn = VariableSelectionNetwork(c["n"], c["dim"], c["hidden"], 0.1, c["context"]).double()
    ref = RefVariableSelectionNetwork(c["n"], c["dim"], c["hidden"], 0.1, c["context"]).double()
    with torch.no_grad():  # move away from the default init so every term matters
        for p in vsn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    load_from_grouped(ref, vsn)
    vsn.eval()
    ref.eval()

    x = torch.randn(*c["shape"], c["n"], c["dim"], dtype=torch.float64)
    context = None
    if c["context"] is not None:
        context = torch.randn(c["shape"][0], *[1] * (len(c["shape"]) - 1), c["context"])
        context = context.double().requires_grad_()
    x_ref = x.clone().requires_grad_()
    x.requires_grad_()
    context_ref = None if context is None else context.detach().clone().requires_grad_()

    out, weights = vsn(x, context)
    out_ref, weights_ref = ref(x_ref, context_ref)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-5, atol=1e-9)
    assert out.shape == (*c["shape"], c["hidden"])
    assert weights.shape == (*c["shape"], c["n"])

    # A loss that depends on outputs and weights non-uniformly.
    probe = torch.randn_like(out)
    probe_w = torch.randn_like(weights)
    ((out * probe).sum() + (weights * probe_w).sum()).backward()
    ((out_ref * probe).sum() + (weights_ref * probe_w).sum()).backward()

    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-9)
    if context is not None and c["n"] > 1:
        torch.testing.assert_close(context.grad, context_ref.grad, rtol=1e-5, atol=1e-9)
    for name, ref_param, grouped_param, layout in parameter_pairs(ref, vsn):
        torch.testing.assert_close(
            layout(grouped_param.grad), ref_param.grad, rtol=1e-5, atol=1e-9, msg=name
        )


def test_vsn_module_count_does_not_grow_with_variables() -> None:
    # Per-variable work must be stacked weights, not one module per variable.
    small = VariableSelectionNetwork(5, 16, 64, 0.1, 64)
    large = VariableSelectionNetwork(225, 16, 64, 0.1, 64)
    assert len(list(small.modules())) == len(list(large.modules()))
    assert large.single_variable_grns.fc1.weight.shape == (225, 16, 16)


def quantile_loss(prediction: torch.Tensor, target: torch.Tensor, quantiles) -> torch.Tensor:
    q = torch.tensor(quantiles, dtype=prediction.dtype)
    error = target.unsqueeze(-1) - prediction
    return torch.maximum(q * error, (q - 1) * error).mean()


def test_overfits_a_small_batch() -> None:
    torch.manual_seed(0)
    model, x = build("statics", quantiles=QUANTILES, dropout=0.0)
    # A target that depends on the inputs, so fitting it needs the whole network.
    target = x["decoder_known"][..., 0] + x["encoder_cont"][:, -1:, 0] * 0.5
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)

    losses = []
    for _ in range(40):
        optimiser.zero_grad()
        loss = quantile_loss(model(x), target, QUANTILES)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses


def test_parameter_count_matches_pytorch_forecasting_scale() -> None:
    seven = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
    model = TemporalFusionTransformer(
        **{**ARCH, "quantiles": seven}, num_observed=15, num_known=0, prediction_length=6
    )
    count = model.num_parameters()
    print(f"TFT parameters (16 encoder vars, hidden 64, 4 heads, 7 quantiles): {count:,}")
    # pytorch-forecasting reports 266,607 for this setting.
    assert abs(count - 266_607) / 266_607 < 0.05
    assert count == sum(p.numel() for p in model.parameters())


def test_parameter_count_independent_of_lengths() -> None:
    a = TemporalFusionTransformer(**ARCH, num_observed=3, num_known=1, prediction_length=2)
    b = TemporalFusionTransformer(**ARCH, num_observed=3, num_known=1, prediction_length=30)
    assert a.num_parameters() == b.num_parameters()


def test_float64_forward_and_backward() -> None:
    torch.manual_seed(0)
    model, x = build("statics")
    model.double()
    x = {k: (v.double() if v.is_floating_point() else v) for k, v in x.items()}
    prediction = model(x)
    assert prediction.dtype == torch.float64
    prediction.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(hidden_dim=10, num_heads=4),
        dict(quantiles=()),
        dict(static_cardinalities=(0,)),
        dict(num_known=-1),
    ],
)
def test_invalid_config(kwargs) -> None:
    base = dict(ARCH, num_observed=2, num_known=1, prediction_length=3)
    base.update(kwargs)
    with pytest.raises(ConfigError):
        TemporalFusionTransformer(**base)


def test_wrong_input_shapes() -> None:
    model, x = build("plain")
    with pytest.raises(ValueError, match="encoder_cont"):
        model({**x, "encoder_cont": x["encoder_cont"][..., :-1]})
    with pytest.raises(ValueError, match="decoder_known"):
        model({**x, "decoder_known": x["decoder_known"][:, :-1]})


@pytest.mark.parametrize(
    "case", ["time_axis_with_context", "dim_larger_than_hidden", "single_variable"]
)
def test_fused_scalar_vsn_matches_per_variable_reference(case: str) -> None:
    """The fast path (fused, folded prescaler) against the plain per-variable loop."""
    c = VSN_CASES[case]
    torch.manual_seed(1)
    vsn = VariableSelectionNetwork(c["n"], c["dim"], c["hidden"], 0.1, c["context"]).double()
    ref = RefVariableSelectionNetwork(c["n"], c["dim"], c["hidden"], 0.1, c["context"]).double()
    with torch.no_grad():
        for p in vsn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    load_from_grouped(ref, vsn)
    vsn.eval()
    ref.eval()

    scalars = torch.randn(*c["shape"], c["n"], dtype=torch.float64, requires_grad=True)
    w = torch.randn(c["n"], c["dim"], dtype=torch.float64, requires_grad=True)
    b = torch.randn(c["n"], c["dim"], dtype=torch.float64, requires_grad=True)
    context = torch.randn(c["shape"][0], 1, c["context"], dtype=torch.float64)

    out, weights = vsn.forward_scalars(scalars, (w, b), context)
    out_ref, weights_ref = ref(scalars.unsqueeze(-1) * w + b, context)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-5, atol=1e-9)

    probe, probe_w = torch.randn_like(out), torch.randn_like(weights)
    leaves = [scalars, w, b]
    grads = torch.autograd.grad(
        (out * probe).sum() + (weights * probe_w).sum(), leaves, retain_graph=True
    )
    grads_ref = torch.autograd.grad(
        (out_ref * probe).sum() + (weights_ref * probe_w).sum(), leaves, retain_graph=True
    )
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-9)
    ((out * probe).sum() + (weights * probe_w).sum()).backward()
    ((out_ref * probe).sum() + (weights_ref * probe_w).sum()).backward()
    for name, ref_param, grouped_param, layout in parameter_pairs(ref, vsn):
        if grouped_param.grad is None:  # parameters the fused path folds away entirely
            assert ref_param.grad is None or not ref_param.grad.any(), name
            continue
        torch.testing.assert_close(
            layout(grouped_param.grad), ref_param.grad, rtol=1e-5, atol=1e-9, msg=name
        )


@pytest.mark.parametrize("name", CONFIGS)
def test_gradient_checkpointing_gives_the_same_gradients(name: str) -> None:
    model, batch = build(name)
    model.train()
    grads = []
    for on in (False, True):
        model.gradient_checkpointing = on
        model.zero_grad()
        torch.manual_seed(11)
        model(batch).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("onednn_bf16", [True, False])
def test_lstms_under_cpu_bf16_autocast_run_as_onednn_can(monkeypatch, onednn_bf16: bool) -> None:
    """CPU bf16 autocast casts oneDNN's LSTM to bfloat16; where oneDNN has no bfloat16 (a CPU
    without AVX-512) the LSTMs run in float32, the rest of the model in bfloat16."""
    if onednn_bf16 and not tft._onednn_has_bf16():
        pytest.skip("oneDNN has no bfloat16 on this CPU")
    monkeypatch.setattr(tft, "_onednn_has_bf16", lambda: onednn_bf16)
    model, batch = build("two_lstm_layers")
    model.train()
    dtypes = []
    for lstm in (model.lstm_encoder, model.lstm_decoder):
        lstm.register_forward_hook(lambda m, args, out: dtypes.append(out[0].dtype))
    with torch.autocast("cpu", torch.bfloat16):
        out = model(batch)
    out.float().square().mean().backward()
    assert dtypes == [torch.bfloat16 if onednn_bf16 else torch.float32] * 2
    assert out.dtype == torch.bfloat16  # the output layer under autocast either way
    assert all(p.grad is not None for p in model.lstm_encoder.parameters())


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(0.01, 100.0),
    highway=st.booleans(),
    highway_first=st.booleans(),
)
def test_monotone_quantiles_never_cross_for_any_weights(
    seed: int, scale: float, highway: bool, highway_first: bool
):
    torch.manual_seed(seed)
    quantiles = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
    model, x = build(
        "statics", quantiles=quantiles, monotone=True, highway=highway, highway_first=highway_first
    )
    randomize(model, scale)
    for train in (True, False):
        out = model.train(train)(x)
        assert (out.diff(dim=-1) >= 0).all()
    # the independent heads of Lim et al. (monotone=False) with the same weights do cross
    plain = TemporalFusionTransformer(**{**model_kwargs("statics"), "quantiles": quantiles})
    plain.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.startswith("highway.")}
    )
    assert (plain.eval()(x).diff(dim=-1) < 0).any()


def randomize(model: torch.nn.Module, scale: float = 1.0) -> None:
    """Any weights, far from an initialisation (the highway's zeros included)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)


QUANTILES_7 = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)


@pytest.mark.parametrize("monotone", [True, False])
def test_the_highway_is_a_linear_forecast_added_to_every_quantile_output(monotone: bool) -> None:
    torch.manual_seed(0)
    model, x = build("statics", quantiles=QUANTILES_7, monotone=monotone, highway=True)
    randomize(model)
    model.eval()
    horizon, n_q = model.prediction_length, len(QUANTILES_7)
    # monotone: one forecast per step after the monotone head; else one per independent head
    assert model.highway.last_row.out_features == horizon * (1 if monotone else n_q)
    with torch.no_grad():
        highway = model.highway(x["encoder_cont"][:, -1], x["decoder_known"])
        out = model(x)
        body = copy.deepcopy(model)
        body.highway = None
        without = body(x)
    assert highway.shape[-1] == (1 if monotone else n_q) and highway.abs().min() > 0
    assert torch.equal(out, without + highway)  # the same value on every quantile, or one each
    if monotone:
        assert (out.diff(dim=-1) >= 0).all()


def test_the_old_order_adds_the_highway_before_the_monotone_head() -> None:
    # the models saved before #45 (UNSAVED_DEFAULTS): one highway weight per quantile, then
    # the monotone head
    torch.manual_seed(0)
    model, x = build("statics", quantiles=QUANTILES_7, monotone=True, highway=True)
    old, _ = build(
        "statics", quantiles=QUANTILES_7, monotone=True, highway=True, highway_first=True
    )
    assert old.highway.last_row.out_features == old.prediction_length * len(QUANTILES_7)
    assert tft.UNSAVED_DEFAULTS["highway_first"] is True
    randomize(old)
    old.eval()
    heads = []
    old.output_layer.register_forward_hook(lambda m, args, out: heads.append(out))
    with torch.no_grad():
        got = old(x)
        highway = old.highway(x["encoder_cont"][:, -1], x["decoder_known"])
    assert torch.equal(got, old.monotone(heads[0] + highway))
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict(old.state_dict())  # a different model, not a silent reshape


@pytest.mark.parametrize("anchor", [True, False])
def test_an_anchored_level_moves_with_its_last_value(anchor: bool) -> None:
    """anchor (a level target): the target's history shifted by c shifts every quantile by c
    and nothing else, as the naive forecast moves; unanchored, a z-scored level does not."""
    torch.manual_seed(0)
    model, x = build("statics", anchor=anchor)
    randomize(model)
    model.eval()
    shifted = dict(x, encoder_cont=x["encoder_cont"].clone())
    shifted["encoder_cont"][..., 0] += 3.0
    with torch.no_grad():
        moved = model(shifted) - model(x)
    if anchor:
        torch.testing.assert_close(moved, torch.full_like(moved, 3.0), rtol=0, atol=1e-5)
    else:
        assert (moved - 3.0).abs().max() > 0.1


def model_kwargs(name: str) -> dict:
    return dict(ARCH, prediction_length=5, hidden_dim=16, num_heads=4, variable_dim=8) | dict(
        CONFIGS[name]
    )


def test_the_monotone_head_keeps_the_median_and_needs_increasing_levels() -> None:
    torch.manual_seed(0)
    model, x = build("plain", monotone=True)
    raw = model.monotone
    values = torch.tensor([[3.0, -1.0, -2.0]])  # median -1, gaps softplus(3), softplus(-2)
    out = raw(values)[0]
    assert out[1] == -1.0
    assert torch.allclose(out, torch.tensor([-1 - F.softplus(torch.tensor(3.0)), -1.0,
                                             -1 + F.softplus(torch.tensor(-2.0))]))  # fmt: skip
    with pytest.raises(ConfigError, match="increasing"):
        build("plain", monotone=True, quantiles=(0.5, 0.1, 0.9))
