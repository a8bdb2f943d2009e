"""What int8 saves and what it does not: fp32 against int8 quantization-aware training.

    python benchmarks/bench_precision.py [--models tft_small,tft_base] [--steps 5]

For each model, on this machine: the peak memory of one training step (MemTracker, live tensor
bytes) and the step time (forward, loss, backward, fused AdamW) for fp32 and for int8 QAT; then
the export's bytes (the float32 safetensors export against the int8 one, the same metadata
in both: `foxhunt.precision.int8.fp32_export_bytes`, `foxhunt.quantization.export_int8`) and the
evaluation latency of the fp32 model against the exported int8 model (`load_int8`). A table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from foxhunt.conf import CONF_DIR
from foxhunt.config import register_configs
from foxhunt.data.schema import footer_schema, random_batch
from foxhunt.memory import MB, measure
from foxhunt.precision.int8 import fp32_export_bytes
from foxhunt.quantization import export_int8, load_int8, set_qat_phase
from foxhunt.training.module import build_model, make_optimizer, model_init
from foxhunt.training.step import train_step

MODELS = {
    "tft_small": (["model=tft_small"], 64),
    "tft_base": (["model=tft_base", "data.ohlcv.num_features=225"], 16),
}


def compose_config(overrides: list[str]) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def step_time(model_cfg: dict, schema: Any, precision: dict, batch_size: int, steps: int) -> float:
    """Seconds per training step after one warm-up step."""
    torch.manual_seed(0)
    model = build_model(model_cfg, schema, precision).train()
    optimizer = make_optimizer(model.parameters(), {"lr": 1e-3, "weight_decay": 1e-2})
    batch = random_batch(schema, batch_size)
    q = torch.tensor(model_cfg["quantiles"])
    train_step(model, optimizer, batch, q)
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, batch, q)
    return (time.perf_counter() - start) / steps


@torch.no_grad()
def latency_ms(model: torch.nn.Module, batch: dict, repeats: int) -> float:
    model(batch)
    start = time.perf_counter()
    for _ in range(repeats):
        model(batch)
    return (time.perf_counter() - start) / repeats * 1000


def bench(name: str, steps: int) -> dict[str, Any]:
    overrides, batch_size = MODELS[name]
    row: dict[str, Any] = {"model": name, "batch_size": batch_size}
    for precision in ("fp32", "int8"):
        cfg = compose_config([*overrides, f"precision={precision}"])
        schema = footer_schema(cfg.data)
        model_cfg = dict(cfg.model)
        model_cfg["quantiles"] = list(model_cfg["quantiles"])
        p = {"name": precision}
        row[f"{precision}_train_peak_mb"] = measure(cfg, batch_size, batch_size, device="cpu")[
            "measured_train_peak_mb"
        ]
        row[f"{precision}_step_s"] = step_time(model_cfg, schema, p, batch_size, steps)
    # export: a briefly trained QAT model (observers need data), against the fp32 weights
    torch.manual_seed(0)
    qat = build_model(model_cfg, schema, {"name": "int8"}).train()
    batch = random_batch(schema, batch_size)
    for _ in range(3):
        qat(batch)
    qat.eval()
    set_qat_phase(qat, observe=False, fake_quant=True)
    init = model_init(model_cfg, schema)
    fp32 = build_model(model_cfg, schema).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model_int8.safetensors"
        row["int8_export_bytes"] = export_int8(qat, init, path)
        int8 = load_int8(path)
        row["fp32_weight_bytes"] = fp32_export_bytes(init, None, Path(tmp))
    repeats = 20 if name == "tft_small" else 3
    row["fp32_eval_ms"] = latency_ms(fp32, batch, repeats)
    row["int8_eval_ms"] = latency_ms(int8, batch, repeats)
    with torch.no_grad():
        ref, out = qat(batch), int8(batch)
    row["int8_vs_fake_quant_mean_abs_rel_std"] = float((out - ref).abs().mean() / ref.std())
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tft_small,tft_base")
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    rows = [bench(m, args.steps) for m in args.models.split(",")]
    print(f"fp32 vs int8 (QAT, then export), CPU, torch {torch.__version__}")
    header = (
        f"{'model':<10}{'batch':>6}{'train MB fp32':>14}{'int8 QAT':>10}{'step s fp32':>12}"
        f"{'int8 QAT':>10}{'weights fp32':>13}{'int8 (ratio)':>19}{'eval ms fp32':>13}{'int8':>8}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['model']:<10}{r['batch_size']:>6}{r['fp32_train_peak_mb']:>14.1f}"
            f"{r['int8_train_peak_mb']:>10.1f}{r['fp32_step_s']:>12.3f}{r['int8_step_s']:>10.3f}"
            f"{r['fp32_weight_bytes'] / MB:>12.2f}M{r['int8_export_bytes'] / MB:>9.2f}M"
            f" ({r['int8_export_bytes'] / r['fp32_weight_bytes']:.3f}x)"
            f"{r['fp32_eval_ms']:>13.1f}{r['int8_eval_ms']:>8.1f}"
        )
    print(json.dumps({"torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
