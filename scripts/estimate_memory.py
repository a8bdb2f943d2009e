"""Predict a training step's peak memory before allocating it.

    python scripts/estimate_memory.py model=tft_base data.ohlcv.num_features=225 \\
        data.batch_size=128 memory.budget_mb=4096 [+measure=true]

Takes the same overrides as train.py. Prints a table (component, MB) for the training and the
validation step, the largest batch size for memory.budget_mb when one is given, and as its last
line one JSON object. `+measure=true` also runs one real step of each kind on the device.
"""

import json

from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.config import validate
from foxhunt.memory import MB, MemoryEstimate, estimate, max_batch_size, measure
from foxhunt.memory.table import breakdown_rows, format_table


def print_table(result: dict, est: MemoryEstimate) -> None:
    steps = (est.train, est.val)
    rows = [
        ["(batch size)", *(str(s.batch_size) for s in steps)],
        *breakdown_rows([{k: v / MB for k, v in s.parts.items()} for s in steps]),
        ["peak", *(f"{s.total / MB:.1f}" for s in steps)],
    ]
    print(f"{est.device}: {est.params:,} parameters")
    print(format_table(["component", "train MB", "val MB"], rows))
    for kind in ("train", "val"):
        if f"measured_{kind}_peak_mb" in result:
            print(
                f"measured {kind} peak: {result[f'measured_{kind}_peak_mb']:.1f} MB "
                f"(estimate {result[f'{kind}_rel_error']:+.1%})"
            )
    if "max_batch_size" in result:
        print(
            f"largest batch size for {result['budget_mb']:.0f} MB "
            f"(less {result['safety_margin_mb']:.0f} MB margin): {result['max_batch_size']}"
        )


@cli.main("estimate_memory")
def main(cfg: DictConfig) -> None:
    validate(cfg)
    est = estimate(cfg)
    result = est.to_dict()
    if cfg.memory.budget_mb is not None:
        best, _ = max_batch_size(cfg, cfg.memory.budget_mb)
        result |= {
            "budget_mb": cfg.memory.budget_mb,
            "safety_margin_mb": cfg.memory.safety_margin_mb,
            "max_batch_size": best,
        }
    if cfg.get("measure"):
        result |= measure(cfg, est.train.batch_size, est.val.batch_size, device=est.device)
        for kind in ("train", "val"):
            real = result[f"measured_{kind}_peak_mb"]
            result[f"{kind}_rel_error"] = round((result[f"{kind}_peak_mb"] - real) / real, 4)
    print_table(result, est)
    print(json.dumps(result))


if __name__ == "__main__":
    cli.run(main)
