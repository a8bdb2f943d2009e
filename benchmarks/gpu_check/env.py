"""Section env: the device, driver, versions, and the memory the CUDA context takes."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import TYPE_CHECKING, Any

import lightning as L
import torch

from benchmarks.gpu_check.common import cell, cuda_usage, log, mb, warm_libraries
from foxhunt.memory.budget import free_memory
from foxhunt.memory.table import format_table

if TYPE_CHECKING:
    from benchmarks.gpu_check.common import Check


def section_env(check: Check, budget_s: float) -> dict[str, Any]:
    device = check.device
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "lightning": L.__version__,
        "hydra": _version("hydra-core"),
        "omegaconf": _version("omegaconf"),
        "pytorch_forecasting": _version("pytorch-forecasting"),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "threads": torch.get_num_threads(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "device_name": platform.processor() or "cpu",
    }
    usage: dict[str, Any] = {}
    if check.cuda:
        smi = check.results["env"]["nvidia_smi_before"]  # taken before CUDA was touched
        props = torch.cuda.get_device_properties(device)
        env |= {
            "device_name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "total_memory_mb": mb(props.total_memory),
            "driver": smi and smi["driver"],
            "cudnn": torch.backends.cudnn.version(),
            "used_before_mb": check.others_mb,
        }
        torch.zeros(1, device=device)  # the context, nothing else
        usage["after_init"] = cuda_usage(device, check.others_mb)
        warm_libraries(device)
        free_memory(device)
        usage["after_libraries"] = cuda_usage(device, check.others_mb)
        # what stays allocated with no tensor alive: cuBLAS workspaces (the caching allocator
        # holds them), counted in max_memory_allocated but in no traced step
        env["persistent_allocated_mb"] = usage["after_libraries"]["allocated_mb"]
    rows = [[k, cell(v, "")] for k, v in env.items()]
    for k, u in usage.items():
        rows.append(
            [
                f"context {k.replace('_', ' ')}",
                f"{cell(u['context_mb'])} MB (device used {u['device_used_mb']:.0f} MB, "
                f"reserved {u['reserved_mb']:.0f} MB)",
            ]
        )
    log(format_table(["", ""], rows))
    return env | usage


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
