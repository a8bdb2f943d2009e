"""Section budget: device_budget's cap (set_per_process_memory_fraction on CUDA) met by
allocations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from benchmarks.gpu_check.common import cell, log, mb
from foxhunt.memory import MB
from foxhunt.memory.budget import device_budget, free_memory
from foxhunt.memory.table import format_table

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check


def section_budget(check: Check, budget_s: float) -> dict[str, Any]:
    """Allocate 64 MB blocks under device_budget(1024 MB) until the cap answers with an OOM;
    then, outside it, more than the cap must allocate again."""
    device, budget_mb, block = check.device, 1024, 64 * MB
    held: list[Tensor] = []
    error = None
    free_memory(device)
    before = torch.cuda.memory_allocated(device) if check.cuda else 0
    with device_budget(device, budget_mb) as counter:
        try:
            while len(held) * block < 4 * budget_mb * MB:
                held.append(torch.empty(block, dtype=torch.uint8, device=device))
        except torch.OutOfMemoryError as exc:
            error = " ".join(str(exc).split())[:200]
        at_oom = {
            "blocks": len(held),
            "allocated_mb": mb(len(held) * block + before),
            "reserved_mb": mb(torch.cuda.memory_reserved(device)) if check.cuda else None,
            "live_mb": mb(counter.live) if counter is not None else None,
        }
    held.clear()
    free_memory(device)
    restored = torch.empty(2 * budget_mb * MB, dtype=torch.uint8, device=device)
    del restored
    free_memory(device)
    ok = error is not None and at_oom["allocated_mb"] <= budget_mb
    result = {
        "status": "ok" if ok else "fail",
        "budget_mb": budget_mb,
        "oom_error": error,
        "at_oom": at_oom,
        "allocates_beyond_after_exit": True,
    }
    log(
        format_table(
            ["budget MB", "blocks of 64 MB", "allocated MB", "reserved MB", "OOM raised"],
            [
                [
                    str(budget_mb),
                    str(at_oom["blocks"]),
                    cell(at_oom["allocated_mb"]),
                    cell(at_oom["reserved_mb"]),
                    "yes" if error else "NO",
                ]
            ],
            align="rrrrl",
        )
    )
    return result
