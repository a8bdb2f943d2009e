"""One training run from a composed config: fit, test, summary.json."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from foxhunt.config import validate
from foxhunt.data.datamodule import DataSchema, ParquetDataModule
from foxhunt.errors import CheckpointError, ConfigError
from foxhunt.memory.budget import device_budget, device_total
from foxhunt.memory.callbacks import (
    MemoryLog,
    OOMBackoff,
    OptimizerStateRelease,
    OutOfMemoryAtMinimum,
    batch_one_needs,
    memory_callbacks,
)
from foxhunt.memory.search import BatchSizeSearch
from foxhunt.models import TemporalFusionTransformer
from foxhunt.quantization import export_int8, load_int8, set_qat_phase
from foxhunt.quantization.callbacks import QATSchedule
from foxhunt.training.metrics import quantile_loss
from foxhunt.training.module import TFTModule, model_init

log = logging.getLogger(__name__)
RUNTIME_MODEL_KEYS = ("name", "compile")  # how the model runs, not what it is
RESUME_KEYS = ("resume", "ckpt_path", "trainer.max_epochs")  # not part of what an experiment is
SUMMARY_METRICS = (
    "val_loss",
    "test_loss",
    "test_mae",
    "test_directional_accuracy",
    "test_coverage",
    "baseline_test_loss",
)


def read_checkpoint_hparams(ckpt_path: str) -> tuple[Path, dict[str, Any]]:
    """Resolve a checkpoint to an absolute path and read its hyperparameters, or fail loudly."""
    path = Path(ckpt_path).expanduser().resolve()
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        # mmap: only the hyperparameters are read now; fit() loads the tensors once, later
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        return path, ckpt["hyper_parameters"]
    except Exception as exc:  # any unreadable file is the same user-facing problem
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}") from None


def _logger(cfg: DictConfig, run_dir: Path) -> Logger:
    if cfg.logger.name == "tensorboard":
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(
                'logger=tensorboard needs tensorboard: pip install -e ".[tensorboard]"'
            )
        return TensorBoardLogger(save_dir=run_dir, name="tensorboard", version="")
    return CSVLogger(save_dir=run_dir, name="csv", version="")


def find_previous_run(run_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The newest `checkpoints/last.ckpt` of an earlier run of the same experiment: a sibling
    run directory (outputs/<date>/<time>/) whose overrides equal `overrides` except the
    resume ones (resume, ckpt_path, trainer.max_epochs)."""

    def key(items: Sequence[str]) -> set[str]:
        return {o for o in items if o.split("=", 1)[0].lstrip("+~") not in RESUME_KEYS}

    wanted = key(overrides)
    found = []
    for marker in Path(run_dir).resolve().parents[1].glob("*/*/.hydra/overrides.yaml"):
        previous = marker.parent.parent
        last = previous / "checkpoints" / "last.ckpt"
        if previous != Path(run_dir).resolve() and last.is_file():
            if key(OmegaConf.load(marker)) == wanted:
                found.append(last)
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def train(
    cfg: DictConfig,
    run_dir: Path,
    extra_callbacks: Sequence[L.Callback] = (),
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Fit and test the configured TFT in `run_dir`; return the summary written there.
    `overrides` (the command line's) identify the experiment for `resume=auto`."""
    started = time.perf_counter()
    validate(cfg)
    if cfg.optimized_metric not in SUMMARY_METRICS:
        raise ConfigError(
            f"optimized_metric must be one of {', '.join(SUMMARY_METRICS)}, "
            f"got {cfg.optimized_metric!r}"
        )
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    optim_cfg = OmegaConf.to_container(cfg.optim, resolve=True)

    ckpt_path, schema, resume_from = None, None, cfg.ckpt_path
    if cfg.resume is not None:
        if cfg.resume not in ("auto", "auto_or_new"):
            raise ConfigError(f"resume must be auto or auto_or_new, got {cfg.resume!r}")
        if cfg.ckpt_path:
            raise ConfigError("give either ckpt_path or resume, not both")
        resume_from = find_previous_run(run_dir, overrides)
        if resume_from is not None:
            log.info("resume=%s: resuming from %s", cfg.resume, resume_from)
        elif cfg.resume == "auto_or_new":
            log.info("resume=auto_or_new: no earlier run of this experiment, starting fresh")
        else:
            raise CheckpointError(
                f"resume=auto found no earlier run of this experiment (same overrides) with "
                f"checkpoints/last.ckpt under {Path(run_dir).resolve().parents[1]}; "
                "use resume=auto_or_new to start fresh"
            )
    if resume_from:
        ckpt_path, hparams = read_checkpoint_hparams(str(resume_from))
        schema = DataSchema.from_dict(hparams["schema"])
        changed = [
            k
            for k in model_cfg
            if k not in RUNTIME_MODEL_KEYS and hparams["model"].get(k) != model_cfg[k]
        ]
        if changed:
            raise ConfigError(
                "the checkpoint was trained with a different model: "
                + ", ".join(f"model.{k}={hparams['model'].get(k)!r}" for k in changed)
            )
        trained = (hparams.get("precision") or {"name": "fp32"})["name"]
        if (trained == "int8") != (cfg.precision.name == "int8"):
            raise ConfigError(
                f"the checkpoint was trained with precision={trained}, "
                f"not precision={cfg.precision.name}"
            )

    datamodule = ParquetDataModule(cfg.data, schema=schema, seed=cfg.seed)
    datamodule.setup()
    # manual optimization (micro-batches on OOM) clips in the module, not in the Trainer
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    optim_cfg["gradient_clip_val"] = trainer_cfg.pop("gradient_clip_val")
    precision_cfg = OmegaConf.to_container(cfg.precision, resolve=True)
    module = TFTModule(
        model=model_cfg,
        schema=datamodule.schema.to_dict(),
        optim=optim_cfg,
        precision=precision_cfg,
    )
    module.model.gradient_checkpointing = cfg.memory.gradient_checkpointing

    checkpoint = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best-{epoch}-{step}",
        monitor=cfg.callbacks.monitor,
        mode="min",
        save_top_k=cfg.callbacks.save_top_k,
        save_last=True,
    )
    memory = memory_callbacks(cfg)
    if cfg.memory.batch_size_search.enabled:
        memory.insert(0, BatchSizeSearch(cfg))
    elif isinstance(cfg.memory.val_batch_size, int):
        datamodule.val_batch_size = cfg.memory.val_batch_size
    callbacks: list[L.Callback] = [*memory, checkpoint, *extra_callbacks]
    if cfg.precision.name == "int8":
        callbacks.append(QATSchedule(cfg.precision.qat_start_epoch, cfg.precision.observer_epochs))
    if cfg.callbacks.early_stopping_patience is not None:
        callbacks.append(
            EarlyStopping(cfg.callbacks.monitor, patience=cfg.callbacks.early_stopping_patience)
        )
    trainer = L.Trainer(
        **trainer_cfg,
        precision=cfg.precision.trainer_precision,
        default_root_dir=run_dir,
        logger=_logger(cfg, run_dir),
        callbacks=callbacks,
    )
    device = trainer.strategy.root_device
    held = [*module.parameters(), *module.buffers()]
    budget_mb = cfg.memory.budget_mb
    if budget_mb is None and device.type == "cpu" and cfg.memory.batch_size_search.enabled:
        budget_mb = device_total(device) / 2**20  # trials must meet an OOM, not the OS's killer
    with device_budget(device, budget_mb, track=held), _oom_is_a_user_error(cfg):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        # read before test(): restoring the best checkpoint there resets the callback's paths
        best, last, best_score = (
            checkpoint.best_model_path,
            checkpoint.last_model_path,
            checkpoint.best_model_score,
        )
        tested = trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)[0]

    summary = {
        "run_dir": str(run_dir),
        "resumed_from": str(ckpt_path) if ckpt_path else None,
        "best_checkpoint": best,
        "last_checkpoint": last,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "batch_size": datamodule.batch_size,
        "val_batch_size": datamodule.val_batch_size,
        "num_features": datamodule.schema.num_features,
        "num_parameters": sum(p.numel() for p in module.model.parameters()),
        "metrics": {
            "val_loss": _float(best_score),
            "test_loss": tested["test_loss"],
            "test_mae": tested["test_mae"],
            "test_directional_accuracy": tested["test_directional_accuracy"],
            "test_coverage": tested["test_coverage"],
            "baseline_test_loss": tested["test_baseline_loss"],
        },
    }
    if cfg.precision.name == "int8":
        init = model_init(model_cfg, datamodule.schema)
        summary |= export_and_test_int8(module, init, datamodule, tested, run_dir / "checkpoints")
    summary["memory"] = memory_summary(cfg, memory, device)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def export_and_test_int8(
    module: TFTModule, init: dict, datamodule: ParquetDataModule, tested: dict, out_dir: Path
) -> dict[str, Any]:
    """Export the (best) QAT model as int8 next to the checkpoints and score it on the test
    split beside the fake-quant model it came from."""
    qat_model = module.model.eval()
    set_qat_phase(qat_model, observe=False, fake_quant=True)
    path = out_dir / "model_int8.pt"
    int8_bytes = export_int8(qat_model, init, path)
    fp32 = io.BytesIO()
    torch.save(TemporalFusionTransformer(**init).state_dict(), fp32)
    int8_model = load_int8(path)
    quantiles = module.quantiles.cpu()
    loss_sum = count = 0.0
    diffs, scale = [], []
    with torch.no_grad():
        for batch in datamodule.test_dataloader():
            pred = int8_model(batch)
            n = pred.numel()
            loss_sum += float(quantile_loss(pred, batch["target"], quantiles)) * n
            count += n
            reference = qat_model(batch)
            diffs.append((pred - reference).abs().flatten())
            scale.append(reference.flatten())
    diff, ref_std = torch.cat(diffs), float(torch.cat(scale).std())
    return {
        "int8_model": str(path),
        "int8_test_loss": loss_sum / max(count, 1),
        "fp32_equivalent_test_loss": tested["test_loss"],
        "export_bytes_int8": int8_bytes,
        "export_bytes_fp32": len(fp32.getvalue()),
        "int8_vs_fake_quant_max_abs_diff_rel_std": float(diff.max()) / ref_std,
        "int8_vs_fake_quant_mean_abs_diff_rel_std": float(diff.mean()) / ref_std,
    }


@contextmanager
def _oom_is_a_user_error(cfg: DictConfig) -> Iterator[None]:
    """An OOM that no step caught (the model itself, a loader) as one clear line."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        error = " ".join(str(exc).split())[:200]
    else:
        return
    raise OutOfMemoryAtMinimum(
        f"out of memory outside a training step ({error}); {batch_one_needs(cfg)}"
    ) from None


def memory_summary(cfg: DictConfig, callbacks: list[L.Callback], device: torch.device) -> dict:
    """What the memory policy did: sizes, backoffs, released state, the [MEMORY] lines."""
    out: dict[str, Any] = {"policy": cfg.memory.name, "device": str(device)}
    for cb in callbacks:
        if isinstance(cb, BatchSizeSearch):
            out["searched_batch_size"] = cb.batch_size
            out["searched_val_batch_size"] = cb.val_batch_size
            out["search_trials"] = cb.trials
        elif isinstance(cb, OOMBackoff):
            out["micro_batch_size"] = dict(cb.micro)
            out["oom_backoffs"] = list(cb.events)
        elif isinstance(cb, OptimizerStateRelease):
            out["optimizer_state_released_mb"] = round(cb.released_bytes / 2**20, 3)
        elif isinstance(cb, MemoryLog):
            out["log"] = cb.lines
            out["peak_mb"] = cb.peak_mb
    return out


def _float(x: torch.Tensor | None) -> float | None:
    return None if x is None else float(x)
