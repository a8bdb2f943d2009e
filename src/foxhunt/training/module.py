"""The LightningModule: loss, optimizer, schedule and metrics around the plain TFT."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NotRequired, TypedDict

import lightning as L
import numpy as np
import torch
from lightning.pytorch.strategies import ParallelStrategy
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torchmetrics import MeanAbsoluteError, MetricCollection

from foxhunt.data.schema import DataSchema
from foxhunt.errors import CheckpointError
from foxhunt.models.ensemble import MEMBERS, build, members_of
from foxhunt.models.tft import UNSAVED_DEFAULTS
from foxhunt.precision import precision_of
from foxhunt.training.metrics import Coverage, DirectionalAccuracy, QuantileLoss
from foxhunt.training.step import ChunkRunner, Whole, rows, train_step, validation_forward

log = logging.getLogger(__name__)


# What a checkpoint's hyper_parameters hold: plain dicts (a ModelConfig, OptimConfig and
# PrecisionConfig as containers, enums as their strings), the schema's dict and the format, so
# checkpoints load weights-only and old ones (tests/fixtures/legacy_0.1.0) still do.

# A checkpoint's format (hyper_parameters["format_version"], saved since #70), read by `upgrade`
# alone:
#   0: foxhunt 0.1 to #59: an instrument embedding always, a row per training name and none for
#      an unseen one; before #25 and #28 no highway or monotone head (UNSAVED_DEFAULTS)
#   1: #60 on: model.instrument_embedding saved, and with it the unseen name's row
CHECKPOINT_FORMAT = 1


class ModelHparams(TypedDict):
    """A ModelConfig as a dict."""

    name: NotRequired[str]  # foxhunt 0.1's label of the model group's choice
    hidden_dim: int
    num_heads: int
    lstm_layers: int
    dropout: float
    variable_dim: int
    quantiles: list[float]
    highway: NotRequired[bool]
    monotone: NotRequired[bool]
    highway_first: NotRequired[bool]
    compile: NotRequired[bool | str]  # auto | true | false | a torch.compile mode
    instrument_embedding: NotRequired[bool]  # absent: saved before #60 (format 0)
    unseen_share: NotRequired[float]
    ensemble: NotRequired[int]  # members (foxhunt.models.ensemble); absent: saved before, one


class OptimHparams(TypedDict):
    """An OptimConfig as a dict, with the trainer's gradient_clip_val (the step clips)."""

    lr: float
    weight_decay: float
    schedule: str  # cosine | onecycle | none
    warmup_fraction: float
    schedule_epochs: int | None
    schedule_steps: NotRequired[int | None]
    gradient_clip_val: NotRequired[float | None]
    xs_weight: NotRequired[float]  # #69's cross-sectional term (a checkpoint before: none)


class PrecisionHparams(TypedDict):
    """A PrecisionConfig as a dict."""

    name: NotRequired[str]  # foxhunt 0.1's label: fp32 | bf16 | int8
    trainer_precision: str
    qat: NotRequired[bool]  # int8
    backend: str  # torch.ao | torchao
    qat_start_epoch: int
    observer_epochs: int


# what each group of a checkpoint's hyper_parameters may hold (None: checked by its own reader)
HPARAMS: dict[str, type | None] = {
    "model": ModelHparams,
    "schema": DataSchema,
    "optim": OptimHparams,
    "precision": PrecisionHparams,
    "format_version": None,
}


def check_hparams(hparams: Any, source: Any) -> None:
    """Refuse, in one CheckpointError line, hyper_parameters that carry a key foxhunt does not
    know: a later version's field, or Lightning's `_instantiator` (a class that
    `load_from_checkpoint` would import and call). Nothing in them has run."""
    if not isinstance(hparams, dict):
        raise CheckpointError(f"{source} is not a foxhunt TFT checkpoint (no hyper_parameters)")
    unknown = [k for k in hparams if k not in HPARAMS]
    for group, spec in HPARAMS.items():
        value = hparams.get(group)
        if isinstance(value, dict):
            fields = getattr(spec, "__dataclass_fields__", None) or (
                spec.__required_keys__ | spec.__optional_keys__
            )
            unknown += [f"{group}.{k}" for k in value if k not in fields]
    if unknown:
        raise CheckpointError(
            f"{source}: its hyper_parameters carry {', '.join(map(str, unknown))}, which this "
            "foxhunt does not know (a later version's checkpoint, or not foxhunt's): refused"
        )


def upgrade(hparams: dict[str, Any], source: Any) -> dict[str, Any]:
    """A checkpoint's hyper_parameters (checked by `check_hparams`) with its format, and every
    key its format lacks as its model was built: the one reader of CHECKPOINT_FORMAT. A later
    format than this foxhunt's is one CheckpointError line."""
    model = hparams["model"]
    found = hparams.get("format_version", 1 if "instrument_embedding" in model else 0)
    if not isinstance(found, int) or not 0 <= found <= CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{source}: checkpoint format {found!r}, and this foxhunt reads formats up to "
            f"{CHECKPOINT_FORMAT}: a later version's checkpoint, refused"
        )
    before = {**UNSAVED_DEFAULTS, "ensemble": 1} | (
        {"instrument_embedding": True} if not found else {}
    )
    optim = {"xs_weight": 0.0, **hparams["optim"]}  # #69's term: none before it
    return {**hparams, "model": {**before, **model}, "optim": optim, "format_version": found}


def instrument_rows(model: ModelHparams, schema: DataSchema, fmt: int = CHECKPOINT_FORMAT) -> int:
    """The rows of the model's instrument embedding: one per training name (the schema's
    vocabulary) and, from format 1, the unseen name's after them; 0 without one (one unnamed
    series, or model.instrument_embedding=false)."""
    if not schema.groups or not model["instrument_embedding"]:
        return 0
    return len(schema.groups) + (fmt >= 1)


def forecasts_unseen(model: nn.Module, schema: DataSchema) -> bool:
    """Whether the TFT `model` forecasts a name outside its vocabulary: it has the unseen
    name's row, or no instrument embedding at all (those saved before #60 have neither)."""
    return model.instrument_rows != len(schema.groups)


def model_init(
    model: ModelHparams, schema: DataSchema, fmt: int = CHECKPOINT_FORMAT
) -> dict[str, Any]:
    """The TemporalFusionTransformer's constructor arguments for a ModelConfig (or a checkpoint's
    model, of format `fmt`) and a schema (with model.ensemble's members:
    `foxhunt.models.ensemble.build`'s)."""
    return {
        "num_observed": 1 + len(schema.observed),  # the target's history leads the observed
        "num_known": len(schema.known),
        "prediction_length": schema.prediction_length,
        "static_cardinalities": [rows] if (rows := instrument_rows(model, schema, fmt)) else [],
        "num_static_real": len(schema.static_inputs),  # with the target scale's
        "anchor": schema.target_anchor,
        "hidden_dim": model["hidden_dim"],
        "num_heads": model["num_heads"],
        "lstm_layers": model["lstm_layers"],
        "dropout": model["dropout"],
        "variable_dim": model["variable_dim"],
        "quantiles": list(model["quantiles"]),
        **{k: model[k] for k in UNSAVED_DEFAULTS},
        # (one model's arguments stay as they were before ensembles)
        **({MEMBERS: model["ensemble"]} if model["ensemble"] > 1 else {}),
    }


def build_model(
    model: ModelHparams,
    schema: DataSchema,
    precision: PrecisionHparams | None = None,
    traced: bool = False,
    fmt: int = CHECKPOINT_FORMAT,
) -> nn.Module:
    """The TFT (or model.ensemble's TFTs) sized for `schema` with the hyperparameters of a
    `ModelConfig` (or a checkpoint's, of format `fmt`), prepared for training in `precision`
    (quantization-aware for int8; `traced`: for a FakeTensorMode memory trace)."""
    init = model_init(model, schema, fmt)
    return precision_of(precision).prepare_model(build(init), traced)


def _numpy_state(state: tuple) -> tuple:
    """numpy's RNG state with its key array as a tensor (what weights_only loading accepts)."""
    name, keys, pos, has_gauss, cached = state
    return name, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(cached)


def _no_backward_sync(strategy: Any) -> AbstractContextManager:
    """DDP's no_sync: backward passes leave the gradients local (see training_step)."""
    if isinstance(strategy, ParallelStrategy):
        return strategy.block_backward_sync()
    return nullcontext()


def _average_gradients(params: Iterable[nn.Parameter], world_size: int) -> None:
    """Average the gradients over the DDP processes: one all-reduce of them all, flattened
    (the buffer DDP itself would keep)."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat)
    flat /= world_size
    for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(averaged)


def make_optimizer(params: Iterable[nn.Parameter], optim: OptimHparams) -> torch.optim.Optimizer:
    """AdamW as the configured training uses it (the memory estimator builds the same)."""
    # fused: one kernel for the whole update instead of ~10 passes over every parameter
    return torch.optim.AdamW(params, lr=optim["lr"], weight_decay=optim["weight_decay"], fused=True)


# What model.compile=auto does on each device, from measurements (docs/performance.md): on CPU
# (2 cores, torch 2.13, bench config S, 2026-12-05) the model compiled with the C kernels in its
# graph trained at 1,905 samples/s against 1,743 eager, after about a minute of compiling a
# process: eager ends first below about 20,000 steps, so eager; CUDA is not measured yet
# (benchmarks/gpu_check measures eager, compiled and reduce-overhead side by side): eager until
# a measurement says otherwise. A device not listed runs eagerly.
COMPILE_BY_DEVICE: dict[str, str | None] = {"cpu": None, "cuda": None}


def compile_mode(setting: bool | str | None, device_type: str) -> str | None:
    """The torch.compile mode that model.compile=`setting` means on `device_type`, or None for
    eager: auto is the device's measured default (COMPILE_BY_DEVICE), true torch's default."""
    if setting == "auto":
        return COMPILE_BY_DEVICE.get(device_type)
    if setting is True:
        return "default"
    return setting or None


class TFTModule(L.LightningModule):
    """Trains a TemporalFusionTransformer with the quantile loss.

    The hyperparameters (model config, data schema with normalization, optimizer config) are
    saved in every checkpoint, so `TFTModule.load_from_checkpoint(path)` needs nothing else."""

    def __init__(
        self,
        model: ModelHparams,
        schema: dict[str, Any],  # DataSchema.to_dict()
        optim: OptimHparams,
        precision: PrecisionHparams | None = None,
        format_version: int = CHECKPOINT_FORMAT,  # a checkpoint's, after `upgrade`
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # see training_step
        self.schema = DataSchema.from_dict(schema)
        self.model = build_model(model, self.schema, precision, fmt=format_version)
        self._compiled = False  # compiled in setup(), for the device (model.compile)
        # the run's data config (plain containers), kept in its checkpoints beside the
        # hyperparameters: not one of them, which a checkpoint must be able to rebuild alone
        self.data_config: dict[str, Any] | None = None
        quantiles = list(model["quantiles"])
        self.register_buffer("quantiles", torch.tensor(quantiles), persistent=False)
        self.median_index = min(range(len(quantiles)), key=lambda i: abs(quantiles[i] - 0.5))
        # the test step's forecasts, kept (float32, on the CPU) when `kept` is a list: the run's
        # evaluation then needs no second pass over the test windows (one process only)
        self.kept: list[torch.Tensor] | None = None
        # a return's MAE in basis points too: a raw return rounds to 0.000 in the progress bar
        bps = {"mae_bps": MeanAbsoluteError()} if self.schema.target_kind == "return" else {}
        self.metrics = nn.ModuleDict(
            {
                stage: MetricCollection(
                    {
                        "loss": QuantileLoss(quantiles),
                        "mae": MeanAbsoluteError(),
                        **bps,
                        "directional_accuracy": DirectionalAccuracy(),
                        "coverage": Coverage(),
                        "baseline_loss": QuantileLoss(quantiles),
                    },
                    prefix=f"{stage}_",
                )
                for stage in ("val", "test")
            }
        )
        self.progress_bar = {"loss", "mae_bps" if bps else "mae", "directional_accuracy"}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning does not keep the RNG states: without them a resumed run shuffles and
        # drops out differently from an uninterrupted one
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "numpy": _numpy_state(np.random.get_state()),
            "python": random.getstate(),
        }
        checkpoint["lr_schedule_steps"] = getattr(self, "_schedule_total", None)
        if self.data_config is not None:  # predict, export and interpret read the same data
            checkpoint["data_config"] = self.data_config

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.data_config is None:  # a resumed run keeps the data it runs on now
            self.data_config = checkpoint.get("data_config")
        self._resumed_rng_states = checkpoint.get("rng_states")
        self._resumed_schedule_steps = checkpoint.get("lr_schedule_steps")

    def on_train_start(self) -> None:
        # applied here, after the sanity check: every DataLoader iterator draws a seed from
        # the global RNG, so restoring earlier would be undone by the sanity check's loader
        states = getattr(self, "_resumed_rng_states", None)
        self._resumed_rng_states = None
        if states is None:
            return
        torch.set_rng_state(states["torch"])
        if states["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
        name, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((name, keys.numpy(), pos, has_gauss, cached))
        random.setstate(states["python"])

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Quantile predictions [batch, horizon, quantiles] in normalized target units."""
        return self.model(batch)

    def setup(self, stage: str) -> None:
        """Compile the model for the device it runs on (model.compile), once; in place, so
        parameter names (and checkpoints) stay the same."""
        # (the model is not on its device yet when Lightning calls this: ask the strategy)
        device = self.trainer.strategy.root_device.type
        mode = compile_mode(self.hparams.model.get("compile"), device)
        if mode is not None and not self._compiled:
            for part in members_of(self.model):  # an ensemble's members train one by one
                part.compile(mode=mode)
            self._compiled = True
        if self._compiled:
            # evaluations under no_grad, as the fit's validation runs: a graph compiled there
            # refuses inference_mode's tensors, and every graph would be compiled again
            trainer = self.trainer
            for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
                loop.inference_mode = False

    def on_fit_start(self) -> None:
        # the memory plug-in that splits steps into micro-batches (foxhunt.memory.OOMBackoff)
        self._chunk_runner = next(
            (cb for cb in self.trainer.callbacks if isinstance(cb, ChunkRunner)), Whole()
        )

    def _average_gradients(self) -> None:
        if self.trainer.world_size > 1:
            _average_gradients(self.parameters(), self.trainer.world_size)

    def _hide_names(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch with the unseen name's embedding row in place of the name on a share
        (model.unseen_share) of its windows, drawn from torch's seeded RNG: how that row learns
        what a name the model has not seen looks like."""
        rows = instrument_rows(self.hparams.model, self.schema, self.hparams.format_version)
        share = float(self.hparams.model.get("unseen_share", 0.0))
        if not share or rows <= len(self.schema.groups):
            return batch
        names = batch["static_cat"]
        hide = torch.rand(len(names), device=names.device) < share
        return batch | {"static_cat": torch.where(hide[:, None], rows - 1, names)}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # Manual optimization: the step (foxhunt.training.step) may run as several micro-batches
        # (OOM backoff). Under DDP the backward passes do not synchronise (no_sync): every
        # process runs its micro-batches, the backoff agrees on whether any ran out of memory
        # (then all redo the step), and only then are the gradients averaged, once.
        batch = self._hide_names(batch)
        with _no_backward_sync(self.trainer.strategy):
            loss = train_step(
                self.model,
                self.optimizers(),
                batch,
                self.quantiles,
                clip=self.hparams.optim.get("gradient_clip_val"),
                backward=self.manual_backward,
                runner=getattr(self, "_chunk_runner", None),
                before_update=self._average_gradients,
                xs_weight=float(self.hparams.optim["xs_weight"]),
            )
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        # synced: every process logs the global batch's loss (all take the same steps)
        self.log(
            "train_loss",
            loss,
            on_step=True,
            on_epoch=True,
            prog_bar=True,
            batch_size=len(batch["target"]),
            sync_dist=True,
        )
        return loss

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str) -> None:
        n = len(batch["target"])
        runner = getattr(self, "_chunk_runner", None) or Whole()
        runner.run_chunks(n, "val", lambda a, b: self._update(rows(batch, a, b), stage), False)
        metrics = self.metrics[stage]
        for name in metrics.keys(keep_base=True):
            bar = stage == "val" and name in self.progress_bar
            self.log(f"{stage}_{name}", metrics[name], prog_bar=bar, on_epoch=True, batch_size=n)

    def _update(self, batch: dict[str, torch.Tensor], stage: str) -> None:
        pred = validation_forward(self.model, batch)
        if stage == "test" and self.kept is not None:
            self.kept.append(pred.float().cpu())
        target = batch["target"]
        # the naive forecast: a zero return, or the last observed level
        if self.schema.target_kind == "return":
            reference = torch.full_like(
                target, -self.schema.target_center / self.schema.target_scale
            )
        else:
            reference = batch["target_last"][:, None].expand_as(target)
        median = pred[..., self.median_index]
        m = self.metrics[stage]
        m["loss"].update(pred, target)
        # MAE in the target's own units: undo each window's scaling (the centre cancels)
        scale = batch["target_scale"][:, None]
        m["mae"].update(median * scale, target * scale)
        if "mae_bps" in m:
            m["mae_bps"].update(median * scale * 1e4, target * scale * 1e4)
        m["directional_accuracy"].update(median, target, reference)
        m["coverage"].update(pred[..., 0], pred[..., -1], target)
        m["baseline_loss"].update(reference.unsqueeze(-1).expand_as(pred), target)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _schedule_steps(self) -> int:
        total = max(int(self.trainer.estimated_stepping_batches), 1)  # also sizes the loader
        batches = max(int(self.trainer.num_training_batches), 1)
        epochs, steps = (
            self.hparams.optim.get("schedule_epochs"),
            self.hparams.optim.get("schedule_steps"),
        )
        if epochs:
            total = epochs * batches
        elif steps:  # whole epochs: the schedule's end is validated and can be the best
            needed = math.ceil(steps / batches)
            if self.trainer.max_epochs is None or needed < self.trainer.max_epochs:
                self.trainer.fit_loop.max_epochs = needed  # where training ends
            total = self.trainer.max_epochs * batches
        planned = getattr(self, "_resumed_schedule_steps", None)
        if planned is not None and planned != total:
            log.warning(
                "the learning-rate schedule now spans %d steps, the checkpoint's run planned %d "
                "(trainer.max_epochs changed?); set optim.schedule_epochs to keep one schedule "
                "across resumes",
                total,
                planned,
            )
        self._schedule_total = total
        return total

    def configure_optimizers(self) -> Any:
        cfg = self.hparams.optim
        optimizer = make_optimizer(self.parameters(), cfg)
        if cfg["schedule"] == "none":
            return optimizer
        total = self._schedule_steps()
        if cfg["schedule"] == "onecycle":
            scheduler = torch.optim.lr_scheduler.OneCycleLR(
                optimizer,
                max_lr=cfg["lr"],
                total_steps=total,
                pct_start=max(cfg["warmup_fraction"], 1e-3),
            )
        else:
            warmup = max(int(total * cfg["warmup_fraction"]), 1)

            def warmup_cosine(step: int) -> float:
                if step < warmup:
                    return (step + 1) / warmup
                progress = min((step - warmup) / max(total - warmup, 1), 1.0)
                return 0.5 * (1 + math.cos(math.pi * progress))

            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
