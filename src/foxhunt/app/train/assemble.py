"""The parts of one training run built from its config before fit: the logger, the callbacks,
the Trainer (a wrong argument is one ConfigError line, before any data is read), the data and
the LightningModule (`foxhunt.app.train.phases` runs them)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.train import tracking
from foxhunt.app.train.ddp import ddp_strategy
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.schema import DataSchema
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.evaluation.loss import xs_weight_of
from foxhunt.memory.callbacks import memory_callbacks
from foxhunt.memory.search import BatchSizeSearch
from foxhunt.precision import Precision, precision_of
from foxhunt.run.dir import RunDir
from foxhunt.threads import ShareCpus
from foxhunt.training.checkpoint_io import SafeCheckpointIO, read_checkpoint_hparams
from foxhunt.training.checkpointing import (
    BestCheckpoint,
    GracefulInterrupt,
    LatestCheckpoint,
    TrainingOutcome,
)
from foxhunt.training.epoch_lines import epoch_lines
from foxhunt.training.module import ModelHparams, OptimHparams, PrecisionHparams, TFTModule

RUNTIME_MODEL_KEYS = ("name", "compile")  # how the model runs, not what it is


@dataclass
class Resumed:
    """What a run continues from: a checkpoint (its schema, whether in its own directory)."""

    ckpt_path: Path | None = None
    schema: DataSchema | None = None
    in_place: bool = False


@dataclass
class Assembled:
    """The parts of one run, built before fit."""

    trainer: L.Trainer
    datamodule: ParquetDataModule
    module: TFTModule
    checkpoint: BestCheckpoint
    latest: LatestCheckpoint
    outcome: TrainingOutcome
    memory: list[L.Callback]
    precision: Precision


def assemble(
    cfg: DictConfig,
    run: RunDir,
    resumed: Resumed,
    precision: Precision,
    extra_callbacks: Sequence[L.Callback],
    init_weights: Path | None,
) -> Assembled:
    """The callbacks and Trainer (before the data is read: a wrong Trainer argument is one
    line at the start), then the data and the LightningModule."""
    callbacks, (checkpoint, latest, outcome, memory) = run_callbacks(cfg, run, precision)
    callbacks += extra_callbacks
    callbacks += epoch_lines(cfg.trainer, callbacks)  # stdout not a terminal: no bar in it
    trainer = make_trainer(
        cfg.trainer,
        precision=precision.trainer_precision,
        default_root_dir=run.path,
        logger=make_logger(cfg.logger, run.path, resumed.in_place),
        callbacks=callbacks,
        plugins=[SafeCheckpointIO()],
    )
    precision.check_device(trainer.strategy.root_device)  # before any data is read
    tracking.log_config(cfg, trainer.loggers)  # logger=mlflow: the config as the run's params
    datamodule = ParquetDataModule(cfg.data, resumed.schema, cfg.seed)
    datamodule.setup()
    xs_weight = xs_weight_of(cfg.optim.xs_weight, datamodule.schema.target_transform)
    datamodule.by_date = xs_weight > 0  # its loss term ranks a date's names
    for warning in filter(None, [datamodule.zone_warning, *datamodule.target_warnings]):
        logging.getLogger(__name__).warning("data: %s", warning)  # once, at the start of training
    if not cfg.memory.batch_size_search.enabled and isinstance(cfg.memory.val_batch_size, int):
        datamodule.val_batch_size = cfg.memory.val_batch_size
    module = make_module(cfg, datamodule.schema, xs_weight)
    if init_weights and not resumed.ckpt_path:
        _, hparams, ckpt = read_checkpoint_hparams(init_weights)
        check_same_model(hparams, plain(cfg.model), precision)
        module.load_state_dict(ckpt["state_dict"])
    return Assembled(trainer, datamodule, module, checkpoint, latest, outcome, memory, precision)


def check_same_model(
    hparams: dict[str, Any], model_cfg: dict[str, Any], precision: Precision
) -> None:
    """A checkpoint resumes only into the model (and precision family) it was trained as."""
    trained_as = hparams["model"]  # with the keys its format lacks (read_checkpoint_hparams)
    changed = [
        k for k in model_cfg if k not in RUNTIME_MODEL_KEYS and trained_as.get(k) != model_cfg[k]
    ]
    if changed:
        raise ConfigError(
            "the checkpoint was trained with a different model: "
            + ", ".join(f"model.{k}={trained_as.get(k)!r}" for k in changed)
        )
    trained = precision_of(hparams)
    if not trained.same_family(precision):
        raise ConfigError(
            f"the checkpoint was trained with precision={trained.name}, "
            f"not precision={precision.name}"
        )


@contextmanager
def _as_config_error(what: str) -> Iterator[None]:
    """An object of the config that cannot be built (a wrong argument or value, or one its
    class refuses) as one ConfigError line, before any data is read."""
    try:
        yield
    except (InstantiationException, MisconfigurationException, ValueError, TypeError) as exc:
        if isinstance(exc.__cause__, FoxhuntError):  # the target's own one line
            raise exc.__cause__ from None
        raise ConfigError(f"invalid {what} setting: {' '.join(str(exc).split())}") from None


def make_logger(logger: DictConfig, run_dir: Path, resumed_in_place: bool) -> Logger | list[Logger]:
    """The logger group's `_target_`, writing into the run directory (logger=mlflow: the CSV
    logger and MLflow's, `foxhunt.app.train.tracking`)."""
    # a run continued in its own directory logs beside the earlier logs (csv/resume-1/...):
    # Lightning's CSVLogger would otherwise delete the metrics.csv it finds
    version = ""
    if resumed_in_place:
        earlier = run_dir.glob(f"{logger.get('name', '')}/resume-*")
        version = f"resume-{len(list(earlier)) + 1}"
    with _as_config_error("logger"):
        return instantiate(logger, save_dir=str(run_dir), version=version)


def make_callbacks(callbacks: DictConfig, checkpoint_dir: Path) -> list[L.Callback]:
    """The callbacks group's `_target_` nodes, in order; a null node, or one that builds
    nothing (early stopping without a patience), is left out."""
    built = []
    for node in callbacks.values():
        if not (OmegaConf.is_dict(node) and "_target_" in node):
            continue  # the group's own settings (monitor, save_top_k, ...)
        with _as_config_error("callbacks"):
            callback = instantiate(node, _convert_="all")
        if callback is None:
            continue
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            # Lightning would save under the logger's version directory
            callback.dirpath = str(checkpoint_dir)
        built.append(callback)
    return built


def run_callbacks(
    cfg: DictConfig, run: RunDir, precision: Precision
) -> tuple[list[L.Callback], tuple[BestCheckpoint, LatestCheckpoint, TrainingOutcome, list]]:
    """Every callback of a run, in order; and the ones whose results the run reads after fit
    (the best and latest checkpoints, how training ended, the memory policy's)."""
    configured = make_callbacks(cfg.callbacks, run.checkpoints)
    checkpoint = next((c for c in configured if isinstance(c, BestCheckpoint)), None)
    if checkpoint is None:
        raise ConfigError(
            "callbacks needs a foxhunt.training.checkpointing.BestCheckpoint (as in "
            "callbacks=default): the run tests and exports its best checkpoint"
        )
    latest = LatestCheckpoint(run.checkpoints)
    outcome = TrainingOutcome(cfg.callbacks.get("monitor", "val_loss"))
    memory = memory_callbacks(cfg)
    if cfg.memory.batch_size_search.enabled:
        memory.insert(0, BatchSizeSearch(cfg))
    interrupt = GracefulInterrupt(run.checkpoints)
    callbacks = [*memory, interrupt, *configured, latest, outcome]
    # intra-op threads: the CPUs other processes leave free, unless the run must be exact
    callbacks.append(ShareCpus(fixed=bool(cfg.trainer.get("deterministic"))))
    callbacks += precision.callbacks()  # int8: when QAT observes and fakes quantization
    return callbacks, (checkpoint, latest, outcome, memory)


def make_module(cfg: DictConfig, schema: DataSchema, xs_weight: float = 0.0) -> TFTModule:
    """The LightningModule, its hyperparameters as plain containers (enums as strings), with
    the weight optim.xs_weight means for the data (`xs_weight_of`)."""
    # manual optimization (micro-batches on OOM) clips in the module, not in the Trainer
    optim: OptimHparams = {
        **plain(cfg.optim),
        "gradient_clip_val": cfg.trainer.gradient_clip_val,
        "xs_weight": xs_weight,
    }
    model: ModelHparams = plain(cfg.model)
    precision: PrecisionHparams = plain(cfg.precision)
    module = TFTModule(model=model, schema=schema.to_dict(), optim=optim, precision=precision)
    module.model.gradient_checkpointing = cfg.memory.gradient_checkpointing
    module.data_config = plain(cfg.data)
    return module


def make_trainer(trainer: DictConfig, **set_by_foxhunt: Any) -> L.Trainer:
    """The trainer group's `lightning.Trainer`, built by Hydra, with the arguments foxhunt
    sets itself (precision, logger, callbacks, plugins, the run directory); a value Lightning
    refuses is one ConfigError line."""
    with _as_config_error("trainer"):
        build: Callable[..., L.Trainer] = instantiate(trainer, _partial_=True, _convert_="all")
        # the module's step clips to gradient_clip_val itself (Lightning refuses clipping with
        # manual optimization)
        strategy = ddp_strategy(trainer.strategy)
        return build(gradient_clip_val=None, strategy=strategy, **set_by_foxhunt)


def plain(node: DictConfig) -> Any:
    """A config group as plain containers, its enums as their strings (what a checkpoint's
    weights-only loading accepts)."""
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
