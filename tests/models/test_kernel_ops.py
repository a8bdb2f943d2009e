"""The C kernels as torch ops: opcheck on every op, buffers checked before any write, and a
build that cannot run (stale, foreign, failing to load, a second OpenMP) refused with one
warning, the PyTorch paths running instead."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.library import opcheck

from foxhunt.models import cpu_kernels, vsn_ops
from foxhunt.models.blocks import GateAddNorm
from foxhunt.models.fused_vsn import selected_grns
from tests.models.test_cpu_kernels import float32
from tests.models.test_fused_vsn import flat, fused_inputs

needs_kernels = pytest.mark.skipif(
    cpu_kernels.library() is None, reason="the C kernels are not built here"
)
N, M, DH, H = 3, 5, 16, 32  # variables, rows, variable_dim (a row-path one), hidden
SEED = torch.tensor(7)  # the dropout masks'


@pytest.fixture
def fresh_status():
    """`status` and `load` decided again in the test, and again after it."""
    cpu_kernels.load.cache_clear()
    cpu_kernels.status.cache_clear()
    yield
    cpu_kernels.load.cache_clear()
    cpu_kernels.status.cache_clear()


def r(*shape, seed=[0]):  # noqa: B006 (a counter: every tensor its own draw)
    seed[0] += 1
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed[0]))


def gate(c=N, v=True):
    """A `vsn_ops.Gate` of `c` variables without g (the ops that take one add it)."""
    return [r(c, 2 * H), 1.25, r(c, M).abs(), r(c, M), r(c, M) if v else None,
            r(c, H), r(c, H), r(c, H) if v else None, r(c, H), r(c, H)]  # fmt: skip


def weights(dh=DH):
    return [r(N, M), r(N, dh), r(N, dh), r(N, dh, dh), r(N, dh), r(N, dh, 2 * H)]


def samples():
    """Every op with arguments it takes, (name, args); with and without the optional ones."""
    x, A, C, W2, b2, Wg = weights(48)
    yield "vsn_elu", (x, A, C)
    yield "vsn_bias_dropout", (r(N, M, 48), b2, 0, SEED, 0.2, 1.0, False)
    yield "vsn_bias_dropout", (r(N, M, 48), None, 1, SEED, 0.2, 1.25, True)
    yield "vsn_elu_backward", (x, A, r(N, M, 48), r(N, M, 48), r(N, M))
    yield "vsn_elu_backward", (x, A, r(N, M, 48), r(N, M, 48), torch.empty(0))
    for v in (True, False):
        g = gate(v=v)
        yield "vsn_gate_norm_sum", (r(N, M, 2 * H), *g, r(M, H))
        grads = (r(N, M), r(N, M), r(N, M) if v else None)
        yield "vsn_gate_norm_sum_backward", (r(N, M, 2 * H), *g, r(M, H), *grads)
        x, A, C, W2, b2, Wg = weights()
        bg, scale, s, u, v_, R0, R1, R2, gamma, beta = g
        rows = (s, u, v_, R0, R1, R2, gamma, beta)
        yield "vsn_forward", (x, A, C, W2, b2, Wg, bg, SEED, 0.2, scale, *rows, r(N, M, DH))
        yield "vsn_forward", (x, A, C, W2, b2, Wg, bg, SEED, 0.0, scale, *rows, torch.empty(0))
        for f, d_x in ((r(N, M, DH), r(N, M)), (None, None)):
            args = (*g, r(M, H), x, A, C, W2, b2, Wg, f, SEED, 0.2, *grads, d_x)
            yield "vsn_backward_rows", args
    yield "gate_add_norm", (r(M, 2 * H), r(M, H), r(H), r(H))
    yield "gate_add_norm_backward", (r(M, 2 * H), r(M, H), r(H), r(H), r(M, H))
    yield "dropout", (r(4, 33), SEED, 0.3, 1 / 0.7)


SAMPLES = list(samples())


@needs_kernels
@pytest.mark.parametrize("name, args", SAMPLES, ids=[name for name, _ in SAMPLES])
def test_every_op_passes_opcheck(name, args):
    """Schema (the mutations it declares are the ones it makes), fake (the shapes and dtypes
    the memory estimator traces), autograd registration and AOT dispatch (torch.compile)."""
    opcheck(getattr(torch.ops.foxhunt, name).default, args)


@needs_kernels
@pytest.mark.parametrize("name", ["gate_add_norm", "dropout"])
def test_the_ops_with_a_backward_pass_opcheck_with_gradients(name):
    args = dict(SAMPLES)[name]
    args = tuple(
        a.requires_grad_() if torch.is_tensor(a) and a.is_floating_point() else a for a in args
    )
    opcheck(getattr(torch.ops.foxhunt, name).default, args)


@needs_kernels
def test_a_buffer_of_the_wrong_size_type_or_layout_is_an_error_and_nothing_is_written():
    """The C module checks every buffer before a kernel runs: a stale caller (or an edited
    kernel) fails with a ValueError naming the argument instead of writing out of bounds."""
    lib = cpu_kernels.library()
    x, A, C = (np.ones((2, 8), np.float32), np.ones((2, 16), np.float32),
               np.ones((2, 16), np.float32))  # fmt: skip
    a = np.full((2, 8, 16), 7.0, np.float32)
    lib.vsn_elu(2, 8, 16, x, A, C, a, 1)
    assert not (a == 7.0).any()  # the right sizes: written
    bad = {
        "has 16 float32 elements, the sizes need 32": (A[:, :8].copy(), "A"),
        "is not float32": (A.astype(np.float64), "A"),
        "is not a C-contiguous": (np.ones((16, 2), np.float32).T, "A"),
    }
    for message, (wrong, name) in bad.items():
        out = np.full((2, 8, 16), 7.0, np.float32)
        with pytest.raises(ValueError, match=f"vsn_elu: {name} {message}"):
            lib.vsn_elu(2, 8, 16, x, wrong, C, out, 1)
        assert (out == 7.0).all()
    read_only = np.full((2, 8, 16), 7.0, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="vsn_elu: a is not a C-contiguous, writable buffer"):
        lib.vsn_elu(2, 8, 16, x, A, C, read_only, 1)
    with pytest.raises(ValueError, match="sizes out of range"):
        lib.gate_add_norm(2, 24, *[np.ones(1, np.float32)] * 6, 1)  # a hidden of 24
    with pytest.raises(ValueError, match="x is None"):
        lib.vsn_elu(2, 8, 16, None, A, C, a, 1)


@needs_kernels
def test_the_ops_refuse_a_tensor_they_cannot_take():
    """Through the op too: a non-contiguous input is an error, not a wrong read."""
    x, A = r(N, M), r(N, DH)
    with pytest.raises(ValueError, match="vsn_elu: C is not a C-contiguous buffer"):
        vsn_ops.elu(x, A, r(DH, N).t())
    with pytest.raises(ValueError, match="vsn_elu: C has 24 float32 elements, the sizes need 48"):
        vsn_ops.elu(x, A, r(N, 8))


@pytest.mark.parametrize(
    "break_it, reason",
    [
        (lambda mp: mp.setattr(cpu_kernels, "source_stamp", lambda: "0" * 64), "other sources"),
        (lambda mp: mp.setattr(cpu_kernels, "ABI", cpu_kernels.ABI + 1), "other arguments"),
        (
            lambda mp: mp.setattr(
                cpu_kernels,
                "_import",
                lambda build: (_ for _ in ()).throw(ImportError("undefined symbol: omp_x")),
            ),
            "failed to load: undefined symbol",
        ),
        (lambda mp: mp.setattr(torch, "set_num_threads", lambda n: None), "OpenMP runtime"),
    ],
    ids=["stale", "foreign", "fails_to_load", "two_openmp"],
)
def test_a_build_that_cannot_run_falls_back_with_one_warning(
    fresh_status, monkeypatch, caplog, break_it, reason
):
    if cpu_kernels.library() is None:
        pytest.skip("the C kernels are not built here")
    cpu_kernels.load.cache_clear()
    cpu_kernels.status.cache_clear()
    break_it(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="foxhunt.models.cpu_kernels"):
        x = torch.zeros(2, 32)
        assert not cpu_kernels.available(x, 32)
        assert not cpu_kernels.available(x, 32)  # asked again: said once
        out = torch.nn.functional.dropout(x, 0.5)  # (torch's ops run as ever)
    status = cpu_kernels.status()
    assert status.build is None and reason in status.reason
    warnings = [rec for rec in caplog.records if "CPU kernels do not run" in rec.message]
    assert len(warnings) == 1 and reason in warnings[0].getMessage()
    assert out.shape == x.shape


def test_a_build_the_compiler_failed_says_why_at_install_and_at_run(
    fresh_status, monkeypatch, tmp_path, caplog
):
    """setup.py keeps a failed build's line beside the package (pip shows it only with -v):
    the run's one warning says it."""
    (tmp_path / "_vsn_kernels.not-built").write_text("the compiler failed (no omp.h)\n")
    monkeypatch.setattr(cpu_kernels, "HERE", tmp_path)
    monkeypatch.setattr(cpu_kernels, "_import", lambda build: (_ for _ in ()).throw(
        ModuleNotFoundError(build)))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="foxhunt.models.cpu_kernels"):
        assert not cpu_kernels.available(torch.zeros(2, 32), 32)
    reason = "_vsn_kernels was not built at install (the compiler failed (no omp.h))"
    assert cpu_kernels.status() == (None, reason)
    assert [r.getMessage() for r in caplog.records][-1].endswith(reason)


@needs_kernels
def test_off_holds_in_its_own_thread_only():
    """`off` is a context variable: a benchmark's FLOP count in one thread leaves the kernels
    on in another (a process global flipped them for every thread)."""
    x = torch.zeros(2, 32)
    inside, release = threading.Event(), threading.Event()
    seen = []

    def count():
        with cpu_kernels.off():
            seen.append(cpu_kernels.available(x, 32))
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=count)
    thread.start()
    inside.wait(10)
    assert cpu_kernels.available(x, 32)  # this thread: on
    release.set()
    thread.join()
    assert seen == [False]


@needs_kernels
@pytest.mark.slow  # torch.compile, 2 s: the full tier (#70); opcheck checks the ops here
@pytest.mark.parametrize("dh", [16, 48], ids=["row", "chunks"])
def test_torch_compile_keeps_the_ops_in_its_graphs_with_the_same_masks(dh):
    """Compiled (one graph: fullgraph), the fused selection, GateAddNorm and dropout run as the
    ops in the forward and the backward graph, not as the PyTorch path, and give what eager
    gives with the same seed, dropout masks included (aot_eager: the graphs as traced)."""
    graphs = []

    def record(gm, _inputs):  # noqa: ANN001, ANN202
        # (an op that writes a tensor is called through auto_functionalized, its first argument)
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        graphs.append(
            {str(n.args[0] if "functionalized" in str(n.target) else n.target) for n in calls}
        )
        return make_boxed_func(gm)

    gate = GateAddNorm(32, 32, dropout=0.2)
    args = float32(fused_inputs(n=5, dh=dh, h=32, rows=37))

    def step(*args):  # noqa: ANN202
        selected = selected_grns(*args, dropout=0.2)
        return gate(selected, selected)

    compiled = torch.compile(
        step, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record)
    )
    results = []
    for run in (step, compiled):
        torch.manual_seed(3)
        out = run(*args)
        results.append([out, *torch.autograd.grad(out.square().sum(), flat(args))])
    forward, backward = graphs
    path = "foxhunt.vsn_forward.default" if dh == 16 else "foxhunt.vsn_gate_norm_sum.default"
    assert {path, "foxhunt.gate_add_norm.default", "foxhunt.dropout.default"} <= forward
    ops = {"foxhunt.gate_add_norm_backward.default", "foxhunt.dropout.default"}
    assert ops <= backward and any(op.startswith("foxhunt.vsn_") for op in backward)
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
