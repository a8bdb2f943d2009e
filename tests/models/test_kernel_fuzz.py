"""The fused selection's C kernels against autograd in float64, on shapes, variable_dims,
thread counts and dropout rates that hypothesis draws (the fixed cases: test_cpu_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foxhunt.models import cpu_kernels, fused_vsn
from foxhunt.models.dropout import keep_scale
from foxhunt.models.fused_vsn import selected_grns
from tests.models.test_cpu_kernels import (
    FORWARD_TOL,
    assert_close,
    float32,
    kernel_mask,
)
from tests.models.test_fused_vsn import autograd_selected_grns, flat, fused_inputs

# the gradients' error, relative to their largest or 1 (the inputs' scale) where that is
# smaller: drawn cases sum up to 41 rows of products through K = 48 (seen 5.9e-5 relative in
# the sanitizer build, -O1 with 4-float vectors), and a gradient of one row and one variable
# can be small by cancellation (0.0067, 2.8e-6 off in float32)
BACKWARD_TOL = 2e-4


def assert_near(got, want, tol):
    for a, b in zip(got, want, strict=True):
        error = (a.double() - b).abs().max() / b.abs().max().clamp_min(1.0)
        assert error < tol, (tuple(b.shape), float(error))


pytestmark = pytest.mark.skipif(
    cpu_kernels.library() is None, reason="the C kernels are not built here"
)

CASES = st.fixed_dictionaries(
    {
        "n": st.integers(1, 7),  # odd counts of variables too
        # the row path (16, 32), the chunks around MKL (48, and 24 and 8: not a multiple of 16)
        "dh": st.sampled_from([8, 16, 24, 32, 48]),
        "h": st.sampled_from([16, 32, 48]),
        "rows": st.integers(1, 41),
        "threads": st.integers(1, 3),
        "p": st.sampled_from([0.0, 0.1, 0.5]),
        "skip_norm": st.booleans(),
        "recompute": st.booleans(),
        "chunk_elements": st.sampled_from([1, 10**9]),  # a variable a chunk, or all
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=CASES)
def test_the_kernels_match_autograd_on_drawn_cases(case):
    n, dh, h, rows, p = case["n"], case["dh"], case["h"], case["rows"], case["p"]
    threads, chunk_elements = torch.get_num_threads(), fused_vsn.CHUNK_ELEMENTS
    fused_vsn.CHUNK_ELEMENTS = case["chunk_elements"]  # (hypothesis: no monkeypatch per case)
    try:
        torch.set_num_threads(case["threads"])
        args = fused_inputs(n=n, dh=dh, h=h, rows=rows, skip_norm=case["skip_norm"],
                            seed=case["seed"])  # fmt: skip
        args32 = float32(args)
        assert cpu_kernels.available(args32[0], h)
        torch.manual_seed(case["seed"])
        out = selected_grns(*args32, dropout=p, recompute=case["recompute"])
        keep, rate = None, 0.0
        if p:  # the kernels' mask, drawn again from the seed the selection drew
            torch.manual_seed(case["seed"])
            seed = cpu_kernels.draw_seed(p)
            keep = kernel_mask(n, rows, dh, seed, p).transpose(0, 1).double()
            rate = 1 - 1 / keep_scale(p, args32[0])
        expected = autograd_selected_grns(*args, keep=keep, p=rate)
        assert_close([out], [expected], FORWARD_TOL)
        d_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).double()
        got = torch.autograd.grad(out, flat(args32), d_out.float())
        want = torch.autograd.grad(expected, flat(args), d_out)
        assert_near(got, want, BACKWARD_TOL)
    finally:
        torch.set_num_threads(threads)
        fused_vsn.CHUNK_ELEMENTS = chunk_elements
