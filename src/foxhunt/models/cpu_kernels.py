"""The TFT's elementwise chains on a CPU, one pass each (`_vsn_kernels.c`): the fused variable
selection's (`foxhunt.models.fused_vsn`), GateAddNorm's and dropout's (`blocks`, `dropout`).

Each kernel is a torch op, `torch.ops.foxhunt.<name>` (`torch.library`): its CPU implementation
allocates what it returns with torch and has the C module fill it (the module checks every
buffer's size and type before it writes); its fake implementation allocates the same, so the
memory estimator, which traces a step under FakeTensorMode, sees every buffer, and
`torch.library.opcheck` checks each op (tests/models/test_kernel_ops.py). Dropout and
GateAddNorm carry their backward (`register_autograd`); the fused selection's is
`fused_vsn_kernels`'.

The C module is built by `pip install` (setup.py) where a C compiler is found. `status()` says
which build runs, or why none does: not built, failed to load, built for other arguments (ABI)
or from older sources than those beside it (an editable install after an edit), or bound to
another OpenMP runtime than torch's. Then `available()` is False, with one warning, and the callers
run their PyTorch paths.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import importlib
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

log = logging.getLogger(__name__)

ABI = 2  # the version of the C module's functions' arguments (KERNELS_ABI in _vsn_module.c)
MAX_HIDDEN = 4096  # the C code keeps a row of the hidden size on the stack
LANES = 16  # and works on it 16 floats at a time
LEVELS = 1 << 16  # the dropout masks' resolution: 16 bits of a hash (or of random bits) each
HERE = Path(__file__).parent
CUSTOM = "FOXHUNT_CPU_KERNELS"  # the path of a build to run instead of the installed ones


# the builds of _vsn_kernels.c (setup.py), the widest vectors first, and the x86-64 level each
# needs (4: AVX-512, 3: AVX2 and FMA; 1: any CPU)
BUILDS = {"_vsn_kernels_avx512": 4, "_vsn_kernels_avx2": 3, "_vsn_kernels": 1}
# the OpenMP runtimes a process can hold: GNU's, Intel's, LLVM's (under any soname or copy)
OPENMP = re.compile(r"\S*/lib(gomp|iomp5|omp)[-.\w]*\.so[.\d]*")


class Status(NamedTuple):
    """Which build runs (None: the PyTorch paths), and why no other."""

    build: str | None
    reason: str


@cache
def source_stamp() -> str | None:
    """The sha256 of the C sources beside the module (an editable install or a source tree),
    as setup.py stamps a build; None where they are not (a wheel)."""
    sources = sorted(HERE.glob("_vsn_*.c"))
    return (
        hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest() if sources else None
    )


def _import(build: str) -> ModuleType:
    """One build of the C module; with FOXHUNT_CPU_KERNELS set, the baseline build from that
    file instead (a build of your own: the sanitizer build of tests/models/test_sanitizers.py)."""
    path = os.environ.get(CUSTOM)
    if not path:
        return importlib.import_module(f"foxhunt.models.{build}")
    if build != "_vsn_kernels":
        raise ModuleNotFoundError(f"{CUSTOM} gives one build")
    spec = importlib.util.spec_from_file_location(build, path)
    if spec is None or not Path(path).is_file():
        raise ImportError(f"{CUSTOM}={path} is not a file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _open(build: str) -> tuple[ModuleType | None, str]:
    """One build of the C module, or None and why not."""
    try:
        module = _import(build)
    except ModuleNotFoundError:
        note = HERE / f"{build}.not-built"  # (setup.py's line, where the compiler failed)
        why = note.read_text().strip() if note.is_file() else "no C compiler with OpenMP?"
        return None, f"{build} was not built at install ({why})"
    except (ImportError, OSError) as exc:
        return None, f"{build} failed to load: {exc}"
    if getattr(module, "ABI", None) != ABI:
        found = getattr(module, "ABI", "none")
        return None, f"{build} is a build for other arguments (ABI {found}, this foxhunt's {ABI})"
    stamp = source_stamp()
    if stamp is not None and getattr(module, "SOURCE", None) != stamp:
        return None, (
            f"{build} was built from other sources than those in {HERE}: rebuild it "
            "(pip install -e .)"
        )
    return module, ""


@cache
def load(build: str) -> ModuleType | None:
    """One build of the C module, or None where it was not built or cannot run (`status`)."""
    return _open(build)[0]


def openmp_runtimes() -> list[str]:
    """The OpenMP runtime libraries this process has loaded (Linux), each file once: what a
    refusal names."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found = {m.group(0) for m in OPENMP.finditer(maps)}
    return sorted({os.path.realpath(f) for f in found})


def builds() -> list[str]:
    """The builds this CPU runs, the widest first; the baseline build, which runs anywhere,
    says the CPU's level."""
    base = load("_vsn_kernels")
    level = base.x86_level() if base is not None else 0
    return [b for b, need in BUILDS.items() if need <= level and load(b) is not None]


def shares_torch_openmp(module: ModuleType) -> bool:
    """Whether the C module runs on torch's OpenMP runtime: torch's thread count, changed,
    is what the module's runtime reads back. A second runtime (a torch built against Intel's
    or LLVM's, where the module bound GNU's) would run its own thread pool beside torch's."""
    before = torch.get_num_threads()
    probe = before + 1
    torch.set_num_threads(probe)
    try:
        return module.openmp_max_threads() == probe
    finally:
        torch.set_num_threads(before)


@cache
def status() -> Status:
    """The build with the widest vectors this CPU runs, or None and why (said once, as a
    warning): the kernels make the CPU step about 1.5x faster (docs/performance.md)."""
    runs = builds()
    if not runs:
        reason = _open("_vsn_kernels")[1] or "this CPU runs none of the builds"
    elif not shares_torch_openmp(load(runs[0])):
        loaded = openmp_runtimes()
        reason = (
            "they would run on another OpenMP runtime than torch's "
            f"(loaded: {', '.join(loaded) or 'none found'})"
        )
        if {"libomp", "libgomp"} <= {Path(lib).name.split(".")[0] for lib in loaded}:
            reason += "; a clang build on LLVM's beside torch's GNU one: build them with gcc "
            reason += "(CC=gcc pip install -e .)"
    else:
        return Status(runs[0], "")
    log.warning("foxhunt's CPU kernels do not run, the PyTorch paths do: %s", reason)
    return Status(None, reason)


def report(device: str, before: collections.Counter[str]) -> dict[str, object]:
    """What summary.json says of the kernels after a run on `device`: the build that ran (its
    vectors' width in floats) and its calls by kernel since CALLS was `before` (a sweep's runs
    share a process), or why none ran."""
    build, reason = status()
    ran = {op: n for op, n in sorted((CALLS - before).items()) if n}
    if build is not None and not ran:
        reason = (
            f"the model ran on {device}"
            if device != "cpu"
            else "no layer took them (float32, a hidden size that is a multiple of 16)"
        )
    width = None if build is None else load(build).VECTOR_WIDTH
    return {"ran": bool(ran), "build": build, "vector_width": width, "calls": ran} | (
        {} if ran else {"why_not": reason}
    )


def library() -> ModuleType | None:
    """The build of the C module that runs, or None (`status`)."""
    build = status().build
    return None if build is None else load(build)


_OFF = contextvars.ContextVar("foxhunt_cpu_kernels_off", default=False)


@contextmanager
def off() -> Iterator[None]:
    """The PyTorch paths instead of the kernels inside, in this thread or task only: what counts
    FLOPs by ATen's ops (benchmarks/bench_tft.py: the kernels' matmuls are invisible to
    FlopCounterMode)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def exporting() -> bool:
    """Whether torch.export traces this (the ONNX export: its graph takes ATen's ops only).
    torch.compiler.is_exporting() would do, but torch 2.11's dynamo answers it True under
    torch.compile too; the flag it reads (set by torch.export, strict or not) says which."""
    return bool(getattr(torch.compiler, "_is_exporting_flag", torch.compiler.is_exporting()))


@torch.compiler.assume_constant_result
def _runs() -> bool:
    """The library runs and is not turned `off`; under torch.compile, read as a constant when
    the graph is made (dynamo does not trace a context variable)."""
    return not _OFF.get() and library() is not None


def available(x: Tensor, hidden: int = LANES) -> bool:
    """Whether the kernels run on `x` here: float32 on a CPU, not under torch.export (whose
    graph, the ONNX export's, takes ATen's ops only), a hidden size that is a multiple of 16,
    with the library built, not turned `off`. torch.compile keeps them in its graph, as ops."""
    return (
        not exporting()
        and _runs()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and hidden <= MAX_HIDDEN
        and hidden % LANES == 0
    )


def threshold(p: float) -> int:
    """The 16-bit threshold of dropout rate p: an element is kept where its 16 bits clear it,
    so the rate is p rounded to 1/65536 (`foxhunt.models.dropout.keep_scale`)."""
    return round(p * LEVELS)


def threads() -> int:
    return torch.get_num_threads()


def views(*tensors: Tensor | None) -> list:
    """The tensors as the C module takes them: numpy views (None stays None); it checks that
    each is C-contiguous float32 of the size its arguments say before it writes any."""
    return [None if t is None else t.detach().numpy() for t in tensors]


CALLS: collections.Counter[str] = collections.Counter()  # the kernels' calls in this process


def kernel(op: str) -> Callable[..., None]:
    """The C module's function `op` (its call counted in CALLS: what a run's summary says
    ran)."""
    module = library()
    if module is None:
        raise RuntimeError(f"foxhunt's CPU kernels do not run here: {status().reason}")
    CALLS[op] += 1
    return getattr(module, op)


def define(name: str, schema: str) -> None:
    torch.library.define(f"foxhunt::{name}", schema)


# ---- GateAddNorm and dropout, each with its backward -------------------------------------

define("gate_add_norm", "(Tensor g, Tensor skip, Tensor gamma, Tensor beta) -> Tensor")


@torch.library.register_fake("foxhunt::gate_add_norm")
def _gate_add_norm_out(g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    return torch.empty_like(skip)


@torch.library.impl("foxhunt::gate_add_norm", "cpu")
def _gate_add_norm(g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    out = torch.empty_like(skip)
    M, h = skip.shape
    bias = g.new_zeros(2 * h)  # (the C code adds the GLU's bias; a linear layer's has)
    kernel("gate_add_norm")(M, h, *views(g, bias, skip, gamma, beta, out), threads())
    return out


def gate_add_norm(g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    """LayerNorm(GLU(g) + skip) * gamma + beta: g [M, 2h], skip [M, h] -> [M, h]; its backward
    one C pass too (it keeps g, where autograd's ops keep g and the sum)."""
    return torch.ops.foxhunt.gate_add_norm(g, skip, gamma, beta)


define(
    "gate_add_norm_backward",
    "(Tensor g, Tensor skip, Tensor gamma, Tensor beta, Tensor d_out) -> (Tensor, Tensor, Tensor)",
)


@torch.library.register_fake("foxhunt::gate_add_norm_backward")
def _gate_add_norm_grads(
    g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor, d_out: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(g), torch.empty_like(skip), g.new_empty(threads(), 4 * skip.shape[-1])


@torch.library.impl("foxhunt::gate_add_norm_backward", "cpu")
def _gate_add_norm_backward(
    g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor, d_out: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    d_g, d_skip, part = _gate_add_norm_grads(g, skip, gamma, beta, d_out)
    M, h = skip.shape
    bias = g.new_zeros(2 * h)
    kernel("gate_add_norm_backward")(
        M, h, *views(g, bias, skip, gamma, beta, d_out, d_g, d_skip, part), threads()
    )
    return d_g, d_skip, part


def gate_add_norm_backward(
    g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor, d_out: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of `gate_add_norm`'s inputs, in their order."""
    d_g, d_skip, parts = torch.ops.foxhunt.gate_add_norm_backward(g, skip, gamma, beta, d_out)
    d_gamma, d_beta, _ = parts.sum(0).split([skip.shape[-1]] * 2 + [2 * skip.shape[-1]])
    return d_g, d_skip, d_gamma, d_beta


def _gate_add_norm_context(ctx, inputs: tuple, output: Tensor) -> None:  # noqa: ANN001
    ctx.save_for_backward(*inputs)


def _gate_add_norm_grad(ctx, d_out: Tensor) -> tuple[Tensor, ...]:  # noqa: ANN001
    return gate_add_norm_backward(*ctx.saved_tensors, d_out.contiguous())


torch.library.register_autograd(
    "foxhunt::gate_add_norm", _gate_add_norm_grad, setup_context=_gate_add_norm_context
)


def draw_seed(p: float) -> Tensor:
    """A seed for the hashed dropout masks at rate p, drawn from torch's generator
    (torch.manual_seed fixes the masks, a checkpoint's RNG state resumes them), or 0 where
    nothing is dropped. A tensor, the ops' argument: torch.compile draws it in its graph."""
    if not p:
        return torch.zeros((), dtype=torch.int64)
    return torch.randint(0, 2**63 - 1, (), dtype=torch.int64)


define("dropout", "(Tensor x, Tensor seed, float p, float scale) -> Tensor")


@torch.library.register_fake("foxhunt::dropout")
def _dropout_out(x: Tensor, seed: Tensor, p: float, scale: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.impl("foxhunt::dropout", "cpu")
def _dropout(x: Tensor, seed: Tensor, p: float, scale: float) -> Tensor:
    out = torch.empty_like(x)
    kernel("dropout_flat")(x.numel(), int(seed), threshold(p), scale, *views(x, out), threads())
    return out


def dropout(x: Tensor, seed: Tensor, p: float, scale: float) -> Tensor:
    """x * keep * scale, element i kept by the hash of (seed, i): the same mask for the same
    seed, so backward draws it again from the seed instead of keeping it."""
    return torch.ops.foxhunt.dropout(x, seed, p, scale)


def _dropout_context(ctx, inputs: tuple, output: Tensor) -> None:  # noqa: ANN001
    _, seed, ctx.p, ctx.scale = inputs
    ctx.save_for_backward(seed)


def _dropout_grad(ctx, d_out: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
    (seed,) = ctx.saved_tensors
    return dropout(d_out.contiguous(), seed, ctx.p, ctx.scale), None, None, None


torch.library.register_autograd("foxhunt::dropout", _dropout_grad, setup_context=_dropout_context)
