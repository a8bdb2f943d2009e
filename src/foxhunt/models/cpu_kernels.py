"""The TFT's elementwise chains on a CPU, one pass each (`_vsn_kernels.c`): the fused variable
selection's (`foxhunt.models.fused_vsn`), GateAddNorm's and dropout's (`blocks`, `dropout`).

Each function takes float32 tensors, allocates what it returns with torch (so that the memory
estimator, which runs the same code under FakeTensorMode, sees every buffer) and fills it in C
through ctypes; under FakeTensorMode only the allocations happen. The C library is built by
`pip install` (setup.py) where a C compiler is found; without it, `available()` is False and
the callers run their PyTorch paths.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import NamedTuple

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

# each C function's arguments, a letter each: i int64, p a tensor's pointer (or NULL), f float,
# s a seed (uint64), t a dropout threshold (uint32), n the thread count (int)
_SIGNATURES = {
    "vsn_elu": "iii pppp n",
    "vsn_bias_dropout": "iiii s t f ppp n",
    "vsn_gate_norm_sum": "iii pp f ppppppppp n",
    "vsn_gate_norm_sum_backward": "iii pp f pppppppppppppp n",
    "vsn_elu_backward": "iii pppppp n",
    "vsn_forward": "iiii ppppppp s t f pppppppppp n",
    "vsn_backward_rows": "iiii p f pppppppppppppppppp s t ppppp n",
    "gate_add_norm": "ii pppppp n",
    "gate_add_norm_backward": "ii ppppppppp n",
    "dropout_flat": "i s t f pp n",
}
_TYPES = {
    "i": ctypes.c_int64,
    "p": ctypes.c_void_p,
    "f": ctypes.c_float,
    "s": ctypes.c_uint64,
    "t": ctypes.c_uint32,
    "n": ctypes.c_int,
}
MAX_HIDDEN = 4096  # the C code keeps a row of the hidden size on the stack
LANES = 16  # and works on it 16 floats at a time
# the partial sums of vsn_gate_norm_sum_backward, each `hidden` wide per variable (bias: 2)
GATE_PARTS = ("gamma", "beta", "R0", "R1", "R2", "bias")
LEVELS = 1 << 16  # the dropout masks' resolution: 16 bits of a hash (or of random bits) each


class Gate(NamedTuple):
    """What turns a chunk's GLU matmul g [c, M, 2h] into its weighted, layer-normalised rows:
    sum_j s_j LayerNorm_j(GLU(scale g_j + bias_j) + R0_j + u_j R1_j + v_j R2_j) with the affine
    gamma_j, beta_j. bias [c, 2h]; s, u, v [c, M]; R0, R1, R2, gamma, beta [c, h]; v and R2 None
    without a resampled skip."""

    g: Tensor
    bias: Tensor
    scale: float
    s: Tensor
    u: Tensor
    v: Tensor | None
    R0: Tensor
    R1: Tensor
    R2: Tensor | None
    gamma: Tensor
    beta: Tensor

    def pointers(self) -> list:
        """Its arguments to the C functions, in their order."""
        g, bias, scale, *rest = self
        return [_ptr(g), _ptr(bias), scale, *map(_ptr, rest)]


# the builds of _vsn_kernels.c (setup.py), the widest vectors first, and the x86-64 level each
# needs (4: AVX-512, 3: AVX2 and FMA; 1: any CPU)
BUILDS = {"_vsn_kernels_avx512": 4, "_vsn_kernels_avx2": 3, "_vsn_kernels": 1}


@cache
def load(build: str) -> ctypes.CDLL | None:
    """One build of the C library, or None where `pip install` could not build it."""
    spec = importlib.util.find_spec(f"foxhunt.models.{build}")
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(spec.origin)  # loaded after torch: OpenMP is the runtime torch loaded
    for name, letters in _SIGNATURES.items():
        getattr(lib, name).argtypes = [_TYPES[c] for c in letters.replace(" ", "")]
        getattr(lib, name).restype = None
    return lib


def builds() -> list[str]:
    """The builds this CPU runs, the widest first; the baseline build, which runs anywhere,
    says the CPU's level."""
    base = load("_vsn_kernels")
    level = base.vsn_x86_level() if base is not None else 0
    return [b for b, need in BUILDS.items() if need <= level and load(b) is not None]


@cache
def library() -> ctypes.CDLL | None:
    """The build with the widest vectors this CPU runs, or None where none was built."""
    runs = builds()
    return load(runs[0]) if runs else None


_OFF = [False]  # `off()` is in effect


@contextmanager
def off() -> Iterator[None]:
    """The PyTorch paths instead of the kernels inside: what counts FLOPs by ATen's ops
    (benchmarks/bench_tft.py: the kernels' matmuls are invisible to FlopCounterMode)."""
    before, _OFF[0] = _OFF[0], True
    try:
        yield
    finally:
        _OFF[0] = before


def available(x: Tensor, hidden: int = LANES) -> bool:
    """Whether the kernels run on `x` here: float32 on a CPU, eager (not under torch.compile
    or torch.export), a hidden size that is a multiple of 16, with the library built, not
    turned `off`."""
    return (
        not _OFF[0]
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and hidden <= MAX_HIDDEN
        and hidden % LANES == 0
        and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
        and library() is not None
    )


def threshold(p: float) -> int:
    """The 16-bit threshold of dropout rate p: an element is kept where its 16 bits clear it,
    so the rate is p rounded to 1/65536 (`foxhunt.models.dropout.keep_scale`)."""
    return round(p * LEVELS)


def _ptr(t: Tensor | None) -> int | None:
    if t is None:
        return None
    if not t.is_contiguous() or t.dtype != torch.float32:  # C reads it as dense float32
        raise TypeError(f"C kernel input {tuple(t.shape)} {t.dtype} is not contiguous float32")
    return t.data_ptr()


def _real(*tensors: Tensor) -> bool:
    """False under FakeTensorMode: the allocations are traced, nothing is computed."""
    return not any(isinstance(t, FakeTensor) for t in tensors)


def _threads() -> int:
    return torch.get_num_threads()


def elu(x: Tensor, A: Tensor, C: Tensor) -> Tensor:
    """ELU(x A + C) per variable: x [c, M], A and C [c, dh] -> [c, M, dh]."""
    c, M = x.shape
    dh = A.shape[-1]
    a = x.new_empty(c, M, dh)
    if _real(x):
        library().vsn_elu(c, M, dh, _ptr(x), _ptr(A), _ptr(C), _ptr(a), _threads())
    return a


def bias_dropout(
    f: Tensor,
    bias: Tensor | None,
    first: int,
    seed: int,
    p: float,
    scale: float = 1.0,
    column_sums: bool = False,
) -> Tensor | None:
    """f [c, M, dh] = (f + bias) * keep * scale in place, the dropout mask of variables
    first..first+c-1 drawn from `seed` (the same elements in forward and backward; p = 0: none
    dropped). With `column_sums`, also returns the result's sums over the rows [c, dh]."""
    c, M, dh = f.shape
    sums = f.new_empty(_threads(), c, dh) if column_sums else None
    if _real(f):
        library().vsn_bias_dropout(
            c, M, dh, first, seed, threshold(p), scale, _ptr(bias), _ptr(f), _ptr(sums), _threads()
        )
    return None if sums is None else sums.sum(0)


def gate_norm_sum(gate: Gate, out: Tensor) -> None:
    """out [M, h] += the chunk's weighted, layer-normalised rows (`Gate`)."""
    c, M, h2 = gate.g.shape
    if _real(gate.g):
        library().vsn_gate_norm_sum(c, M, h2 // 2, *gate.pointers(), _ptr(out), _threads())


def gate_norm_sum_backward(
    gate: Gate, d_out: Tensor, d_s: Tensor, d_u: Tensor, d_v: Tensor | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The backward of `gate_norm_sum`: d_g [c, M, 2h] (the gradient of scale g + bias), d_s,
    d_u and d_v filled in [c, M], and the parameters' gradients summed over the rows
    (GATE_PARTS, each [c, h]; bias [c, 2h])."""
    c, M, h2 = gate.g.shape
    h = h2 // 2
    d_g = torch.empty_like(gate.g)
    parts = d_g.new_empty(_threads(), c, (len(GATE_PARTS) + 1) * h)
    if _real(d_g):
        library().vsn_gate_norm_sum_backward(
            c,
            M,
            h,
            *gate.pointers(),
            *map(_ptr, (d_out, d_g, d_s, d_u, d_v, parts)),
            _threads(),
        )
    sums = parts.sum(0).split([h] * (len(GATE_PARTS) - 1) + [2 * h], dim=-1)
    return d_g, dict(zip(GATE_PARTS, sums, strict=True))


def elu_backward(
    x: Tensor, A: Tensor, a: Tensor, d_a: Tensor, d_x: Tensor | None
) -> tuple[Tensor, Tensor]:
    """From d_a [c, M, dh], the gradient of a = ELU(x A + C): d_x [c, M] filled in (if given)
    and (d_A, d_C), each [c, dh]."""
    c, M, dh = a.shape
    parts = a.new_empty(_threads(), c, 2 * dh)
    if _real(a):
        library().vsn_elu_backward(c, M, dh, *map(_ptr, (x, A, a, d_a, d_x, parts)), _threads())
    d_A, d_C = parts.sum(0).split(dh, dim=-1)
    return d_A, d_C


def forward(
    x: Tensor,
    A: Tensor,
    C: Tensor,
    W2: Tensor,
    b2: Tensor,
    Wg: Tensor,
    bg: Tensor,
    seed: int,
    p: float,
    scale: float,
    s: Tensor,
    u: Tensor,
    v: Tensor | None,
    R0: Tensor,
    R1: Tensor,
    R2: Tensor | None,
    gamma: Tensor,
    beta: Tensor,
    f_out: Tensor | None = None,
) -> Tensor:
    """The whole fused selection's forward in one pass, its matmuls row by row (for a small
    variable_dim, where MKL's batched matmuls would write g first): sum_j s_j GRN_j(x_j) [M, h].
    f_out [n, M, dh], when given, receives fc2's output (bias and mask applied), from which
    `backward_rows` makes the rest again."""
    n, M = x.shape
    dh, h = A.shape[-1], gamma.shape[-1]
    out = x.new_zeros(M, h)
    if _real(x):
        library().vsn_forward(
            n,
            M,
            dh,
            h,
            *map(_ptr, (x, A, C, W2, b2, Wg, bg)),
            seed,
            threshold(p),
            scale,
            *map(_ptr, (s, u, v, R0, R1, R2, gamma, beta, out, f_out)),
            _threads(),
        )
    return out


def backward_rows(
    gate: Gate,
    d_out: Tensor,
    x: Tensor,
    A: Tensor,
    C: Tensor,
    W2: Tensor,
    b2: Tensor,
    Wg: Tensor,
    f: Tensor | None,
    seed: int,
    p: float,
    d_s: Tensor,
    d_u: Tensor,
    d_v: Tensor | None,
    d_x: Tensor | None,
) -> dict[str, Tensor]:
    """The whole backward of `forward` row by row, for a small variable_dim: from f [n, M, dh]
    as `forward` kept it (None: made again from x, recompute mode) it makes g again, and goes
    back through the gate, fc2's mask and ELU, the weights' gradients added up too: no tensor of
    [n, M, 2h] is written. Fills d_s, d_u, d_v, d_x [n, M]; returns the sums over the rows of
    GATE_PARTS (bias [n, 2h]), b2, A, C ([n, dh] each), Wg [n, dh, 2h] and W2 [n, dh, dh]
    (gate.g is not read: None will do)."""
    n, M = x.shape
    h, dh = gate.gamma.shape[-1], A.shape[-1]
    sizes = [h] * (len(GATE_PARTS) - 1) + [2 * h, dh, dh, dh, dh * 2 * h, dh * dh]
    parts = x.new_empty(_threads(), n, sum(sizes))
    if _real(x):
        W2T, WgT = W2.transpose(1, 2).contiguous(), Wg.transpose(1, 2).contiguous()
        library().vsn_backward_rows(
            n,
            M,
            dh,
            h,
            *gate.pointers()[1:],
            *map(_ptr, (d_out, x, A, C, W2, b2, Wg, W2T, WgT, f)),
            seed,
            threshold(p),
            *map(_ptr, (d_s, d_u, d_v, d_x, parts)),
            _threads(),
        )
    names = (*GATE_PARTS, "b2", "A", "C", "Wg", "W2")
    sums = dict(zip(names, parts.sum(0).split(sizes, dim=-1), strict=True))
    sums["Wg"] = sums["Wg"].reshape(n, dh, 2 * h)
    sums["W2"] = sums["W2"].reshape(n, dh, dh)
    return sums


def gate_add_norm(g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    """LayerNorm(GLU(g) + skip) * gamma + beta: g [M, 2h], skip [M, h] -> [M, h]."""
    M, h = skip.shape
    out = torch.empty_like(skip)
    if _real(g):
        bias = g.new_zeros(2 * h)  # (the C code adds the GLU's bias; a linear layer's has)
        library().gate_add_norm(M, h, *map(_ptr, (g, bias, skip, gamma, beta, out)), _threads())
    return out


def gate_add_norm_backward(
    g: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor, d_out: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of `gate_add_norm`'s inputs, in their order."""
    M, h = skip.shape
    d_g, d_skip = torch.empty_like(g), torch.empty_like(skip)
    parts = g.new_empty(_threads(), 4 * h)
    if _real(g):
        bias = g.new_zeros(2 * h)  # (held here: C reads it after the pointers are taken)
        library().gate_add_norm_backward(
            M, h, *map(_ptr, (g, bias, skip, gamma, beta, d_out, d_g, d_skip, parts)), _threads()
        )
    d_gamma, d_beta, _ = parts.sum(0).split([h, h, 2 * h])
    return d_g, d_skip, d_gamma, d_beta


def draw_seed(x: Tensor) -> int:
    """A seed for the hashed dropout masks, drawn from torch's generator (torch.manual_seed
    fixes the masks, a checkpoint's RNG state resumes them); 0 under FakeTensorMode."""
    if not _real(x):
        return 0
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


def dropout(x: Tensor, seed: int, p: float, scale: float) -> Tensor:
    """x * keep * scale, element i kept by the hash of (seed, i): the same mask for the same
    seed, so backward draws it again from the seed instead of keeping it."""
    out = torch.empty_like(x)
    if _real(x):
        library().dropout_flat(x.numel(), seed, threshold(p), scale, _ptr(x), _ptr(out), _threads())
    return out
