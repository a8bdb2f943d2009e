"""What a trained TFT looks at and how well its quantiles are calibrated, over the test split:
variable importance (mean selection weights), attention by lag, observed coverage of each
quantile, written as `interpretation.json` and PNG plots (`foxhunt interpret`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.predict.inference import (
    data_changes,
    required_checkpoint,
    run_device,
    training_data_config,
)
from foxhunt.app.render import have_matplotlib, new_figure
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.schema import DataSchema
from foxhunt.errors import ConfigError, DataError
from foxhunt.files import check_writable, write_json
from foxhunt.precision import precision_of
from foxhunt.training.checkpoint_io import load_module, read_checkpoint_hparams

log = logging.getLogger(__name__)
NETWORKS = ("static", "encoder", "decoder")
PLOTS = {
    "variable_importance": "variable_importance.png",
    "attention_by_lag": "attention_by_lag.png",
    "forecast_fan": "forecast_fan.png",
}
MAX_FAN_INSTRUMENTS = 6  # rows of the fan chart; more would not be readable in one image


def variable_names(schema: DataSchema, model: torch.nn.Module) -> dict[str, list[str]]:
    """The inputs of each variable selection network of the TFT `model`, in its order (the
    instrument's embedding first, where it has one)."""
    embedded = model.instrument_rows > 0
    return {
        "static": (["instrument"] if embedded else []) + schema.static_inputs,
        "encoder": [f"{schema.target} (target)", *schema.observed, *schema.known, "relative time"],
        "decoder": [*schema.known, "relative time"],
    }


def _median_index(quantiles: list[float]) -> int:
    return min(range(len(quantiles)), key=lambda i: abs(quantiles[i] - 0.5))


class _Sums:
    """Running sums over the test windows: memory does not grow with the split."""

    def __init__(
        self, schema: DataSchema, names: dict[str, list[str]], quantiles: list[float]
    ) -> None:
        e, h = schema.encoder_length, schema.prediction_length
        self.median_index = _median_index(quantiles)
        self.windows = 0
        self.steps = 0  # windows x horizon steps
        self.weights = {k: torch.zeros(len(v), dtype=torch.float64) for k, v in names.items()}
        self.attention = torch.zeros(h, e + h, dtype=torch.float64)
        self.below = torch.zeros(len(quantiles), dtype=torch.float64)
        self.crossed = 0.0
        self.abs_error = 0.0  # of the median, normalized units
        self.baseline_abs_error = 0.0

    def add(
        self, out: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], schema: DataSchema
    ) -> None:
        pred = out["prediction"].float()
        target = batch["target"].float()
        n, h = target.shape
        self.windows += n
        self.steps += n * h
        weights = {
            "static": out["static_variable_weights"],
            "encoder": out["encoder_variable_weights"],
            "decoder": out["decoder_variable_weights"],
        }
        for name, w in weights.items():
            if w.shape[-1]:
                self.weights[name] += w.double().reshape(-1, w.shape[-1]).sum(0).cpu()
        self.attention += out["attention"].double().sum(0).cpu()
        # quantiles that cross are put back in order (rearrangement), and the rate reported
        self.crossed += float((pred.diff(dim=-1) < 0).any(dim=-1).sum())
        ordered = pred.sort(dim=-1).values
        self.below += (target.unsqueeze(-1) <= ordered).double().sum((0, 1)).cpu()
        median = ordered[..., self.median_index]
        scale = batch["target_scale"].double()[:, None]  # to the target's units, per window
        self.abs_error += float(((median - target).abs().double() * scale).sum())
        if schema.target_kind == "return":  # the naive forecast, as the test metrics score it
            reference = torch.full_like(target, -schema.target_center / schema.target_scale)
        else:
            reference = batch["target_last"].float()[:, None].expand_as(target)
        self.baseline_abs_error += float(((reference - target).abs().double() * scale).sum())


def interpret(
    module: Any,
    datamodule: ParquetDataModule,
    out_dir: str | Path,
    top_k: int = 10,
    windows_per_instrument: int = 3,
    plots: bool = True,
) -> dict[str, Any]:
    """Variable importance, attention by lag and per-quantile coverage of a `TFTModule` over
    the test split; writes `interpretation.json` and (with matplotlib, when `plots`) the PNGs
    into `out_dir` and returns what the JSON holds."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema: DataSchema = module.schema
    model = module.model
    dataset = datamodule.datasets["test"]
    if len(dataset) == 0:
        raise DataError("the test split has no windows to interpret: raise data.test_fraction")
    quantiles = [float(q) for q in module.hparams.model["quantiles"]]
    was_training = model.training
    model.eval()
    precision_of(module.hparams).for_inference(model)  # as the test split is scored
    device = module.device
    sums = _Sums(schema, variable_names(schema, model), quantiles)
    instrument_of_window = dataset.window_series()  # for the fan chart
    try:
        with torch.no_grad():
            for batch in datamodule.test_dataloader(sharded=False):
                batch = {k: v.to(device) for k, v in batch.items()}
                sums.add(model.interpret(batch), batch, schema)
            fan = _fan_windows(model, schema, dataset, instrument_of_window, windows_per_instrument)
    finally:
        model.train(was_training)

    result = _summarize(sums, schema, variable_names(schema, model), quantiles)
    result["forecast_windows"] = fan
    result["plots"] = {}
    if plots and have_matplotlib():
        _plot_importance(out / PLOTS["variable_importance"], result, top_k)
        _plot_attention(out / PLOTS["attention_by_lag"], result)
        drawn = ["variable_importance", "attention_by_lag"]
        if fan:
            marks = _roll_marks(fan, dataset, schema, getattr(datamodule, "rolls", []))
            _plot_fan(out / PLOTS["forecast_fan"], fan, schema, quantiles, marks)
            drawn.append("forecast_fan")
        result["plots"] = {k: PLOTS[k] for k in drawn}
    write_json(out / "interpretation.json", result)
    return result


def _summarize(
    sums: _Sums, schema: DataSchema, names: dict[str, list[str]], quantiles: list[float]
) -> dict[str, Any]:
    e, h = schema.encoder_length, schema.prediction_length
    rows = {"static": sums.windows, "encoder": sums.windows * e, "decoder": sums.windows * h}
    importance = {
        net: {
            "names": names[net],
            "weights": (sums.weights[net] / max(rows[net], 1)).tolist(),
        }
        for net in NETWORKS
    }
    attention = sums.attention / max(sums.windows, 1)  # [horizon step, key position]
    # lag: bars before the first forecast step; the last encoder bar is lag 1
    by_lag_and_step = attention[:, :e].flip(-1)
    pooled = {"center": schema.target_center, "scale": schema.target_scale}
    return {
        "split": "test",
        "windows": sums.windows,
        "target": schema.target,
        "target_kind": schema.target_kind,
        "encoder_length": e,
        "prediction_length": h,
        "variable_importance": importance,
        "attention": {
            "lags": list(range(1, e + 1)),
            "by_lag": by_lag_and_step.mean(0).tolist(),
            "by_lag_and_horizon": by_lag_and_step.tolist(),
            # each forecast step's attention on the forecast steps up to itself (causal)
            "decoder_by_horizon": attention[:, e:].tolist(),
            "decoder_share_by_horizon": attention[:, e:].sum(-1).tolist(),
        },
        "calibration": {
            "quantiles": quantiles,
            "observed_coverage": (sums.below / max(sums.steps, 1)).tolist(),
            "quantile_crossing_rate": sums.crossed / max(sums.steps, 1),
        },
        "mae": sums.abs_error / max(sums.steps, 1),
        "baseline_mae": sums.baseline_abs_error / max(sums.steps, 1),
        # the pooled target centre and scale; per_instrument: each instrument on its own
        "normalization": pooled | {"per_instrument": bool(schema.target_scales)},
    }


def _fan_windows(
    model: torch.nn.Module,
    schema: DataSchema,
    dataset: Any,
    instrument_of_window: np.ndarray,
    per_instrument: int,
) -> list[dict[str, Any]]:
    """A few test windows per instrument, spread over its test period, in the target's units:
    the encoder history, the realised future and the predicted quantiles (put in order)."""
    if per_instrument <= 0:
        return []
    chosen: list[tuple[str, int]] = []
    for g in np.unique(instrument_of_window)[:MAX_FAN_INSTRUMENTS]:
        where = np.flatnonzero(instrument_of_window == g)
        picks = np.unique(np.linspace(0, len(where) - 1, per_instrument).round().astype(int))
        name = dataset.series.names[g] if schema.groups else schema.target
        chosen += [(name, int(where[p])) for p in picks]
    batch = dataset.__getitems__([i for _, i in chosen])  # one gather, as the loaders do
    device = next(model.parameters()).device
    pred = model({k: v.to(device) for k, v in batch.items()}).float().sort(dim=-1).values.cpu()
    group = dataset.group[dataset.starts[[i for _, i in chosen]]].numpy()
    center, scale = dataset.series.centre[group], dataset.series.scale[group]

    def units(x: torch.Tensor, j: int) -> list:
        return (x.double() * scale[j] + center[j]).tolist()

    return [
        {
            "instrument": name,
            "window": index,  # position in the test split
            "history": units(batch["encoder_cont"][j, :, 0], j),
            "actual": units(batch["target"][j], j),
            "quantiles": units(pred[j], j),  # [horizon step][quantile]
        }
        for j, (name, index) in enumerate(chosen)
    ]


def _plot_importance(path: Path, result: dict[str, Any], top_k: int) -> None:
    """Horizontal bars of the top-k mean selection weights, one panel per network."""
    panels = []
    for net, found in result["variable_importance"].items():
        if not found["names"]:
            continue  # no static inputs
        order = np.argsort(found["weights"])[::-1][:top_k]
        names = [found["names"][i] for i in order]
        panels.append((net, names, [found["weights"][i] for i in order], len(found["names"])))
    heights = [len(names) + 2 for _, names, _, _ in panels]
    fig = new_figure(figsize=(8, 0.3 * sum(heights) + 0.8))
    axes = fig.subplots(len(panels), 1, height_ratios=heights, squeeze=False)[:, 0]
    for ax, (net, names, weights, total) in zip(axes, panels, strict=True):
        y = np.arange(len(names))
        ax.barh(y, weights, color="tab:blue", height=0.7)
        ax.set_yticks(y, names)
        ax.invert_yaxis()  # the most important on top
        ax.set_xlim(0, max(weights) * 1.2)
        for yi, w in zip(y, weights, strict=True):
            ax.text(w, yi, f" {w:.3f}", va="center", fontsize=8)
        shown = f"top {len(names)} of {total}" if len(names) < total else f"{total}"
        plural = "s" if total > 1 else ""
        ax.set_title(f"{net} variable selection ({shown} variable{plural})", loc="left")
        ax.set_xlabel("mean selection weight")
    fig.suptitle(f"Variable importance over {result['windows']:,} test windows")
    fig.savefig(path, dpi=110)


def _plot_attention(path: Path, result: dict[str, Any]) -> None:
    """Mean attention on each encoder bar against its lag, for the mean forecast step and
    the first and last ones."""
    att = result["attention"]
    lags = att["lags"]
    fig = new_figure(figsize=(8, 4.2))
    ax = fig.subplots()
    steps = att["by_lag_and_horizon"]
    if len(steps) > 1:
        ax.plot(lags, steps[0], color="tab:green", lw=1, alpha=0.8, label="forecast step 1")
        ax.plot(
            lags, steps[-1], color="tab:red", lw=1, alpha=0.8, label=f"forecast step {len(steps)}"
        )
    ax.plot(lags, att["by_lag"], color="tab:blue", lw=2, marker="o", ms=3, label="mean of steps")
    ax.set_xlim(0.5, max(lags) + 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("lag: bars before the first forecast step (1 = the latest bar)")
    ax.set_ylabel("attention weight")
    share = float(np.mean(att["decoder_share_by_horizon"]))
    ax.set_title(
        f"Attention over the encoder, mean of {result['windows']:,} test windows\n"
        f"({share:.1%} of the attention goes to the forecast steps themselves)",
        fontsize=11,
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)


def _roll_marks(
    fan: list[dict[str, Any]], dataset: Any, schema: DataSchema, rolls: list[Any]
) -> dict[int, list[int]]:
    """data.futures: for each fan window, the bars (from the forecast start) where the
    continuous series rolls to its next contract."""
    if not rolls:
        return {}
    at = np.array([r.time_ns for r in rolls])
    span = np.arange(schema.encoder_length + schema.prediction_length)
    marks = {}
    for w in fan:
        times = dataset.time_ns[int(dataset.starts[w["window"]]) + span].numpy()
        rows = np.flatnonzero(np.isin(times, at))
        marks[w["window"]] = (rows - schema.encoder_length + 1).tolist()
    return marks


def _plot_fan(
    path: Path,
    fan: list[dict[str, Any]],
    schema: DataSchema,
    quantiles: list[float],
    rolls: dict[int, list[int]] | None = None,
) -> None:
    """Per instrument (rows) a few test windows: recent history, realised future, the median
    forecast and its quantile bands; with data.futures, the rolls to the next contract."""
    names = list(dict.fromkeys(w["instrument"] for w in fan))
    cols = max(sum(w["instrument"] == n for w in fan) for n in names)
    fig = new_figure(figsize=(4.4 * cols, 3.0 * len(names) + 0.6))
    axes = fig.subplots(len(names), cols, squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    # returns are tiny numbers: basis points read better
    factor, unit = (1e4, " (bp)") if schema.target_kind == "return" else (1.0, "")
    if schema.target_transform != "none":  # the model's own target, not the raw return
        unit = f", {schema.target_transform}{unit}"
    h = schema.prediction_length
    history = min(schema.encoder_length, max(3 * h, 24))  # the recent past, to keep h readable
    mid = _median_index(quantiles)
    pairs = [(i, len(quantiles) - 1 - i) for i in range(len(quantiles) // 2)]
    col = dict.fromkeys(names, 0)
    for w in fan:
        ax = axes[names.index(w["instrument"]), col[w["instrument"]]]
        col[w["instrument"]] += 1
        ax.set_visible(True)
        past = np.asarray(w["history"][-history:]) * factor
        q = np.asarray(w["quantiles"]) * factor
        x_past, x_future = np.arange(1 - history, 1), np.arange(1, h + 1)
        ax.plot(x_past, past, color="0.35", lw=1, label="history")
        for k, (lo, hi) in enumerate(pairs):
            ax.fill_between(
                x_future,
                q[:, lo],
                q[:, hi],
                color="tab:orange",
                alpha=0.2 + 0.25 * k / max(len(pairs) - 1, 1),
                lw=0,
                label=f"{quantiles[lo]:.0%}-{quantiles[hi]:.0%} band",
            )
        ax.plot(x_future, q[:, mid], color="tab:red", lw=1.8, label="median forecast")
        # the realised line starts at the last observed bar, so the two read as one series
        realised = np.concatenate([past[-1:], np.asarray(w["actual"]) * factor])
        ax.plot(np.arange(0, h + 1), realised, "k.-", lw=1, ms=5, label="realised")
        ax.axvline(0.5, color="0.6", ls="--", lw=0.8)
        for x in (rolls or {}).get(w["window"], []):
            if x > -history:
                ax.axvline(x - 0.5, color="tab:purple", lw=1.2, label="roll")
        ax.set_title(f"{w['instrument']}: test window {w['window']:,}", fontsize=10)
        ax.set_xlabel("bars from the forecast start")
        ax.set_ylabel(f"{schema.target}{unit}")
        ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    fig.suptitle(f"Forecasts on the test split: {schema.target}{unit}")
    fig.savefig(path, dpi=100)


def interpret_checkpoint(cfg: DictConfig, out_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """`interpret` for a checkpoint alone: its schema fixes the columns and normalization.
    The data config is the checkpoint's own training run's (when found) with the command
    line's data.* `overrides` on top, unless they choose a data option (`data=parquet`)."""
    required_checkpoint(cfg)
    if cfg.top_k <= 0 or cfg.windows_per_instrument < 0:
        raise ConfigError(
            f"top_k must be positive and windows_per_instrument >= 0, got {cfg.top_k} "
            f"and {cfg.windows_per_instrument}"
        )
    device = run_device(cfg.device)
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ConfigError(f"out_dir={out_dir} is a file, not a directory")
    check_writable(out_dir)
    path, hparams, ckpt = read_checkpoint_hparams(cfg.ckpt_path)
    chosen, changes = data_changes(cfg.data, overrides)
    trained = None if chosen else training_data_config(path, ckpt)
    data_cfg = cfg.data if trained is None else OmegaConf.merge(trained, changes)
    datamodule = ParquetDataModule(data_cfg, schema=DataSchema.from_dict(hparams["schema"]))
    datamodule.setup()
    module = load_module(ckpt).to(device)
    return interpret(module, datamodule, out_dir, cfg.top_k, cfg.windows_per_instrument)
