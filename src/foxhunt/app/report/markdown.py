"""The run report's sections on the run itself, as markdown lines: configuration, data and
splits, futures rolls, batch sizes and memory, learning curves, test metrics, calibration and
interpretation (the scores' sections: `foxhunt.app.report.scores`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.predict.interpret import PLOTS
from foxhunt.app.render import markdown_table
from foxhunt.app.report.figures import (
    PANEL_LISTED,
    SHOWN,
    bar_time,
    memory_highlights,
    panel_splits,
    split_ranges,
)
from foxhunt.app.report.plots import LEARNING_CURVES
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.run.dir import RunDir

CONFIG_KEYS = [  # the settings the report shows, in this order
    "data.path",
    "data.target",
    "data.features",
    "data.encoder_length",
    "data.prediction_length",
    "model.hidden_dim",
    "model.num_heads",
    "model.lstm_layers",
    "model.dropout",
    "model.quantiles",
    "precision.trainer_precision",
    "precision.qat",
    "optim.lr",
    "optim.schedule",
    "trainer.max_epochs",
    "memory.budget_mb",
    "seed",
]


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    """A report's markdown table: None shown as '-'."""
    return markdown_table(head, rows, missing="-")


def config_section(run_dir: Path, cfg: DictConfig, summary: dict[str, Any]) -> list[str]:
    """The run's overrides, config groups and main settings."""
    lines = ["## Configuration", ""]
    saved = RunDir(run_dir).overrides
    if saved.is_file():
        overrides = list(OmegaConf.load(saved))
        shown = " ".join(f"`{o}`" for o in overrides) if overrides else "none (the defaults)"
        lines += [f"Overrides: {shown}", ""]
    if summary.get("resumed_from"):
        lines += [f"Resumed from `{summary['resumed_from']}`", ""]
    chosen = RunDir(run_dir).hydra / "hydra.yaml"
    if chosen.is_file():  # the option of each config group (model=tft_small, memory=default)
        choices = OmegaConf.load(chosen).hydra.runtime.choices
        groups = [f"`{g}={c}`" for g, c in choices.items() if c and not g.startswith("hydra")]
        lines += [f"Groups: {' '.join(groups)}", ""]
    rows = []
    for key in CONFIG_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if OmegaConf.is_config(value):  # model.quantiles: shown as a plain list
            value = OmegaConf.to_container(value)
        rows.append([f"`{key}`", value])
    return lines + table(["key", "value"], rows)


def data_section(datamodule: ParquetDataModule) -> list[str]:
    """The instruments, rows and features, and each split's windows and dates."""
    schema = datamodule.schema
    rows = len(datamodule.datasets["train"].target)
    instruments = schema.groups or ["(one series)"]
    names = ", ".join(instruments)
    if len(instruments) > PANEL_LISTED:
        names = ", ".join(instruments[:SHOWN]) + ", ... (all in summary.json's splits)"
    lines = [
        "## Data",
        "",
        f"- Instruments ({len(instruments)}): {names}",
        f"- Rows: {rows:,} (after feature warm-up and NaN handling)",
        f"- Features: {schema.num_features} ({len(schema.observed)} observed, "
        f"{len(schema.known)} known in the future, {len(schema.static)} static); "
        f"target `{schema.target}` ({schema.target_kind}), encoder {schema.encoder_length} "
        f"bars, forecast {schema.prediction_length} bars",
    ]
    if schema.target_scales:
        low, high = (f(schema.target_scales) / schema.target_scale for f in (min, max))
        lines.append(
            f"- Target scale: each instrument's own ({low:.2g}x to {high:.2g}x the pooled "
            f"{schema.target_scale:.3g}), a static input of the model"
        )
    else:
        lines.append(f"- Target scale: one for every instrument ({schema.target_scale:.3g})")
    if schema.target_anchor:
        lines.append("- A level target: forecast as its move from the last value")
    if schema.skipped:
        skipped = ", ".join(f"`{c}` ({why})" for c, why in schema.skipped.items())
        lines.append(f"- Not numeric, so left out by `data.features=all`: {skipped}")
    if schema.dropped:
        dropped = ", ".join(f"`{c}`" for c in schema.dropped)
        lines.append(f"- Constant over the training split, so not given to the model: {dropped}")
    lines.append("")
    ranges = split_ranges(datamodule)
    if len(instruments) > PANEL_LISTED:
        head = ["split", "instruments", "windows", "per instrument (min / median / max)"]
        lines += table([*head, "from", "to"], panel_splits(ranges))
    else:
        each = [
            [r["instrument"], r["split"], r["windows"], r["rows"], r.get("start"), r.get("end")]
            for r in ranges
        ]
        lines += table(["instrument", "split", "windows", "rows", "from", "to"], each)
    if ranges and "start" not in ranges[0]:
        lines += ["", "(Dates not shown: data.nan_policy=drop or the time column unreadable.)"]
    return lines


def rolls_section(datamodule: ParquetDataModule) -> list[str]:
    """data.futures: when each root's continuous series moved to its next contract."""
    rolls = getattr(datamodule, "rolls", [])
    if not rolls:
        return []
    rows = [
        [
            bar_time(np.datetime64(r.time_ns, "ns")),
            r.from_id,
            r.to_id,
            r.factor,
            "yes" if r.held_at_end else "no",
        ]
        for r in rolls
    ]
    return [
        "## Futures rolls",
        "",
        f"{len(rolls)} rolls (`rolls.csv`; `data.futures.roll`): from each roll on the next "
        "contract is held; earlier prices are multiplied by the factor (the next contract's "
        "close over the front's at the last common bar: the inputs, ratios of prices, are each "
        "contract's own whatever `roll.adjust` says). Each root's last `to` is held at the end "
        "of the data.",
        "",
        *table(["first bar held", "from", "to", "factor", "held at the end"], rows),
    ]


def memory_section(summary: dict[str, Any]) -> list[str]:
    """The batch sizes, the peak memory, the batch-size search and OOM backoffs, the log."""
    memory = summary.get("memory") or {}
    rows = [
        ["training batch size (per process)", summary.get("batch_size")],
        ["validation batch size", summary.get("val_batch_size")],
        ["processes", summary.get("world_size", 1)],
        ["device", memory.get("device")],
        ["peak memory MB", memory.get("peak_mb")],
    ]
    if "searched_batch_size" in memory:
        rows += [
            ["searched batch size", memory["searched_batch_size"]],
            ["searched validation batch size", memory.get("searched_val_batch_size")],
            ["search trials", len(memory.get("search_trials") or [])],
        ]
    backoffs = memory.get("oom_backoffs") or []
    rows.append(["OOM backoffs", len(backoffs)])
    micro = {k: v for k, v in (memory.get("micro_batch_size") or {}).items() if v}
    if micro:
        rows.append(["micro-batch sizes after backoff", micro])
    if "optimizer_state_released_mb" in memory:
        rows.append(["optimizer state released MB", memory["optimizer_state_released_mb"]])
    lines = ["## Batch sizes and memory", "", *table(["", "value"], rows)]
    for event in backoffs:
        lines.append(f"- backoff: {event}")
    log_lines = memory.get("log") or []
    if log_lines:
        shown = memory_highlights(log_lines)
        lines += ["", f"Memory log ({len(shown)} of {len(log_lines)} lines):", "", "```"]
        lines += [*shown, "```"]
    return lines


def curves_section(epochs: dict[int, dict[str, float]], drew: bool) -> list[str]:
    """The learning curves' table, and their plot where it was drawn (`drew`)."""
    lines = ["## Learning curves", ""]
    if not epochs:
        return [*lines, "No logged epochs (the CSV logger writes csv/metrics.csv)."]
    if drew:
        lines += [f"![learning curves]({LEARNING_CURVES})", ""]
    rows = [[e, v.get("train_loss_epoch"), v.get("val_loss")] for e, v in epochs.items()]
    return lines + table(["epoch", "train loss", "validation loss"], rows)


def metrics_section(summary: dict[str, Any], interpretation: dict[str, Any]) -> list[str]:
    """The test metrics beside the naive baseline's."""
    m = summary.get("metrics") or {}
    loss, baseline = m.get("test_loss"), m.get("baseline_test_loss")
    rows = [
        ["quantile loss (normalized)", loss, baseline],
        ["MAE of the median (target units)", m.get("test_mae"), interpretation.get("baseline_mae")],
        ["directional accuracy", m.get("test_directional_accuracy"), None],
        ["outer-interval coverage", m.get("test_coverage"), None],
    ]
    if "int8_test_loss" in summary:
        rows.append(["quantile loss, exported int8 model", summary["int8_test_loss"], baseline])
    val_loss = m.get("val_loss")
    val = f"{val_loss:.4g}" if val_loss is not None else "-"
    lines = ["## Test metrics", "", f"Validation loss (best checkpoint): {val}", ""]
    lines += table(["metric", "model", "naive baseline"], rows)
    if loss is not None and baseline:
        change = loss / baseline - 1
        than = f"{abs(change):.1%} {'lower' if change < 0 else 'higher'} than"
        lines += ["", f"The model's test loss is {than} the naive baseline's."]
    kind = interpretation.get("target_kind")
    naive = "a zero return" if kind == "return" else "the last observed value"
    return [*lines, "", f"Naive baseline: {naive} for every forecast step."]


def calibration_section(interpretation: dict[str, Any]) -> list[str]:
    """The share of test targets at or below each predicted quantile, and quantile crossing."""
    cal = interpretation["calibration"]
    rows = [
        [q, observed, observed - q]
        for q, observed in zip(cal["quantiles"], cal["observed_coverage"], strict=True)
    ]
    return [
        "## Calibration",
        "",
        "Share of test targets at or below each predicted quantile (ideal: the quantile level).",
        "",
        *table(["quantile", "observed", "observed - ideal"], rows),
        "",
        f"Quantile crossing (predicted quantiles out of order, sorted before scoring): "
        f"{cal['quantile_crossing_rate']:.2%} of forecast steps.",
    ]


def interpretation_section(interpretation: dict[str, Any]) -> list[str]:
    """The top variables of each network, the attention's peak, the interpretation's plots."""
    lines = [
        "## Interpretation",
        "",
        f"Over {interpretation['windows']:,} test windows (`interpretation.json` has the numbers).",
    ]
    for net, found in interpretation["variable_importance"].items():
        if found["names"]:
            top = sorted(zip(found["weights"], found["names"], strict=True), reverse=True)[:5]
            lines.append(f"- Top {net} variables: " + ", ".join(f"`{n}` {w:.3f}" for w, n in top))
    by_lag = interpretation["attention"]["by_lag"]
    peak = int(np.argmax(by_lag)) + 1
    lines.append(f"- Attention peaks at lag {peak} (1 = the latest bar before the forecast).")
    titles = {
        "variable_importance": "variable importance",
        "attention_by_lag": "attention by lag",
        "forecast_fan": "forecast fan chart",
    }
    for name in PLOTS:
        if name in interpretation["plots"]:
            lines += ["", f"![{titles[name]}]({interpretation['plots'][name]})"]
    if not interpretation["plots"]:
        lines += ["", "(No plots: matplotlib is not installed.)"]
    return lines
