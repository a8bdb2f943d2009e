"""One training run from a composed config: fit, test, summary.json (the app layer: it wires the
data, the LightningModule, the memory and quantization plug-ins and the report together)."""

from __future__ import annotations

import inspect
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import save as safetensors_bytes
from torch.nn.parallel import DistributedDataParallel

from foxhunt.config import Metric, validate
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.futures import ROLLS, rolls_table
from foxhunt.data.schema import DataSchema
from foxhunt.errors import CheckpointError, ConfigError
from foxhunt.evaluation.baselines import score_baselines
from foxhunt.evaluation.forecasts import FORECASTS, forecast_table, forecast_test
from foxhunt.evaluation.quality import EQUITY_PLOT, equity_curves, evaluate, strategy_summary
from foxhunt.evaluation.strategy import plot_equity
from foxhunt.files import check_writable, remove_stale_temps, write_atomic, write_json
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
from foxhunt.report import report_run
from foxhunt.rundir import experiment_key
from foxhunt.threads import ShareCpus
from foxhunt.training.checkpoint_io import (
    SafeCheckpointIO,
    export_weights,
    read_checkpoint_hparams,
)
from foxhunt.training.checkpointing import (
    BestCheckpoint,
    GracefulInterrupt,
    LatestCheckpoint,
    TrainingOutcome,
)
from foxhunt.training.metrics import quantile_loss
from foxhunt.training.module import (
    ModelHparams,
    OptimHparams,
    PrecisionHparams,
    TFTModule,
    model_init,
)

log = logging.getLogger(__name__)
# a checkpoint written mid-epoch (an interrupt) resumes exactly: the data module records how far
# the epoch got (ParquetDataModule.state_dict), which Lightning's warning does not know
warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")
RUNTIME_MODEL_KEYS = ("name", "compile")  # how the model runs, not what it is
SUMMARY_METRICS = tuple(m.value for m in Metric)


@contextmanager
def _one_line(what: str) -> Iterator[None]:
    """An object of the config that cannot be built (a wrong argument or value, or one its
    class refuses) as one ConfigError line, before any data is read."""
    try:
        yield
    except (InstantiationException, MisconfigurationException, ValueError, TypeError) as exc:
        raise ConfigError(f"invalid {what} setting: {' '.join(str(exc).split())}") from None


def make_logger(logger: DictConfig, run_dir: Path, resumed_in_place: bool) -> Logger:
    """The logger group's `_target_`, writing into the run directory."""
    # a run continued in its own directory logs beside the earlier logs (csv/resume-1/...):
    # Lightning's CSVLogger would otherwise delete the metrics.csv it finds
    version = ""
    if resumed_in_place:
        earlier = run_dir.glob(f"{logger.get('name', '')}/resume-*")
        version = f"resume-{len(list(earlier)) + 1}"
    with _one_line("logger"):
        return instantiate(logger, save_dir=str(run_dir), version=version)


def make_callbacks(callbacks: DictConfig, checkpoint_dir: Path) -> list[L.Callback]:
    """The callbacks group's `_target_` nodes, in order; a null node, or one that builds
    nothing (early stopping without a patience), is left out."""
    built = []
    for node in callbacks.values():
        if not (OmegaConf.is_dict(node) and "_target_" in node):
            continue  # the group's own settings (monitor, save_top_k, ...)
        with _one_line("callbacks"):
            callback = instantiate(node, _convert_="all")
        if callback is None:
            continue
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            # Lightning would save under the logger's version directory
            callback.dirpath = str(checkpoint_dir)
        built.append(callback)
    return built


def find_previous_run(run_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The newest `checkpoints/last.ckpt` of an earlier run of the same experiment: a run
    directory beside this one (outputs/<date>/<time>/), or this one itself when it is run
    again (a requeued cluster job), whose overrides equal `overrides` except the resume ones
    (resume, ckpt_path, trainer.max_epochs, sweep.resume)."""

    wanted = experiment_key(overrides)
    found = []
    for marker in Path(run_dir).resolve().parents[1].glob("*/*/.hydra/overrides.yaml"):
        previous = marker.parent.parent
        last = previous / "checkpoints" / "last.ckpt"
        if last.is_file():
            if experiment_key(OmegaConf.load(marker)) == wanted:
                found.append(last)
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def resume_source(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The checkpoint this run continues from: `ckpt_path`, the newest earlier run of the
    same experiment (`resume=auto`), or, for a job of a resumed sweep (`+sweep.resume=true`),
    its own `checkpoints/last.ckpt` when an earlier attempt was interrupted."""
    if cfg.resume is None:
        if cfg.ckpt_path:
            return Path(cfg.ckpt_path)
        own = Path(run_dir) / "checkpoints" / "last.ckpt"
        if cfg.get("sweep", {}).get("resume") and own.is_file():
            log.info("sweep.resume: this job was interrupted; resuming it from %s", own)
            return own
        return None
    if cfg.ckpt_path:
        raise ConfigError("give either ckpt_path or resume, not both")
    found = find_previous_run(run_dir, overrides)
    if found is not None:
        log.info("resume=%s: resuming from %s", cfg.resume, found)
    elif cfg.resume == "auto_or_new":
        log.info("resume=auto_or_new: no earlier run of this experiment, starting fresh")
    else:
        raise CheckpointError(
            f"resume=auto found no earlier run of this experiment (same overrides) with "
            f"checkpoints/last.ckpt under {Path(run_dir).resolve().parents[1]}; "
            "use resume=auto_or_new to start fresh"
        )
    return found


def _check_same_model(hparams: dict[str, Any], model_cfg: dict[str, Any], precision: str) -> None:
    """A checkpoint resumes only into the model (and precision family) it was trained as."""
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
    if (trained == "int8") != (precision == "int8"):
        raise ConfigError(
            f"the checkpoint was trained with precision={trained}, not precision={precision}"
        )


def train(
    cfg: DictConfig,
    run_dir: Path,
    extra_callbacks: Sequence[L.Callback] = (),
    overrides: Sequence[str] = (),
    init_weights: Path | None = None,
) -> dict[str, Any]:
    """Fit and test the configured TFT in `run_dir`; return the summary written there.
    `overrides` (the command line's) identify the experiment for `resume=auto`;
    `init_weights`: a checkpoint whose weights (not its optimizer or epoch) this run starts
    from, unless it resumes (a walk-forward fold fine-tuned from the previous fold's best)."""
    started = time.perf_counter()
    validate(cfg)
    for directory in (run_dir, run_dir / "checkpoints"):  # before any data is read
        check_writable(directory)
    remove_stale_temps(run_dir, run_dir / "checkpoints")  # of a killed earlier attempt
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    # plain containers for the checkpoint's hyperparameters: enums as their strings
    model_cfg: ModelHparams = _plain(cfg.model)
    precision_cfg: PrecisionHparams = _plain(cfg.precision)
    # manual optimization (micro-batches on OOM) clips in the module, not in the Trainer
    optim_cfg: OptimHparams = {
        **_plain(cfg.optim),
        "gradient_clip_val": cfg.trainer.gradient_clip_val,
    }

    ckpt_path, schema = None, None
    resume_from = resume_source(cfg, run_dir, overrides)
    resumed_in_place = False
    if resume_from:
        ckpt_path, hparams, _ = read_checkpoint_hparams(resume_from)
        remove_stale_temps(ckpt_path.parent)  # what a kill there during a save left
        # continuing in the checkpoint's own run directory (hydra.run.dir=<that run>, or a
        # resumed sweep's job); otherwise the new run directory leaves the old one untouched
        resumed_in_place = ckpt_path.parent == (Path(run_dir) / "checkpoints").resolve()
        schema = DataSchema.from_dict(hparams["schema"])
        _check_same_model(hparams, model_cfg, cfg.precision.name)

    configured = make_callbacks(cfg.callbacks, run_dir / "checkpoints")
    checkpoint = next((c for c in configured if isinstance(c, BestCheckpoint)), None)
    if checkpoint is None:
        raise ConfigError(
            "callbacks needs a foxhunt.training.checkpointing.BestCheckpoint (as in "
            "callbacks=default): the run tests and exports its best checkpoint"
        )
    latest = LatestCheckpoint(run_dir / "checkpoints")
    memory = memory_callbacks(cfg)
    if cfg.memory.batch_size_search.enabled:
        memory.insert(0, BatchSizeSearch(cfg))
    interrupt = GracefulInterrupt(run_dir / "checkpoints")
    outcome = TrainingOutcome(cfg.callbacks.get("monitor", "val_loss"))
    callbacks: list[L.Callback] = [*memory, interrupt, *configured, latest, outcome]
    callbacks += extra_callbacks
    callbacks.append(ShareCpus())  # intra-op threads: the CPUs other processes leave free
    if cfg.precision.name == "int8":
        callbacks.append(QATSchedule(cfg.precision.qat_start_epoch, cfg.precision.observer_epochs))
    # built before the data is read: a wrong Trainer argument is one line at the start
    trainer = make_trainer(
        cfg.trainer,
        precision=cfg.precision.trainer_precision,
        default_root_dir=run_dir,
        logger=make_logger(cfg.logger, run_dir, resumed_in_place),
        callbacks=callbacks,
        plugins=[SafeCheckpointIO()],
    )
    datamodule = ParquetDataModule(cfg.data, schema=schema, seed=cfg.seed)
    datamodule.setup()
    if not cfg.memory.batch_size_search.enabled and isinstance(cfg.memory.val_batch_size, int):
        datamodule.val_batch_size = cfg.memory.val_batch_size
    module = TFTModule(
        model=model_cfg,
        schema=datamodule.schema.to_dict(),
        optim=optim_cfg,
        precision=precision_cfg,
    )
    module.model.gradient_checkpointing = cfg.memory.gradient_checkpointing
    if init_weights and not ckpt_path:
        _, hparams, ckpt = read_checkpoint_hparams(init_weights)
        _check_same_model(hparams, model_cfg, cfg.precision.name)
        module.load_state_dict(ckpt["state_dict"])

    if trainer.world_size > 1:
        _before_other_processes(cfg, trainer, ckpt_path)
    device = trainer.strategy.root_device
    held = [*module.parameters(), *module.buffers()]
    budget_mb = cfg.memory.budget_mb
    if budget_mb is None and device.type == "cpu" and cfg.memory.batch_size_search.enabled:
        budget_mb = device_total(device) / 2**20  # trials must meet an OOM, not the OS's killer
    context_mb = cfg.memory.cuda_context_mb  # outside the allocator, inside the budget
    with (
        device_budget(device, budget_mb, track=held, cuda_context_mb=context_mb),
        _oom_is_a_user_error(cfg),
    ):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        # read before test(): restoring the best checkpoint there resets the callback's paths
        best, last, best_score = (
            checkpoint.best_model_path,
            latest.best_model_path,
            checkpoint.best_model_score,
        )
        ended = outcome.outcome(trainer)
        tested = trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)[0]

    summary = {
        "run_dir": str(run_dir),
        "resumed_from": str(ckpt_path) if ckpt_path else None,
        "initialized_from": str(init_weights) if init_weights else None,
        "best_checkpoint": best,
        "last_checkpoint": last,
        "epochs": trainer.current_epoch,
        "training": ended,
        "global_step": trainer.global_step,
        "batch_size": datamodule.batch_size,  # per process
        "global_batch_size": datamodule.batch_size * trainer.world_size,
        "world_size": trainer.world_size,  # DDP processes
        "val_batch_size": datamodule.val_batch_size,
        "num_features": datamodule.schema.num_features,
        "dropped_features": list(datamodule.schema.dropped),  # constant over the training split
        "num_parameters": sum(p.numel() for p in module.model.parameters()),
        "quantiles": model_cfg["quantiles"],
        "metrics": {
            "val_loss": _float(best_score),
            "test_loss": tested["test_loss"],
            "test_mae": tested["test_mae"],
            "test_directional_accuracy": tested["test_directional_accuracy"],
            "test_coverage": tested["test_coverage"],
            "baseline_test_loss": tested["test_baseline_loss"],
        },
    }
    if trainer.is_global_zero:
        # the baselines, scored on the model's own validation and test windows
        judged = _evaluate(trainer, module, run_dir, tested["test_loss"], cfg)
        summary["metrics"] |= judged.pop("metrics")
        summary |= judged
        # the best model, exported without pickle
        init = model_init(model_cfg, datamodule.schema)
        if cfg.precision.name == "int8":
            summary |= export_and_test_int8(
                module, init, datamodule, tested, run_dir / "checkpoints"
            )
        else:
            path = run_dir / "checkpoints" / "model_fp32.safetensors"
            export_weights(module.model, init, path, datamodule.schema.to_dict())
            summary["export"] = str(path)
    summary["splits"] = datamodule.splits
    summary["memory"] = memory_summary(cfg.memory.name, memory, device)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    if trainer.is_global_zero:  # under DDP every process has the summary; one writes it
        if datamodule.rolls:  # data.futures: the rolls the continuous series were cut at
            rolls = rolls_table(datamodule.rolls)
            write_atomic(run_dir / ROLLS, lambda f: pacsv.write_csv(rolls, f))
            summary["rolls"] = str(run_dir / ROLLS)
        write_json(run_dir / "summary.json", summary)
        if cfg.report:  # after the summary: nothing here can lose it
            _report(cfg, run_dir, summary, module, datamodule)
    trainer.strategy.barrier("summary")  # the other processes end with rank 0, not after it
    return summary


def _evaluate(
    trainer: L.Trainer, module: TFTModule, run_dir: Path, test_loss: float, cfg: DictConfig
) -> dict[str, Any]:
    """The model's test forecasts, once: written to test_forecasts.parquet, scored beside the
    baselines (`foxhunt.evaluation.baselines`) on the same windows, pooled and per instrument,
    and judged as a quant would (`foxhunt.evaluation.quality`: IC, calibration, a costed
    strategy). Returns summary.json's `baselines`, `evaluation` and `strategy`, and its
    headline `metrics`: the skill against the strongest baseline, its name, the base rate of
    up moves, the same per instrument, the IC and probabilistic scores."""
    started = time.perf_counter()
    datamodule: ParquetDataModule = trainer.datamodule
    schema, quantiles = datamodule.schema, module.quantiles.tolist()
    pred = forecast_test(trainer, module)
    baselines, test, strongest = score_baselines(
        datamodule.datasets, schema.target_kind, quantiles, schema.groups, pred, cfg.seed
    )
    pooled = test.pop(None, {})
    best = None if strongest is None else (pooled["best_baseline"], strongest)
    table = forecast_table(datamodule.datasets["test"], schema, pred, quantiles, best)
    write_atomic(run_dir / FORECASTS, lambda f: pq.write_table(table, f))
    log.info("baselines: fit and scored in %.1f s", time.perf_counter() - started)
    if pooled.get("test_loss") is not None and abs(pooled["test_loss"] / test_loss - 1) > 1e-3:
        log.warning(  # the same windows and model: a mismatch is a bug, not noise
            "the test forecasts score %.6g, the test step %.6g", pooled["test_loss"], test_loss
        )
    headline = {
        "skill": pooled.get("skill"),
        "best_baseline": pooled.get("best_baseline"),
        "test_up_share": pooled.get("up_share"),
        "by_instrument": test,
    }
    judged, evaluation, results = evaluate(
        table, schema.target_kind, cfg.eval.stride, cfg.eval.strategy, cfg.eval.cost_bps
    )
    strategy = strategy_summary(
        results, cfg.eval.strategy, cfg.eval.cost_bps, pooled.get("best_baseline")
    )
    if cfg.report:
        plot_equity(equity_curves(results, pooled.get("best_baseline")), run_dir / EQUITY_PLOT)
    return {
        "metrics": headline | judged,
        "baselines": baselines,
        "evaluation": evaluation,
        "strategy": strategy,
    }


def export_and_test_int8(
    module: TFTModule, init: dict, datamodule: ParquetDataModule, tested: dict, out_dir: Path
) -> dict[str, Any]:
    """Export the (best) QAT model as int8 next to the checkpoints and score it on the test
    split beside the fake-quant model it came from."""
    qat_model = module.model.eval()
    set_qat_phase(qat_model, observe=False, fake_quant=True)
    path = out_dir / "model_int8.safetensors"
    int8_bytes = export_int8(qat_model, init, path, schema=datamodule.schema.to_dict())
    fp32_bytes = len(safetensors_bytes(TemporalFusionTransformer(**init).state_dict()))
    int8_model = load_int8(path)
    quantiles = module.quantiles.cpu()
    loss_sum = count = 0.0
    diffs, scale = [], []
    with torch.no_grad():
        for batch in datamodule.test_dataloader(sharded=False):
            pred = int8_model(batch)
            n = pred.numel()
            loss_sum += float(quantile_loss(pred, batch["target"], quantiles)) * n
            count += n
            reference = qat_model(batch)
            diffs.append((pred - reference).abs().flatten())
            scale.append(reference.flatten())
    diff, ref_std = torch.cat(diffs), float(torch.cat(scale).std())
    return {
        "export": str(path),
        "int8_model": str(path),
        "int8_test_loss": loss_sum / max(count, 1),
        "fp32_equivalent_test_loss": tested["test_loss"],
        "export_bytes_int8": int8_bytes,
        "export_bytes_fp32": fp32_bytes,
        "int8_vs_fake_quant_max_abs_diff_rel_std": float(diff.max()) / ref_std,
        "int8_vs_fake_quant_mean_abs_diff_rel_std": float(diff.mean()) / ref_std,
    }


def make_trainer(trainer: DictConfig, **set_by_foxhunt: Any) -> L.Trainer:
    """The trainer group's `lightning.Trainer`, built by Hydra, with the arguments foxhunt
    sets itself (precision, logger, callbacks, plugins, the run directory); a value Lightning
    refuses is one ConfigError line."""
    with _one_line("trainer"):
        build: Callable[..., L.Trainer] = instantiate(trainer, _partial_=True, _convert_="all")
        # the module's step clips to gradient_clip_val itself (Lightning refuses clipping with
        # manual optimization)
        return build(gradient_clip_val=None, strategy=_strategy(trainer.strategy), **set_by_foxhunt)


def _strategy(name: str) -> str | Strategy:
    if name != "ddp":
        return name
    # DDP without its buffer broadcast in forward: the buffers here are constants (the
    # quantiles), and the broadcast would be a collective in validation steps, whose number
    # differs by process (torch 2.13 renamed the switch)
    ddp_args = inspect.signature(DistributedDataParallel).parameters
    key = "forward_sync_buffers" if "forward_sync_buffers" in ddp_args else "broadcast_buffers"
    return DDPStrategy(**{key: False})


def _before_other_processes(cfg: DictConfig, trainer: L.Trainer, ckpt_path: Path | None) -> None:
    """Checks and hand-overs for DDP, whose other processes Lightning starts inside fit() by
    re-running this command (with the same Hydra run directory, no .hydra of their own)."""
    if cfg.memory.oom_backoff.enabled and not cfg.memory.oom_backoff.keep_effective_batch:
        raise ConfigError(
            "memory.oom_backoff.keep_effective_batch=false turns an OOM into extra optimizer "
            "steps, which the other DDP processes would not take; keep it true with DDP"
        )
    strategy = trainer.strategy
    if not isinstance(strategy.launcher, _SubprocessScriptLauncher):
        return
    if strategy.cluster_environment.creates_processes_externally:
        return  # torchrun, SLURM: nothing is re-run, this is one of the processes
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ConfigError(
            f"trainer.strategy={cfg.trainer.strategy} cannot run inside a Hydra multirun (-m): "
            "Lightning starts the other processes by re-running the command, which would "
            "re-run the whole sweep; run each combination as its own command"
        )
    if cfg.resume is not None:
        # the re-run processes continue from the checkpoint this one resolved (resume=auto
        # looks for the newest run, which may change meanwhile); ckpt_path and resume do not
        # identify the experiment, so the re-run command stays the same experiment
        resumed = f'"{ckpt_path}"' if ckpt_path else "null"
        keep = [a for a in sys.argv[1:] if a.split("=", 1)[0].lstrip("+~") != "resume"]
        sys.argv[1:] = [*keep, f"ckpt_path={resumed}"]


def _report(cfg: DictConfig, run_dir: Path, summary: dict, module: TFTModule, data: Any) -> None:
    """report.md and the interpretation plots; a failure there is one warning, not a failed
    run (the model and its summary are already written)."""
    try:
        report_run(cfg, run_dir, summary, module, data)
    except Exception as exc:  # noqa: BLE001 - any report failure is reported the same way
        log.warning(
            "the run report failed (%s: %s); the run itself is complete", type(exc).__name__, exc
        )


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


def memory_summary(policy: str, callbacks: list[L.Callback], device: torch.device) -> dict:
    """What the memory policy did: sizes, backoffs, released state, the [MEMORY] lines."""
    out: dict[str, Any] = {"policy": policy, "device": str(device)}
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


def _plain(node: DictConfig) -> Any:
    """A config group as plain containers, its enums as their strings (what a checkpoint's
    weights-only loading accepts)."""
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)


def _float(x: torch.Tensor | None) -> float | None:
    return None if x is None else float(x)
