"""How good is the memory estimator? Estimated against measured peaks of real steps.

    python benchmarks/bench_memory.py [--device cpu|cuda] [--sizes 8,32,128] [--budget-mb 4096]

For tft_small and tft_base (225 OHLCV features), fp32, at each batch size: the estimate of a
training and a validation step against one real step of each (live tensor bytes from MemTracker
on CPU; max_memory_allocated and max_memory_reserved on CUDA), the time each estimate took, then
the largest batch size for the budget. A table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from foxhunt.conf import CONF_DIR
from foxhunt.config import register_configs
from foxhunt.memory import MB, estimate, max_batch_size, measure

MODELS = {
    "tft_small": ["model=tft_small"],
    "tft_base": ["model=tft_base", "data.ohlcv.num_features=225"],
}


def compose_config(overrides: list[str]) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def bench_model(name: str, sizes: list[int], device: str) -> list[dict[str, Any]]:
    cfg = compose_config(MODELS[name])
    rows = []
    for b in sizes:
        start = time.perf_counter()
        est = estimate(cfg, b, b, device=device)
        seconds = time.perf_counter() - start
        real = measure(cfg, b, b, device=device)
        row = {"model": name, "batch_size": b, "params": est.params, "estimate_s": seconds}
        for kind, step in (("train", est.train), ("val", est.val)):
            measured = real[f"measured_{kind}_peak_mb"]
            row[f"{kind}_estimate_mb"] = step.allocated / MB
            row[f"{kind}_measured_mb"] = measured
            row[f"{kind}_error"] = (step.allocated / MB - measured) / measured
            if f"measured_{kind}_reserved_mb" in real:
                row[f"{kind}_device_estimate_mb"] = step.total / MB
                row[f"{kind}_measured_reserved_mb"] = real[f"measured_{kind}_reserved_mb"]
        rows.append(row)
        print(
            f"{name:<10}{b:>6}{row['train_estimate_mb']:>12.1f}{row['train_measured_mb']:>12.1f}"
            f"{row['train_error']:>+9.1%}{row['val_estimate_mb']:>12.1f}"
            f"{row['val_measured_mb']:>12.1f}{row['val_error']:>+9.1%}{seconds:>9.1f}",
            flush=True,
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--sizes", default="8,32,128")
    p.add_argument("--budget-mb", type=float, default=4096.0)
    p.add_argument("--models", default="tft_small,tft_base")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    torch.manual_seed(0)

    print(f"memory estimator vs real steps, device {args.device}, torch {torch.__version__}")
    print(
        f"{'model':<10}{'batch':>6}{'train est':>12}{'measured':>12}{'error':>9}"
        f"{'val est':>12}{'measured':>12}{'error':>9}{'est s':>9}"
    )
    rows = [r for m in args.models.split(",") for r in bench_model(m, sizes, args.device)]

    base = compose_config(MODELS["tft_base"])
    start = time.perf_counter()
    best, _ = max_batch_size(base, args.budget_mb, device=args.device)
    search_s = time.perf_counter() - start
    plans = {b: estimate(base, b, b, device=args.device) for b in (4, 128)}
    print(
        f"tft_base, 225 features: {plans[4].params:,} parameters; largest batch for "
        f"{args.budget_mb:.0f} MB (less {base.memory.safety_margin_mb:.0f} MB margin): {best} "
        f"(search {search_s:.1f} s)"
    )
    for b, e in plans.items():
        fits = "fits" if e.peak <= (args.budget_mb - base.memory.safety_margin_mb) * MB else "no"
        print(
            f"  batch {b}: train {e.train.total / MB:.1f} MB, val {e.val.total / MB:.1f} MB "
            f"-> {fits} in {args.budget_mb:.0f} MB"
        )
    worst = max(abs(r[f"{k}_error"]) for r in rows for k in ("train", "val"))
    print(
        json.dumps(
            {
                "device": args.device,
                "torch": torch.__version__,
                "rows": rows,
                "worst_abs_error": worst,
                "max_estimate_s": max(r["estimate_s"] for r in rows),
                "tft_base_params": plans[4].params,
                "budget_mb": args.budget_mb,
                "tft_base_max_batch_size": best,
                "tft_base_plans": {b: e.to_dict() for b, e in plans.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
