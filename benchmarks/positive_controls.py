"""Positive controls: does the default recipe find a planted signal? (foxhunt.evaluation.controls)

    python benchmarks/positive_controls.py [--controls observed,known,static,ar1] [--lazy]
        [--out DIR] [override ...]

Each control's panel is written to DIR, trained with `scripts/train.py` (the default recipe plus
the overrides given) and its test forecasts scored against the oracle. Prints a table, then one
JSON line. The model passes a control when it captures at least 80% of the oracle's improvement
in pinball loss over the unconditional forecast and its horizon-1 IC is within 0.1 of the
oracle's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from foxhunt.conf import CONF_DIR
from foxhunt.config import register_configs
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.evaluation.controls import CONTROLS, baseline_forecasts, make_control, score

ROOT = Path(__file__).resolve().parents[1]
CAPTURED, IC_GAP = 0.8, 0.1  # the pass thresholds


def run_control(
    name: str, out: Path, overrides: list[str], lazy: bool = False, instruments: int = 16
) -> dict:
    """Train on control `name` in `out`/<name> and score it; the summary's figures beside."""
    work = out / (name + ("_lazy" if lazy else ""))
    work.mkdir(parents=True, exist_ok=True)
    control = make_control(name, work, instruments=instruments)
    run_dir = work / "run"
    args = [
        *control.overrides,
        f"data.lazy={str(lazy).lower()}",
        f"data.cache_dir={work / 'cache'}",
        f"hydra.run.dir={run_dir}",
        "report=false",
        "trainer.enable_progress_bar=false",
        *overrides,
    ]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *args],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"control {name}: train.py failed:\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    result = score(control, pq.read_table(run_dir / "test_forecasts.parquet"))
    result["passed"] = passed(result)
    cfg = compose_train(args)
    datamodule = ParquetDataModule(cfg.data, seed=cfg.seed)
    datamodule.setup()
    theirs = baseline_forecasts(datamodule.datasets, datamodule.schema, list(cfg.model.quantiles))
    result["baselines"] = {n: score(control, t) for n, t in theirs.items()}
    result |= {
        "lazy": lazy,
        "epochs": summary["epochs"],
        "skill": summary["metrics"].get("skill"),
        "best_baseline": summary["metrics"].get("best_baseline"),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return result


def passed(result: dict) -> bool:
    """At least 80% of the oracle's improvement, and its horizon-1 IC within 0.1."""
    return bool(
        result["captured"] is not None
        and result["captured"] >= CAPTURED
        and abs(result["model_ic_h1"] - result["oracle_ic_h1"]) <= IC_GAP
    )


def compose_train(overrides: list[str]) -> DictConfig:
    """scripts/train.py's config for `overrides` (hydra.* ones left out)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", [o for o in overrides if not o.startswith("hydra.")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controls", default=",".join(CONTROLS))
    parser.add_argument("--lazy", action="store_true", help="the disk-backed window store")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--instruments", type=int, default=16, help="of each control's panel")
    args, overrides = parser.parse_known_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="foxhunt-controls-"))
    results = [
        run_control(c, out, overrides, args.lazy, args.instruments)
        for c in args.controls.split(",")
    ]
    print(
        f"{'control':<10}{'forecast':<10}{'captured':>9}{'IC h1':>7}{'oracle':>7}"
        f"{'epochs':>7}{'wall s':>8}  passed"
    )
    for r in results:
        rows = [("tft", r), *r["baselines"].items()]
        for who, s in rows:
            done = f"{r['epochs']:>7}{r['wall_s']:>8.1f}" if who == "tft" else " " * 15
            print(
                f"{r['control']:<10}{who:<10}{s['captured']:>9.2f}{s['model_ic_h1']:>7.3f}"
                f"{s['oracle_ic_h1']:>7.3f}{done}  {passed(s)}"
            )
    print(json.dumps({"bench": "positive_controls", "overrides": overrides, "results": results}))


if __name__ == "__main__":
    main()
