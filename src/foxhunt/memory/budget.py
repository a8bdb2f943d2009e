"""What memory a run has and uses: a live-tensor counter with an enforced budget on CPU, the
allocator's figures on CUDA, and the same snapshot for both.

PyTorch's CPU allocator keeps no statistics, so `LiveTensorBytes` counts them itself: a
TorchDispatchMode that sees every op's outputs, adds each new storage's bytes and subtracts them
when the storage is freed. With a budget it raises `torch.OutOfMemoryError` as soon as live
tensors exceed it, so every OOM path can be exercised for real on a CPU-only machine. On CUDA the
budget is `torch.cuda.set_per_process_memory_fraction`.
"""

from __future__ import annotations

import gc
import os
import resource
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MB = 2**20


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages created while active (plus those registered with
    `track`), their peak, and enforces `budget` bytes when one is set."""

    def __init__(self, budget: int | None = None) -> None:
        super().__init__()
        self.budget = budget
        self.enabled = True
        self.live = 0
        self.peak = 0
        self._storages: dict[int, weakref.finalize] = {}

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors created before the mode was entered (parameters, buffers)."""
        for t in tensors:
            self._add(t)
        self.peak = max(self.peak, self.live)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _add(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or t.is_meta:
            return
        storage = t.untyped_storage()
        key = storage.data_ptr() or id(storage)
        if key in self._storages:
            return
        n = storage.nbytes()
        self.live += n
        self._storages[key] = weakref.finalize(storage, self._free, key, n)

    def _free(self, key: int, n: int) -> None:
        if self._storages.pop(key, None) is not None:
            self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if not self.enabled:
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        self.peak = max(self.peak, self.live)
        if self.budget is not None and self.live > self.budget:
            live, budget = self.live, self.budget
            del out  # its storages are freed as the error unwinds
            raise torch.OutOfMemoryError(
                f"CPU budget exceeded: {live / MB:.1f} MB of live tensors, "
                f"budget {budget / MB:.1f} MB (memory.budget_mb)"
            )
        return out


_active: LiveTensorBytes | None = None


def live_tensors() -> LiveTensorBytes | None:
    """The counter of the run in progress (CPU), if any."""
    return _active


@contextmanager
def counting_suspended() -> Iterator[None]:
    """Neither count nor enforce inside (the estimator's traces are not the run's memory)."""
    counter = _active
    if counter is None:
        yield
        return
    counter.enabled = False
    try:
        yield
    finally:
        counter.enabled = True


def device_total(device: torch.device) -> int:
    """Bytes the device has: the GPU's memory, or the machine's available RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cuda_fraction(budget: int, context: int, total: int) -> float:
    """The allocator's share of a `total`-byte GPU that keeps it and the context within
    `budget` bytes (a budget at or below the context leaves the allocator nothing)."""
    return min(max(budget - context, 0) / total, 1.0)


@contextmanager
def device_budget(
    device: torch.device,
    budget_mb: float | None,
    track: Iterable[torch.Tensor] = (),
    count: bool = False,
    cuda_context_mb: float = 0.0,
) -> Iterator[LiveTensorBytes | None]:
    """Hold the run to `budget_mb` on `device` while inside. On CPU, live tensors are counted
    whenever `count` or a budget is set (the counter is yielded); on CUDA the allocator is
    capped by a per-process memory fraction, less `cuda_context_mb`: the context sits outside
    the allocator, and a 4 GB card holds both."""
    global _active
    budget = None if budget_mb is None else int(budget_mb * MB)
    if device.type == "cuda":
        if budget is not None:
            index = device.index if device.index is not None else torch.cuda.current_device()
            total = device_total(torch.device("cuda", index))
            fraction = cuda_fraction(budget, int(cuda_context_mb * MB), total)
            torch.cuda.set_per_process_memory_fraction(fraction, index)
        try:
            yield None
        finally:
            if budget is not None:
                torch.cuda.set_per_process_memory_fraction(1.0, index)
        return
    if budget is None and not count:
        yield None
        return
    counter = LiveTensorBytes(budget)
    counter.track(track)
    _active = counter
    try:
        with counter:
            yield counter
    finally:
        _active = None


def snapshot(device: torch.device) -> dict[str, float]:
    """Memory in MB now and the peak since the last `reset_peaks`: CUDA allocated/reserved and
    the device total; CPU live tensor bytes (when counted) and the process RSS."""
    if device.type == "cuda":
        return {
            "allocated_mb": torch.cuda.memory_allocated(device) / MB,
            "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / MB,
            "reserved_mb": torch.cuda.memory_reserved(device) / MB,
            "total_mb": device_total(device) / MB,
        }
    out = {"rss_mb": _rss_bytes() / MB}
    counter = live_tensors()
    if counter is not None:
        out |= {"live_mb": counter.live / MB, "peak_live_mb": counter.peak / MB}
        if counter.budget is not None:
            out["total_mb"] = counter.budget / MB
    return out


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif (counter := live_tensors()) is not None:
        counter.reset_peak()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is what the OS reports
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def free_memory(device: torch.device) -> None:
    """Return what can be returned after an OOM or between phases."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
