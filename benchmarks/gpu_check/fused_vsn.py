"""Section fused_vsn: the fused variable selection (forward_scalars) against the plain path,
forward and backward, in float64, float32 and under bf16 autocast, and both paths' time and
memory."""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from benchmarks.bench_tft import sync
from benchmarks.gpu_check.common import cell, log, mb, peaks
from foxhunt.memory.budget import free_memory
from foxhunt.memory.table import format_table
from foxhunt.models.blocks import VariableSelectionNetwork

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check
    from benchmarks.gpu_check.sizes import Sizes

# Norm-wise relative error of the fused path against a float64 reference of the plain path.
# float64: the paths agree to ~1e-8 (the fused selection weights resample the embedding with a
# float32 interpolation weight); float32: ~1e-6, the plain path itself ~1e-5 (measured on CPU);
# bf16 autocast: tests/models/test_fused_vsn.py's bounds (forward 2e-2, backward 4e-2). A case
# also passes when the fused error is no larger than the plain path's in the same precision.
VSN_TOLERANCE = {"float64": (1e-6, 1e-6), "float32": (1e-5, 1e-5), "bf16": (2e-2, 4e-2)}


def vsn_problem(
    sizes: Sizes, device: torch.device
) -> tuple[VariableSelectionNetwork, list[Tensor]]:
    """A variable selection network moved off its initial values (so every term matters), its
    inputs (x, the embedding's w and b, the context) and output cotangents, on `device`."""
    n, dim, hidden, context, b, t = sizes.vsn
    g = torch.Generator().manual_seed(0)
    vsn = VariableSelectionNetwork(n, dim, hidden, 0.1, context).eval()
    with torch.no_grad():
        for p in vsn.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    shapes = [(b, t, n), (n, dim), (n, dim), (b, 1, context), (b, t, hidden), (b, t, n)]
    return vsn.to(device), [torch.randn(s, generator=g).to(device) for s in shapes]


def vsn_pass(
    model: nn.Module, data: list[Tensor], fused: bool, bf16: bool
) -> tuple[list[Tensor], list[str]]:
    """Forward (fused: forward_scalars, else the plain embedding path) and backward of
    <out, d_out> + <weights, d_weights> in the model's dtype (under bf16 autocast with `bf16`);
    returns [out, weights, *gradients] and their names."""
    dtype = next(model.parameters()).dtype
    x, w, b = (t.detach().to(dtype).requires_grad_() for t in data[:3])
    context, d_out, d_weights = (t.to(dtype) for t in data[3:])
    with torch.autocast(x.device.type, torch.bfloat16, enabled=bf16):
        if fused:
            out, weights = model.forward_scalars(x, (w, b), context)
        else:
            out, weights = model(x.unsqueeze(-1) * w + b, context)
    loss = (out.to(dtype) * d_out).sum() + (weights.to(dtype) * d_weights).sum()
    names = ["x", "w", "b", *(n for n, _ in model.named_parameters())]
    grads = torch.autograd.grad(loss, [x, w, b, *model.parameters()])
    return [out.detach(), weights.detach(), *grads], ["output", "weights", *names]


def rel_errors(got: list[Tensor], want: list[Tensor], names: list[str]) -> dict[str, Any]:
    """Norm-wise relative errors: the forward's worst (output, weights), the backward's worst
    gradient (and which), and the largest elementwise absolute error."""
    errors = [
        float((g.double() - w).norm() / w.norm().clamp_min(1e-30))
        for g, w in zip(got, want, strict=True)
    ]
    max_abs = max(float((g.double() - w).abs().max()) for g, w in zip(got, want, strict=True))
    worst = max(range(2, len(errors)), key=errors.__getitem__)
    return {
        "forward": max(errors[:2]),
        "backward": errors[worst],
        "worst_gradient": names[worst],
        "max_abs": max_abs,
    }


def time_vsn(
    vsn: nn.Module, data: list[Tensor], fused: bool, bf16: bool, repeats: int
) -> dict[str, float | None]:
    """ms per float32 forward and backward (after one warm-up) and the peak MB above what was
    held."""
    device = data[0].device
    vsn_pass(vsn, data, fused, bf16)
    free_memory(device)
    held = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    with peaks(device) as read:
        read()
        start = time.perf_counter()
        for _ in range(repeats):
            vsn_pass(vsn, data, fused, bf16)
        sync(device)
        ms = (time.perf_counter() - start) * 1000 / repeats
        peak = read()["allocated"]
    return {"ms": round(ms, 2), "peak_mb": mb(peak - held) if peak is not None else None}


def section_fused_vsn(check: Check, budget_s: float) -> dict[str, Any]:
    device = check.device
    vsn, data = vsn_problem(check.sizes, device)
    # fp32 matmuls in full precision for the comparison (TF32 would be a 1e-3 error)
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        vsn64 = copy.deepcopy(vsn).double()
        reference, names = vsn_pass(vsn64, data, fused=False, bf16=False)
        cases: dict[str, Any] = {}
        for label, model, bf16 in (
            ("float64", vsn64, False),
            ("float32", vsn, False),
            ("bf16", vsn, True),
        ):
            fused = rel_errors(vsn_pass(model, data, True, bf16)[0], reference, names)
            # float64: the plain path is the reference itself (error 0), not run again
            plain_out = reference if label == "float64" else vsn_pass(model, data, False, bf16)[0]
            plain = rel_errors(plain_out, reference, names)
            free_memory(device)
            tol_forward, tol_backward = VSN_TOLERANCE[label]
            ok = fused["forward"] <= max(tol_forward, plain["forward"]) and fused[
                "backward"
            ] <= max(tol_backward, plain["backward"])
            cases[label] = {
                "fused": fused,
                "plain": plain,
                "tolerance": [tol_forward, tol_backward],
                "pass": ok,
            }
        del reference, vsn64, plain_out
        free_memory(device)
        timings = {
            f"{'fused' if fused else 'plain'}_{'bf16' if bf16 else 'fp32'}": time_vsn(
                vsn, data, fused, bf16, check.sizes.vsn_repeats
            )
            for bf16 in (False, True)
            for fused in (True, False)
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    n, dim, hidden, context, b, t = check.sizes.vsn
    log(
        f"{n} variables, variable_dim {dim}, hidden {hidden}, context {context}, rows {b}x{t}; "
        "norm-wise relative error against the plain path in float64"
    )
    rows = [
        [
            label,
            cell(c["fused"]["forward"], ".2e"),
            cell(c["plain"]["forward"], ".2e"),
            cell(c["fused"]["backward"], ".2e"),
            cell(c["plain"]["backward"], ".2e"),
            c["fused"]["worst_gradient"],
            f"{c['tolerance'][0]:.0e}/{c['tolerance'][1]:.0e}",
            "pass" if c["pass"] else "FAIL",
        ]
        for label, c in cases.items()
    ]
    log(
        format_table(
            ["", "fwd fused", "plain", "bwd fused", "plain", "worst grad", "tol", ""],
            rows,
            align="lrrrrlrl",
        )
    )
    log(
        format_table(
            ["fwd+bwd", "ms", "peak MB"],
            [[k, cell(v["ms"], ".2f"), cell(v["peak_mb"])] for k, v in timings.items()],
            align="lrr",
        )
    )
    return {
        "status": "ok" if all(c["pass"] for c in cases.values()) else "fail",
        "shape": dict(
            zip(
                ["variables", "variable_dim", "hidden", "context", "batch", "time"],
                check.sizes.vsn,
                strict=True,
            )
        ),
        "cases": cases,
        "timings": timings,
    }
