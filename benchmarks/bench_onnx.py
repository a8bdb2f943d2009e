"""ONNX Runtime against PyTorch eager on CPU: latency at batch 1, throughput at batch 1024.

    python benchmarks/bench_onnx.py [--models tft_small,tft_base] [--threads 1]
                                    [--repeats 20] [--batch 1024] [--batch-repeats 3]

For each model (tft_small on the bundled sample's 23 features; tft_base with
data.ohlcv.num_features=225, as benchmarks/bench_precision.py sizes them), untrained weights:
the export as `scripts/export.py` makes it (`foxhunt.precision.onnx.to_onnx`: torch.export, then
torch.onnx), then the forward pass of PyTorch eager (`torch.inference_mode`, the fused variable
selection's inference path) and of ONNX Runtime's CPU provider on the same random windows,
alternating (eager, ONNX Runtime, eager, ...) so that drift of a shared machine hits both
alike; medians. Both run `--threads` intra-op threads. Also the largest difference of their
quantiles, relative to the largest. A table, then one JSON line.

Needs the export extra: `pip install -e ".[export]"`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from foxhunt.conf import CONF_DIR
from foxhunt.config import MIN_OPSET, register_configs
from foxhunt.data.schema import footer_schema
from foxhunt.precision.onnx import (
    OUTPUT,
    OnnxModel,
    difference,
    example_inputs,
    onnx_session,
    to_onnx,
)
from foxhunt.training.module import build_model

MODELS = {
    "tft_small": ["model=tft_small"],
    "tft_base": ["model=tft_base", "data.ohlcv.num_features=225"],
}
warnings.filterwarnings("ignore", message=".*TF32 acceleration on top of oneDNN.*")


def compose_config(overrides: list[str]) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def alternate(first: Callable[[], Any], second: Callable[[], Any], repeats: int) -> tuple:
    """Median seconds of `first` and of `second`, timed in turn `repeats` times each."""
    a, b = [], []
    for _ in range(repeats):
        for fn, times in ((first, a), (second, b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def bench(name: str, threads: int, repeats: int, batch: int, batch_repeats: int) -> dict:
    cfg = compose_config(MODELS[name])
    schema = footer_schema(cfg.data)
    model_cfg = dict(cfg.model)
    model_cfg["quantiles"] = list(model_cfg["quantiles"])
    torch.manual_seed(0)
    model = OnnxModel(build_model(model_cfg, schema).eval(), schema).eval()
    start = time.perf_counter()
    onnx_bytes = to_onnx(model, schema, MIN_OPSET)
    row: dict[str, Any] = {
        "model": name,
        "variables": 1 + len(schema.observed) + len(schema.known),
        "parameters": sum(p.numel() for p in model.parameters()),
        "export_s": time.perf_counter() - start,
        "onnx_bytes": len(onnx_bytes),
    }
    session = onnx_session(onnx_bytes, threads)
    for size, times in ((1, repeats), (batch, batch_repeats)):
        x = example_inputs(schema, size, seed=size)
        feed = {k: v.numpy() for k, v in x.items()}

        def eager(x: dict = x) -> Any:
            with torch.inference_mode():
                return model(**x).numpy()

        def ort(feed: dict = feed) -> Any:
            return session.run([OUTPUT], feed)[0]

        row[f"rel_diff_b{size}"] = difference(ort(), eager())[1]  # (also the warm-up)
        eager_s, ort_s = alternate(eager, ort, times)
        row[f"eager_ms_b{size}"], row[f"ort_ms_b{size}"] = eager_s * 1e3, ort_s * 1e3
        row[f"eager_windows_per_s_b{size}"] = size / eager_s
        row[f"ort_windows_per_s_b{size}"] = size / ort_s
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tft_small,tft_base")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads, both runtimes")
    p.add_argument("--repeats", type=int, default=20, help="timed runs at batch 1")
    p.add_argument("--batch", type=int, default=1024, help="the throughput batch")
    p.add_argument("--batch-repeats", type=int, default=3, help="timed runs at --batch")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cores = os.cpu_count() or 1
    load_start = os.getloadavg()[0]
    rows = [
        bench(m, args.threads, args.repeats, args.batch, args.batch_repeats)
        for m in args.models.split(",")
    ]
    load_end = os.getloadavg()[0]
    b = args.batch
    print(
        f"ONNX Runtime {version('onnxruntime')} vs PyTorch {torch.__version__} eager, CPU, "
        f"{args.threads} thread(s); latency at batch 1 (median of {args.repeats}), throughput "
        f"at batch {b} (median of {args.batch_repeats})"
    )
    header = (
        f"{'model':<10}{'vars':>5}{'params':>10}{'export s':>9}{'MB':>7}"
        f"{'b1 eager ms':>12}{'b1 ort ms':>10}{f'b{b} eager w/s':>16}{f'b{b} ort w/s':>14}"
        f"{'max rel diff':>13}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['model']:<10}{r['variables']:>5}{r['parameters']:>10}{r['export_s']:>9.1f}"
            f"{r['onnx_bytes'] / 2**20:>7.1f}{r['eager_ms_b1']:>12.2f}{r['ort_ms_b1']:>10.2f}"
            f"{r[f'eager_windows_per_s_b{b}']:>16.0f}{r[f'ort_windows_per_s_b{b}']:>14.0f}"
            f"{max(r['rel_diff_b1'], r[f'rel_diff_b{b}']):>13.1e}"
        )
    if max(load_start, load_end) > 0.5 * cores:
        print(
            f"NOTE: load average {max(load_start, load_end):.1f} on {cores} cores: other work "
            "shared the CPU, so these times are slower (and noisier) than on a quiet machine"
        )
    result = {
        "torch": torch.__version__,
        "onnxruntime": version("onnxruntime"),
        "threads": args.threads,
        "cores": cores,
        # 1-min load average at start and end: above half the cores, other work shared the CPU
        "load_avg": [load_start, load_end],
        "rows": rows,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
