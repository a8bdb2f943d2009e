"""What several sections share: the check's state (`Check`), the figures' formats, the device's
memory and its CUDA context, and the peaks of what runs in between."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.bench_tft import sync
from benchmarks.gpu_check.sizes import Sizes
from foxhunt.files import write_text
from foxhunt.memory import MB
from foxhunt.memory.budget import LiveTensorBytes

ROOT = Path(__file__).resolve().parents[2]


def log(message: str) -> None:
    print(message, flush=True)


def mb(n_bytes: float | None) -> float | None:
    return None if n_bytes is None else round(n_bytes / MB, 1)


def cell(value: Any, fmt: str = ".1f") -> str:
    if value is None:
        return "-"
    return format(value, fmt) if isinstance(value, float | int) else str(value)


def rel(got: float | None, want: float | None) -> float | None:
    """(got - want) / want, or None."""
    return None if got is None or not want else (got - want) / want


# --- the device and its context ------------------------------------------------------------


def nvidia_smi() -> dict[str, Any] | None:
    """nvidia-smi's view of GPU 0 (it creates no CUDA context in this process), or None."""
    query = "name,driver_version,memory.used,memory.total"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    name, driver, used, total = (s.strip() for s in out.splitlines()[0].split(","))
    return {"name": name, "driver": driver, "used_mb": float(used), "total_mb": float(total)}


def cuda_usage(device: torch.device, others_mb: float | None) -> dict[str, float | None]:
    """The device's used memory now, the allocator's part of it, and the rest: this process's
    CUDA context (kernels, cuBLAS/cuDNN handles) once what others held (`others_mb`) is taken
    off."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used, reserved = (total - free) / MB, torch.cuda.memory_reserved(device) / MB
    context = None if others_mb is None else round(used - reserved - others_mb, 1)
    return {
        "device_used_mb": round(used, 1),
        "reserved_mb": round(reserved, 1),
        "allocated_mb": round(torch.cuda.memory_allocated(device) / MB, 1),
        "context_mb": context,
    }


def warm_libraries(device: torch.device) -> None:
    """One small call into each library a TFT step loads (cuBLAS fp32 and bf16, cuDNN's LSTM,
    attention, LayerNorm), forward and backward: with CUDA's lazy loading the context grows as
    they load."""
    lstm = nn.LSTM(32, 32, batch_first=True).to(device)
    x = torch.randn(4, 8, 32, device=device, requires_grad=True)
    for bf16 in (False, True):
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            out = lstm(x)[0]
            q = out.unsqueeze(1)
            out = F.scaled_dot_product_attention(q, q, q).squeeze(1) @ torch.randn(
                32, 32, device=device
            )
            loss = F.layer_norm(out, (32,)).float().sum()
        loss.backward()
    sync(device)


# --- peaks ------------------------------------------------------------------------------------


@contextmanager
def peaks(device: torch.device) -> Iterator[Callable[[], dict[str, int | None]]]:
    """Peak memory of what runs inside, read by the yielded function (which also resets it):
    the allocator's peaks on CUDA, the live-tensor peak on CPU (foxhunt's own counter, which
    counts only what is allocated inside: a net figure by itself)."""
    counter = None if device.type == "cuda" else LiveTensorBytes()
    sync(device)
    if counter is None:
        torch.cuda.reset_peak_memory_stats(device)

    def read_and_reset() -> dict[str, int | None]:
        sync(device)
        if counter is not None:
            got = {"allocated": counter.peak, "reserved": None}
            counter.reset_peak()
            return got
        got = {
            "allocated": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.max_memory_reserved(device),
        }
        torch.cuda.reset_peak_memory_stats(device)
        return got

    with counter if counter is not None else nullcontext():
        yield read_and_reset


def held_now(device: torch.device) -> dict[str, int | None]:
    """What the allocator holds now (allocated, reserved); None on CPU."""
    if device.type != "cuda":
        return {"allocated": None, "reserved": None}
    sync(device)
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
    }


@dataclass
class Check:
    """A run of the check: its device and sizes, where its results go, and the results so far
    (every section's figures by name, saved after each)."""

    device: torch.device
    sizes: Sizes
    out: Path
    results: dict[str, Any] = field(default_factory=dict)
    others_mb: float | None = None  # device memory in use before this process touched CUDA
    estimate_workers: int = 0  # the estimator section's tracing processes (0: in this one)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def save(self) -> None:
        write_text(self.out / "gpu_check.json", json.dumps(self.results, indent=1, default=str))
