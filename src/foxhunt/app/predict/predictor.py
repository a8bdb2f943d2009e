"""Forecasts from a trained TFT on new bars, in the target's own units.

In Python `foxhunt.load(path).predict(table_or_path)`; on the command line
`foxhunt predict ckpt_path=/abs/best.ckpt data.path=new_bars.parquet`
(`foxhunt.app.predict.command`). The model is a checkpoint (.ckpt, run in float32)
or an export (`model_fp32.safetensors`; `model_int8.safetensors` on CPU). Its schema fixes the
columns, the normalization and the window lengths; the data config (column names,
features=ohlcv, NaN policy) is that of the checkpoint's training run, with any changes given on
top.

The forecast of a window starts after its last encoder row (the origin). Its known-future inputs
come from rows after an instrument's last target value (target empty, known inputs filled), or,
when every known input is a calendar encoding of the time (features=ohlcv, no
data.known_features), from times continued at the instrument's bar interval (the most common
step) in its sessions (data.calendar.session, `foxhunt_serve.clock`: bars skips the local times
and weekdays its history never had a bar at, the sessions learned in training where the model
carries them; data.calendar.exchange: the exchange's), and `target_time_continued` marks them.

The quantiles are calibrated as the training run calibrated them on its validation windows
(the checkpoint's or export's `calibration`; `foxhunt.evaluation.calibration`): CQR's static
offsets, or with `aci` offsets that follow each realized outcome in the data, walking each
instrument's windows in time order (for the latest windows, over the instrument's past windows
in the data first). Either way they never cross: q0.1 <= q0.5 <= q0.9 (the rearrangement of
Chernozhukov et al. 2010, which never makes a quantile forecast worse).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import torch
from foxhunt_serve import (
    Todo,
    facts_at,
    latest_of,
    output,
    stored_outputs,
)
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.predict.inference import BEFORE_CALENDAR, run_device, training_data_config
from foxhunt.app.predict.windows import Windows, build_windows
from foxhunt.config import DataConfig, MemoryConfig, OptimConfig
from foxhunt.data.columns import OHLCV_TARGET
from foxhunt.data.datamodule import resolve_intraday
from foxhunt.data.features import KNOWN_CALENDAR, clock_of
from foxhunt.data.names import resolve_names
from foxhunt.data.schema import DataSchema
from foxhunt.data.source import open_dataset
from foxhunt.data.windows import WindowDataset
from foxhunt.errors import CheckpointError, ConfigError, DataError
from foxhunt.evaluation.calibration import METHODS, Calibration
from foxhunt.evaluation.forecasts import quantile_column
from foxhunt.files import read_export
from foxhunt.models.ensemble import MEMBERS
from foxhunt.models.tft import UNSAVED_DEFAULTS
from foxhunt.precision import precision_of
from foxhunt.precision.fp32 import load_weights
from foxhunt.quantization.qat import INT8_FORMAT, load_int8, read_int8
from foxhunt.training.checkpoint_io import calibration_of, load_module, read_checkpoint
from foxhunt.training.module import forecasts_unseen

log = logging.getLogger(__name__)
MAX_BATCH_SIZE = 8192  # windows per forward pass at most, however much memory is free
CPU_MEMORY_SHARE = 0.5  # of the available RAM that a CPU prediction plans for
MODEL_INPUTS = ("encoder_cont", "decoder_known", "static_cat", "static_real")
MODEL_KEYS = ("hidden_dim", "num_heads", "lstm_layers", "dropout", "variable_dim", "quantiles")


# --- loading ---------------------------------------------------------------------------------


def load(
    path: str | Path,
    data: Mapping[str, Any] | None = None,
    *,
    device: str = "auto",
    batch_size: int | None = None,
    data_defaults: DictConfig | None = None,
    calibration: str | None = None,
) -> Predictor:
    """A predictor for a checkpoint (.ckpt) or an export (model_fp32/model_int8.safetensors).

    `data`: data config keys to change (`{"group_column": "symbol"}`) on the data config of the
    checkpoint's training run (`<run>/.hydra/config.yaml`); without one, on a config derived
    from the checkpoint's schema (columns as trained, time column `timestamp`, no group column).
    `data_defaults`: start from this data config instead (the CLI's `data=<option>`).
    `batch_size`: windows per forward pass; None: planned by the memory estimator.
    `calibration`: none, cqr or aci in place of the method the model was calibrated with."""
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"predict.batch_size must be positive, got {batch_size}")
    if calibration is not None and calibration not in METHODS:
        raise ConfigError(f"predict.calibration must be none, cqr or aci, got {calibration!r}")
    path, blob = Path(path).expanduser().resolve(), None
    if path.suffix != ".safetensors":
        path, blob = read_checkpoint(path)
    if isinstance(blob, dict) and "hyper_parameters" in blob:
        model, schema, model_cfg, precision = _from_checkpoint(path, blob)
        target = run_device(device, "predict.device")
        fitted = calibration_of(blob)
    elif blob is None or (isinstance(blob, dict) and "int8" in blob):  # legacy model_int8.pt
        model, schema, model_cfg, int8, fitted = _from_export(path, device)
        precision = {"name": "fp32"}  # dequantized or float weights: a float trace sizes it
        target = torch.device("cpu") if int8 else run_device(device, "predict.device")
    else:
        raise CheckpointError(f"{path} is neither a foxhunt checkpoint nor an export")
    data_cfg = _data_config(path, schema, data, data_defaults, blob)
    del blob
    predictor = Predictor(model, schema, data_cfg, target, model_cfg, precision, batch_size)
    predictor.calibration = _calibration(path, fitted, calibration)
    return predictor


def _calibration(path: Path, fitted: Any, method: str | None) -> Calibration | None:
    """The model's calibration (None: a model saved before calibration, or without one),
    set to `method` when given."""
    try:
        found = Calibration.from_dict(fitted)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} holds a calibration foxhunt cannot read: {exc}") from None
    if found is None:
        if method not in (None, "none"):
            raise ConfigError(
                f"predict.calibration={method}, but {path} carries no calibration (saved before "
                "calibration, or not a run's best checkpoint): predict from the run's best-*.ckpt "
                "or its model_*.safetensors export"
            )
        log.info("predict: %s carries no calibration; the model's own quantiles, in order", path)
        return None
    if method is not None:
        found.method = method
    return found


def _from_checkpoint(
    path: Path, ckpt: Mapping[str, Any]
) -> tuple[torch.nn.Module, DataSchema, dict[str, Any], dict[str, Any]]:
    """(model, schema, model config, precision to plan the batch size with)."""
    hparams = ckpt["hyper_parameters"]
    if "schema" not in hparams:
        raise CheckpointError(f"{path} is not a foxhunt TFT checkpoint (no data schema)")
    module = load_module(ckpt, compile=False)  # (compiled, it would serve one prediction)
    trained = precision_of(hparams)
    model = trained.for_inference(module.model)  # int8: the fake-quant model the test scored
    precision = {"name": trained.predicts_as}  # a bf16 checkpoint runs in float32
    return model, module.schema, dict(hparams["model"]), precision


def _from_export(
    path: Path, device: str
) -> tuple[torch.nn.Module, DataSchema, dict[str, Any], bool, Any]:
    """An export: float32 weights (model_fp32.safetensors) or int8 (model_int8.safetensors, or
    a legacy model_int8.pt), loaded without pickle (the legacy file weights-only).
    (model, schema, model config, whether it is int8, its calibration's dict)."""
    meta = read_export(path)[1] if path.suffix == ".safetensors" else read_int8(path)
    if meta.get("schema") is None:
        raise CheckpointError(
            f"{path} was exported without its data schema (made before exports carried "
            "it): predict from the checkpoint it came from (best-*.ckpt beside it)"
        )
    init = meta["init"]  # the keys an export made before them lacks, as it was built:
    model_cfg = {k: init[k] for k in MODEL_KEYS} | {"ensemble": init.get(MEMBERS, 1)}
    model_cfg |= {k: init.get(k, unsaved) for k, unsaved in UNSAVED_DEFAULTS.items()}
    # (for the memory plan: a model saved before #60 is planned with one row more, of no size)
    model_cfg["instrument_embedding"] = bool(init.get("static_cardinalities"))
    schema = DataSchema.from_dict(meta["schema"])
    fitted = meta.get("calibration")
    if path.suffix == ".safetensors" and meta.get("format") != INT8_FORMAT:
        return load_weights(path)[0], schema, model_cfg, False, fitted
    if device not in ("auto", "cpu"):
        raise ConfigError(
            "an int8 export runs on CPU (torch.ao's dynamic int8 LSTM kernels are CPU "
            "only): use predict.device=cpu, or the checkpoint it came from"
        )
    return load_int8(path), schema, model_cfg, True, fitted


def _data_config(
    path: Path,
    schema: DataSchema,
    changes: Mapping[str, Any] | None,
    defaults: DictConfig | None,
    ckpt: Any = None,
) -> DictConfig:
    trained = training_data_config(path, ckpt)
    base = defaults if defaults is not None else trained
    if base is None:
        base = _schema_data_config(schema)
    cfg = OmegaConf.merge(base, OmegaConf.create(dict(changes or {})))
    _keep_clock(cfg, trained, changes)
    # the checkpoint fixes the window; the data config's lengths do not apply
    cfg.encoder_length, cfg.prediction_length = schema.encoder_length, schema.prediction_length
    cfg.target_transform = schema.target_transform  # as applied in training
    cfg.target_kind = schema.target_kind  # as its training rows showed it (auto decided)
    resolve_intraday(cfg, schema)  # and whether its bars had a time of day
    if not OmegaConf.is_missing(cfg, "path") and Path(cfg.path).exists():
        resolve_names(cfg)  # the training file's columns (data.futures.enabled=auto decided)
    return cfg


def _keep_clock(cfg: DictConfig, trained: DictConfig | None, changes: Any) -> None:
    """The trained model's clock (the time zone and cash close its calendar features were
    computed on) is part of the model: a data.calendar change that moves it is refused, and a
    data option's calendar (data=...) gives way to it. The sessions of the steps after the
    data (session, holidays, an exchange in the same zone) may change. Unknown (no training
    config found): the data config's."""
    if trained is None:
        return
    had, now = clock_of(trained), clock_of(cfg)
    if (had.time_zone, had.close_min) == (now.time_zone, now.close_min):
        return
    if "calendar" not in dict(changes or {}):
        cfg.calendar = trained.calendar
        return
    zone, close = had.section()["time_zone"], had.section()["close"]
    raise ConfigError(
        f"data.calendar gives the clock {now.time_zone} (close {now.section()['close']}), but "
        f"the model was trained on {zone} (close {close}): its time features would be ones it "
        "never saw; drop the data.calendar.time_zone/close/exchange override, or train a model "
        "on that clock"
    )


def _schema_data_config(schema: DataSchema) -> DictConfig:
    """A data config for the checkpoint's columns, when its training config is not found."""
    derived = schema.target == OHLCV_TARGET and {"dow_sin", "dow_cos"} <= {
        *schema.known,
        *schema.dropped,
    }
    if derived:
        d = {"features": "ohlcv", "target": None}
        d["known_features"] = [k for k in schema.known if k not in KNOWN_CALENDAR]
    else:
        d = {"features": list(schema.observed), "target": schema.target}
        d["known_features"] = list(schema.known)
    d |= {"static_features": list(schema.static), "target_kind": schema.target_kind}
    return OmegaConf.merge(OmegaConf.structured(DataConfig), BEFORE_CALENDAR, d)


# --- prediction ------------------------------------------------------------------------------


class Predictor:
    """A trained TFT with its schema and data config; `predict` turns bars into forecasts."""

    def __init__(
        self,
        model: torch.nn.Module,
        schema: DataSchema,
        data_cfg: DictConfig,
        device: torch.device,
        model_cfg: dict[str, Any],
        precision: dict[str, Any],
        batch_size: int | None = None,
    ) -> None:
        self.model = model.to(device).eval()
        self.schema = schema
        self.data_cfg = data_cfg
        self.device = device
        self.model_cfg = model_cfg
        self.precision = precision
        self.batch_size = batch_size
        self.clock = clock_of(data_cfg)  # the model's, built once (`_keep_clock` checked it)
        self.quantiles = [float(q) for q in model_cfg["quantiles"]]
        self.calibration: Calibration | None = None  # set by `load`
        self._planned: dict[int, int] = {}  # windows -> planned batch size

    def predict(
        self,
        data: pa.Table | str | Path | None = None,
        all_windows: bool = False,
        progress: bool | None = None,
    ) -> pa.Table:
        """Forecasts for the latest window of each instrument in `data` (a pyarrow Table, or a
        Parquet file or directory; None: data.path), or for every window with `all_windows`.
        One row per window and step: instrument, origin_time, horizon, target_time, one
        column per quantile (q0.1, q0.5, ...) in the target's units, actual (the raw target),
        under a data.target_transform `actual_<transform>` (the model's target, which the
        quantiles forecast), and target_transform (`foxhunt_serve.output`). `progress`: a
        progress bar (None: on a terminal, when there is more than one batch)."""
        if data is None:
            if OmegaConf.is_missing(self.data_cfg, "path"):
                raise ConfigError("no data to predict on: give data.path=/abs/bars.parquet")
            data = self.data_cfg.path
        table, where = self._read(data)
        cfg = self.data_cfg.copy()
        cfg.path = where
        resolve_names(cfg, pads.dataset(table))  # this file's spelling of the columns
        cal = None if self.calibration is None else self.calibration.to_dict()
        todo = Todo.of(cal, all_windows)
        unseen = forecasts_unseen(self.model, self.schema)
        windows = build_windows(
            table, cfg, self.schema, todo.every, unseen, replay=todo.replay, clock=self.clock
        )
        held = None
        if todo.replay is not None:  # the windows whose outputs ACI's state holds: not run
            shape = (len(windows.origin_ns), self.schema.prediction_length, len(self.quantiles))
            held = stored_outputs(cal, windows.instrument, windows.origin_ns, shape)
        forecast = self._forward(windows.dataset, progress, held)
        normalized = self._calibrated(forecast, windows, todo.replay is not None)
        center, scale = self._target(windows)
        values = normalized.astype(np.float64) * scale[:, None, None] + center[:, None, None]
        if todo.latest:  # the latest windows are there as they would be alone
            at = latest_of(windows.instrument)
            windows, values = facts_at(windows, at), values[at]
        time_type = table.schema.field(cfg.time_column).type
        columns = [quantile_column(q) for q in sorted(self.quantiles)]
        return output(windows, values, columns, time_type, self.schema.target_transform)

    def _calibrated(self, pred: np.ndarray, w: Windows, resume: bool = False) -> np.ndarray:
        """The model's normalized forecasts calibrated (ACI: from the realized targets, from
        its stored state with `resume`)."""
        if self.calibration is None:  # a model saved before calibration: only in order
            return np.sort(pred, axis=-1)
        center, scale = self._target(w)
        actual = (w.target_actual - center[:, None]) / scale[:, None]
        return self.calibration.apply(
            pred, w.instrument, actual, w.origin_ns, w.target_ns, resume=resume
        )

    def _target(self, w: Windows) -> tuple[np.ndarray, np.ndarray]:
        """The target's centre and scale [N] of each window's instrument."""
        series = w.dataset.window_series()
        return w.dataset.series.centre[series], w.dataset.series.scale[series]

    @staticmethod
    def _read(data: pa.Table | str | Path) -> tuple[pa.Table, str]:
        if isinstance(data, pa.Table):
            return data, "the given table"
        dataset = open_dataset(data)
        try:
            return dataset.to_table(), str(data)
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"cannot read {data}: {' '.join(str(exc).split())}") from None

    def batch_size_for(self, windows: int) -> int:
        """predict.batch_size, or the largest batch whose forward pass the memory estimator
        fits into the device's free memory (CUDA: free memory; CPU: a share of the available
        RAM). It traces a validation step, which also counts the AdamW state that training
        keeps: a margin of twice the weights."""
        if self.batch_size is not None:
            return max(1, min(self.batch_size, windows))
        limit = max(1, min(windows, MAX_BATCH_SIZE))
        if limit not in self._planned:
            from foxhunt.memory import max_batch_size
            from foxhunt.memory.budget import MB, device_total

            if self.device.type == "cuda":
                free_mb = torch.cuda.mem_get_info(self.device)[0] / MB
            else:
                free_mb = device_total(self.device) * CPU_MEMORY_SHARE / MB
            plan = OmegaConf.create(
                {
                    "model": self.model_cfg,
                    "optim": OmegaConf.structured(OptimConfig),
                    "precision": self.precision,
                    "trainer": {"gradient_clip_val": None},
                    "memory": OmegaConf.structured(MemoryConfig),
                }
            )
            best, _ = max_batch_size(
                plan, free_mb, step="val", schema=self.schema, device=self.device.type, limit=limit
            )
            log.info(
                "predict: batch size %d for %d windows (%.0f MB free on %s)",
                best,
                windows,
                free_mb,
                self.device.type,
            )
            self._planned[limit] = best
        return self._planned[limit]

    def _forward(
        self,
        dataset: WindowDataset,
        progress: bool | None,
        held: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Normalized quantile forecasts [windows, H, Q], as the model gives them (`held`: the
        windows whose outputs are given, `foxhunt_serve.stored_outputs`: not run)."""
        from tqdm.auto import tqdm

        rows = np.arange(len(dataset)) if held is None else np.flatnonzero(~held[0])
        n = len(rows)
        batch_size = self.batch_size_for(n)
        if progress is None:
            progress = n > batch_size and sys.stderr.isatty()
        shape = (len(dataset), self.schema.prediction_length, len(self.quantiles))
        out = np.empty(shape, np.float32)
        with (
            torch.inference_mode(),
            tqdm(total=n, unit="window", desc="predict", disable=not progress) as bar,
        ):
            for start in range(0, n, batch_size):
                at = rows[start : start + batch_size]
                batch = dataset.__getitems__(at.tolist())
                x = {k: batch[k].to(self.device) for k in MODEL_INPUTS}
                out[at] = self.model(x).float().cpu().numpy()
                bar.update(len(at))
        if held is not None:
            out[held[0]] = held[1][held[0]]
        return out
