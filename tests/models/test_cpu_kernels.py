"""The fused selection's C kernels (float32 on a CPU) against autograd in float64."""

from __future__ import annotations

import contextlib
import os
import platform
import sys

import pytest
import torch

from foxhunt.models import cpu_kernels, fused_vsn, vsn_ops
from foxhunt.models.blocks import GateAddNorm
from foxhunt.models.dropout import Dropout, keep_scale
from foxhunt.models.fused_vsn import selected_grns
from tests.models.test_fused_vsn import autograd_selected_grns, flat, fused_inputs

LOADED = cpu_kernels.library()  # what the model runs (the fixture `build` swaps it per test)
needs_kernels = pytest.mark.skipif(LOADED is None, reason="the C kernels are not built here")

# float32 against float64, each error relative to the largest magnitude of the expected tensor:
# seen up to 1.1e-5 in the gradients (sums over 37 rows of products through K = 48 matmuls)
FORWARD_TOL, BACKWARD_TOL = 1e-5, 5e-5
# n, variable_dim, hidden, rows: a variable_dim the forward does row by row (16) and one it
# does around MKL's matmuls (48), both with a hidden of 32 (the kernels take multiples of 16)
SHAPES = {"row": (5, 16, 32, 37), "chunks": (5, 48, 32, 37)}


@pytest.fixture(autouse=True, params=cpu_kernels.builds() or [None])
def build(request, monkeypatch):
    """Each test runs with every build this CPU runs (setup.py: vectors of 16, 8 and 4 floats),
    not only the one the model loads."""
    if request.param is not None:
        monkeypatch.setattr(cpu_kernels, "library", lambda: cpu_kernels.load(request.param))
    return request.param


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def float32(args):
    def cast(t):
        return t.detach().float().requires_grad_()

    return [
        None if a is None else tuple(map(cast, a)) if isinstance(a, tuple) else cast(a)
        for a in args
    ]


def kernel_mask(n: int, rows: int, dh: int, seed: int | torch.Tensor, p: float) -> torch.Tensor:
    """The kernels' dropout mask [n, rows, dh] as 0/1, from the seed the fused path drew."""
    keep = torch.ones(n, rows, dh)
    vsn_ops.bias_dropout(keep, None, 0, torch.as_tensor(seed), p)
    return keep


def assert_close(got, want, tol):
    for a, b in zip(got, want, strict=True):
        error = (a.double() - b).abs().max() / b.abs().max().clamp_min(1e-12)
        assert error < tol, (tuple(b.shape), float(error))


def test_the_kernels_are_built_where_setup_builds_them():
    """setup.py builds them on Linux and pip goes on without them when the build fails
    (optional): this is what notices a failed build in CI. A build that loads may still be
    refused: a torch that ships its own OpenMP runtime under another name (PyPI's CUDA wheels)
    would run the kernels on a second one (`cpu_kernels.status`)."""
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
        assert cpu_kernels.load("_vsn_kernels") is not None, cpu_kernels.status().reason
        build, reason = cpu_kernels.status()
        assert build is not None or "another OpenMP runtime" in reason, reason


@needs_kernels
@pytest.mark.skipif(bool(os.environ.get(cpu_kernels.CUSTOM)), reason="a build of one's own runs")
def test_the_model_loads_the_build_of_its_cpus_registers(build):
    """The widest vectors this CPU has: GCC turns a comparison of vectors wider than the
    registers into one scalar compare per element (16-float vectors on an AVX2 CPU ran the
    selection 2-3x slower than PyTorch)."""
    level = cpu_kernels.load("_vsn_kernels").x86_level()
    widest = cpu_kernels.load(cpu_kernels.builds()[0])
    assert widest.VECTOR_WIDTH == {4: 16, 3: 8}.get(level, 4)
    assert LOADED is widest
    assert (
        cpu_kernels.library().VECTOR_WIDTH
        == {"_vsn_kernels_avx512": 16, "_vsn_kernels_avx2": 8, "_vsn_kernels": 4}[build]
    )


@needs_kernels
@pytest.mark.skipif(bool(os.environ.get(cpu_kernels.CUSTOM)), reason="a build of one's own runs")
@pytest.mark.parametrize("name", list(cpu_kernels.BUILDS))
def test_every_build_this_cpu_runs_is_tested_and_the_others_are_named(name):
    """The fixture `build` runs every test on each build this CPU runs; a build it cannot run
    is skipped here by name (an AVX2 machine cannot test the AVX-512 build)."""
    level = cpu_kernels.load("_vsn_kernels").x86_level()
    if cpu_kernels.BUILDS[name] > level:
        pytest.skip(f"{name} needs x86-64-v{cpu_kernels.BUILDS[name]}; this CPU is v{level}")
    assert name in cpu_kernels.builds() and cpu_kernels.load(name) is not None


@needs_kernels
@pytest.mark.parametrize("path", SHAPES)
@pytest.mark.parametrize("skip_norm", [True, False])
@pytest.mark.parametrize("chunk_elements", [1, 10**9])  # one variable per chunk, or all
def test_kernels_match_autograd(monkeypatch, path, skip_norm, chunk_elements):
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", chunk_elements)
    n, dh, h, rows = SHAPES[path]
    assert fused_vsn.row_matmuls(dh) == (path == "row")
    args = fused_inputs(n=n, dh=dh, h=h, rows=rows, skip_norm=skip_norm)
    args32 = float32(args)
    assert cpu_kernels.available(args32[0], h)
    out = selected_grns(*args32, dropout=0.0)
    expected = autograd_selected_grns(*args)
    assert_close([out], [expected], FORWARD_TOL)
    with torch.no_grad():  # inference: no autograd Function, fc2's bias folded into the gate
        assert_close([selected_grns(*args32, dropout=0.0)], [expected], FORWARD_TOL)
    d_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).double()
    got = torch.autograd.grad(out, flat(args32), d_out.float())
    want = torch.autograd.grad(expected, flat(args), d_out)
    assert_close(got, want, BACKWARD_TOL)


@needs_kernels
@pytest.mark.parametrize("path", SHAPES)
@pytest.mark.parametrize("recompute", [False, True])
def test_dropout_uses_one_mask_forward_and_backward(monkeypatch, path, recompute):
    """The mask is drawn from a seed in forward and drawn again in backward (and in recompute
    mode again for f and g): the gradients are those of the forward's mask."""
    monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", 2 * 37 * 64)  # chunks of two variables
    n, dh, h, rows = SHAPES[path]
    p = 0.3
    args = fused_inputs(n=n, dh=dh, h=h, rows=rows)
    args32 = float32(args)
    torch.manual_seed(3)
    out = selected_grns(*args32, dropout=p, recompute=recompute)
    torch.manual_seed(3)
    seed = cpu_kernels.draw_seed(p)
    keep = kernel_mask(n, rows, dh, seed, p).transpose(0, 1).double()
    rate = 1 - 1 / keep_scale(p, args32[0])  # p rounded to 1/65536, as the kernels drop
    expected = autograd_selected_grns(*args, keep=keep, p=rate)
    assert_close([out], [expected], FORWARD_TOL)
    got = torch.autograd.grad(out.sum(), flat(args32))
    want = torch.autograd.grad(expected.sum(), flat(args))
    assert_close(got, want, BACKWARD_TOL)


@needs_kernels
def test_masks_keep_the_rate_and_differ_by_variable_and_seed():
    p, n, rows, dh = 0.1, 4, 4096, 16
    keep = kernel_mask(n, rows, dh, seed=12345, p=p)
    assert keep.mean().item() == pytest.approx(1 - p, abs=0.003)
    for j in range(n):  # every variable at the rate, each its own draw
        assert keep[j].mean().item() == pytest.approx(1 - p, abs=0.01)
        assert not torch.equal(keep[j], keep[(j + 1) % n])
    assert not torch.equal(keep, kernel_mask(n, rows, dh, seed=12346, p=p))
    # the mask of variables 2.. is the same when drawn as a chunk that starts there
    tail = torch.ones(n - 2, rows, dh)
    vsn_ops.bias_dropout(tail, None, 2, torch.tensor(12345), p)
    assert torch.equal(tail, keep[2:])


@needs_kernels
def test_outputs_do_not_depend_on_threads_or_chunks(monkeypatch):
    """Rows are split among threads, variables among chunks: a row's output is computed the
    same way whichever split, so it is bit-equal; the parameters' gradients sum the rows per
    thread, equal to rounding."""
    n, dh, h, rows = SHAPES["chunks"]
    args = float32(fused_inputs(n=n, dh=dh, h=h, rows=rows))
    results = []
    for threads, chunk_elements in ((1, 10**9), (2, 10**9), (2, 1)):
        torch.set_num_threads(threads)
        monkeypatch.setattr(fused_vsn, "CHUNK_ELEMENTS", chunk_elements)
        torch.manual_seed(5)
        out = selected_grns(*args, dropout=0.2)
        results.append((out, torch.autograd.grad(out.sum(), flat(args))))
    (out, grads), *others = results
    for other_out, other_grads in others:
        assert torch.equal(out, other_out)
        for a, b in zip(grads, other_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@needs_kernels
def test_hidden_sizes_the_kernels_do_not_take_run_in_pytorch():
    x = torch.zeros(3, 4)
    assert cpu_kernels.available(x, 32)
    assert not cpu_kernels.available(x, 24)  # not a multiple of 16
    assert not cpu_kernels.available(x.double(), 32)
    assert not cpu_kernels.available(x, cpu_kernels.MAX_HIDDEN + 16)


@needs_kernels
@pytest.mark.parametrize("shape", [(7, 32), (3, 5, 16)])
def test_gate_add_norm_matches_pytorch(monkeypatch, shape):
    """GateAddNorm's one-pass kernel (the TFT's gates outside the selection) against its
    PyTorch ops, forward and backward, dropout off."""
    torch.manual_seed(0)
    *lead, h = shape
    gate = GateAddNorm(24, h, dropout=None)
    for p in gate.parameters():  # move off the init values so every term matters
        p.data += 0.1 * torch.randn_like(p)
    x = torch.randn(*lead, 24, requires_grad=True)
    skip = torch.randn(*lead, h, requires_grad=True)
    leaves = [x, skip, *gate.parameters()]
    d_out = torch.randn(*lead, h)

    def run():
        out = gate(x, skip)
        return out, torch.autograd.grad(out, leaves, d_out)

    calls = []
    kernel = cpu_kernels.gate_add_norm
    monkeypatch.setattr(cpu_kernels, "gate_add_norm", lambda *a: calls.append(1) or kernel(*a))
    fused = run()
    assert calls  # the kernel ran
    monkeypatch.setattr(cpu_kernels, "available", lambda *a: False)
    plain = run()
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(fused[1], plain[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_kernels
def test_off_runs_the_pytorch_path_whose_matmuls_the_flop_counter_sees():
    """The bench counts a step's FLOPs by ATen's matmuls; the kernels' (row by row, and g made
    again in backward) are invisible to it, so it counts with them `off`."""
    from torch.utils.flop_counter import FlopCounterMode

    n, dh, h, rows = SHAPES["row"]
    args = float32(fused_inputs(n=n, dh=dh, h=h, rows=rows))

    def flops() -> int:
        with FlopCounterMode(display=False) as counter:
            selected_grns(*args, dropout=0.0).sum().backward()
        return counter.get_total_flops()

    on = flops()
    with cpu_kernels.off():
        assert not cpu_kernels.available(args[0], h)
        off = flops()
    assert cpu_kernels.available(args[0], h)
    # at least the GLU's matmul g = f Wg, forward and its two gradients
    assert off - on >= 3 * 2 * n * rows * dh * 2 * h


@needs_kernels
def test_the_two_paths_draw_other_masks_at_the_same_rate_each_the_same_for_a_seed():
    """As fused_vsn says: without dropout the kernels and the PyTorch path agree; with it, the
    same seed drops other elements on each path, each at the rate p, each the same again for
    the same seed. (A run with the kernels and one without are different draws.)"""
    args = float32(fused_inputs(n=4, dh=16, h=32, rows=256))

    def run(kernels: bool, p: float) -> torch.Tensor:
        torch.manual_seed(11)
        with contextlib.nullcontext() if kernels else cpu_kernels.off():
            return selected_grns(*args, dropout=p).detach()

    assert_close([run(True, 0.0)], [run(False, 0.0).double()], FORWARD_TOL)
    assert torch.equal(run(True, 0.3), run(True, 0.3))
    assert torch.equal(run(False, 0.3), run(False, 0.3))
    assert not torch.allclose(run(True, 0.3), run(False, 0.3), atol=1e-3)
    kept = {}
    for kernels in (True, False):  # nn.Dropout's stand-in alike
        torch.manual_seed(11)
        with contextlib.nullcontext() if kernels else cpu_kernels.off():
            kept[kernels] = (Dropout(0.3).train()(torch.ones(1 << 16)) != 0).float()
        assert kept[kernels].mean().item() == pytest.approx(0.7, abs=0.01)
    assert not torch.equal(kept[True], kept[False])
