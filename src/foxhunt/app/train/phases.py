"""One training run from a composed config, as its phases: prepare, the resume point, assemble
the parts (`foxhunt.app.train.assemble`), fit and test (DDP's hand-overs:
`foxhunt.app.train.ddp`), finish:
the model's forecasts evaluated (`foxhunt.evaluation.run`), the best model exported,
summary.json, the report."""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch
from omegaconf import DictConfig

from foxhunt.app.report.run_report import report_run
from foxhunt.app.train import tracking
from foxhunt.app.train.after_test import hold_after_test
from foxhunt.app.train.assemble import Assembled, Resumed, assemble, check_same_model, plain
from foxhunt.app.train.ddp import before_other_processes, srun_tasks_match
from foxhunt.config import Metric, validate
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.futures import ROLLS, rolls_table
from foxhunt.data.schema import DataSchema
from foxhunt.evaluation.book import BOOK_PLOT, plot_book
from foxhunt.evaluation.calibration import Calibration, crossing_rate
from foxhunt.evaluation.forecasts import FORECASTS
from foxhunt.evaluation.quality import EQUITY_PLOT
from foxhunt.evaluation.run import evaluate_run, headline_metrics, quantile_loss, validation_returns
from foxhunt.evaluation.strategy import plot_equity
from foxhunt.files import check_writable, remove_stale_temps, write_atomic, write_json
from foxhunt.memory.budget import device_budget, device_total
from foxhunt.memory.callbacks import (
    MemoryLog,
    OOMBackoff,
    OptimizerStateRelease,
    OutOfMemoryAtMinimum,
    batch_one_needs,
)
from foxhunt.memory.heap import keep_freed_memory
from foxhunt.memory.search import BatchSizeSearch
from foxhunt.models import cpu_kernels
from foxhunt.precision import BestModel, Precision, precision_of
from foxhunt.run.dir import RunDir
from foxhunt.run.ranks import other_rank
from foxhunt.run.resume import resume_source
from foxhunt.training.checkpoint_io import annotate_checkpoint, read_checkpoint_hparams
from foxhunt.training.module import TFTModule, model_init
from foxhunt.training.step import validation_forward

log = logging.getLogger(__name__)
SUMMARY_METRICS = tuple(m.value for m in Metric)


@dataclass
class Fitted:
    """What fit and test leave: the checkpoints, how training ended, the test metrics."""

    best: str
    last: str
    best_score: float | None
    ended: dict[str, Any]
    tested: dict[str, float]


def train(
    cfg: DictConfig,
    run_dir: Path,
    extra_callbacks: Sequence[L.Callback] = (),
    overrides: Sequence[str] = (),
    init_weights: Path | None = None,
    test: bool = True,
) -> dict[str, Any]:
    """Fit and test the configured TFT in `run_dir`; return the summary written there.
    `overrides` (the command line's) identify the experiment for `resume=auto`;
    `init_weights`: a checkpoint whose weights (not its optimizer or epoch) this run starts
    from, unless it resumes (a walk-forward fold fine-tuned from the previous fold's best).
    `test=False`: fit and judge the best model on the validation windows alone (a tuning
    study's fold, whose data ends where its test period would start)."""
    with _torch_flags_kept():  # trainer.deterministic=true sets them for the whole process
        return _train(cfg, run_dir, extra_callbacks, overrides, init_weights, test)


def _train(
    cfg: DictConfig,
    run_dir: Path,
    extra_callbacks: Sequence[L.Callback],
    overrides: Sequence[str],
    init_weights: Path | None,
    test: bool,
) -> dict[str, Any]:
    started, calls = time.perf_counter(), Counter(cpu_kernels.CALLS)
    keep_freed_memory()  # a step's memory stays mapped for the next (foxhunt.memory.heap)
    phase = Phases()
    with phase("setup"):  # the checks, the data read and windowed, the model built
        run = prepare(cfg, run_dir)
        precision = precision_of(cfg)  # chosen once; checked before any data is read
        resumed = resume_point(cfg, run, overrides, precision)
        parts = assemble(cfg, run, resumed, precision, extra_callbacks, init_weights)
    fitted = fit_and_test(cfg, parts, resumed.ckpt_path, test, phase)
    origin = {
        "resumed_from": str(resumed.ckpt_path) if resumed.ckpt_path else None,
        "initialized_from": str(init_weights) if init_weights else None,
    }
    with phase("evaluate"):  # forecasts, calibration, baselines, strategy, export
        summary = (finish if test else finish_validation)(cfg, run, parts, fitted, origin)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    summary["phases_s"] = phase.seconds
    # which build of the C kernels ran in this run, or why none did
    summary["cpu_kernels"] = cpu_kernels.report(parts.trainer.strategy.root_device.type, calls)
    if parts.trainer.is_global_zero:  # under DDP every process has the summary; one writes it
        write_json(run.summary, summary)
        if cfg.report and test:  # after the summary: nothing here can lose it
            with phase("report"):
                _report(cfg, run.path, summary, parts.module, parts.datamodule)
        tracking.publish(cfg, run.path, summary, parts.trainer.loggers)  # logger=mlflow
        log.info("run: %s", ", ".join(f"{k} {v:g} s" for k, v in phase.seconds.items()))
    parts.trainer.strategy.barrier("summary")  # the other processes end with rank 0
    return summary


class Phases:
    """Wall seconds of each phase of a run (summary.json's phases_s; the report's, which comes
    after the summary is written, only in the log)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - began, 1)


def prepare(cfg: DictConfig, run_dir: Path) -> RunDir:
    """Check the config and the run directory before any data is read; seed everything."""
    validate(cfg)
    run = RunDir(run_dir)
    if not other_rank():  # rank 0 writes the run's files: the other DDP processes none
        for directory in (run.path, run.checkpoints):
            check_writable(directory)
        remove_stale_temps(run.path, run.checkpoints)  # of a killed earlier attempt
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    return run


def resume_point(
    cfg: DictConfig, run: RunDir, overrides: Sequence[str], precision: Precision
) -> Resumed:
    """The checkpoint this run continues from (`foxhunt.run.resume`), checked to be the same
    model and precision family."""
    resume_from = resume_source(cfg, run.path, overrides)
    if not resume_from:
        return Resumed()
    ckpt_path, hparams, _ = read_checkpoint_hparams(resume_from)
    if not other_rank():
        remove_stale_temps(ckpt_path.parent)  # what a kill there during a save left
    check_same_model(hparams, plain(cfg.model), precision)
    # continuing in the checkpoint's own run directory (hydra.run.dir=<that run>, or a
    # resumed sweep's job); otherwise the new run directory leaves the old one untouched
    in_place = ckpt_path.parent == run.checkpoints.resolve()
    return Resumed(ckpt_path, DataSchema.from_dict(hparams["schema"]), in_place)


def fit_and_test(
    cfg: DictConfig,
    parts: Assembled,
    ckpt_path: Path | None,
    test: bool = True,
    phase: Phases | None = None,
) -> Fitted:
    """Fit (from `ckpt_path` when resuming) and test the best checkpoint (unless not `test`),
    under the memory policy's budget."""
    trainer, module, datamodule = parts.trainer, parts.module, parts.datamodule
    srun_tasks_match(trainer)
    if trainer.world_size > 1:
        before_other_processes(cfg, trainer, ckpt_path)
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
        phase = phase or Phases()
        with warnings.catch_warnings(), phase("fit"):
            # a checkpoint written mid-epoch (an interrupt) resumes exactly: the data module
            # records how far the epoch got (its state_dict), which Lightning's warning ignores
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that")
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        # read before test(): restoring the best checkpoint there resets the callback's paths
        best, last = parts.checkpoint.best_model_path, parts.latest.best_model_path
        best_score, ended = parts.checkpoint.best_model_score, parts.outcome.outcome(trainer)
        tested = {}
        if test:
            # every test window's forecast, kept for the evaluation (one process: under DDP
            # each holds its shard, and rank 0 forecasts them all again)
            module.kept = [] if trainer.world_size == 1 and _every_window(cfg, "test") else None
            with phase("test"):
                run = trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)
            tested = run[0]
    return Fitted(best, last, _float(best_score), ended, tested)


def finish(
    cfg: DictConfig, run: RunDir, parts: Assembled, fitted: Fitted, origin: dict[str, Any]
) -> dict[str, Any]:
    """summary.json's content: the run's figures, then (rank 0) the evaluation against the
    baselines, the export of the best model and the rolls the series were cut at."""
    trainer, datamodule, module = parts.trainer, parts.datamodule, parts.module
    summary = {"run_dir": str(run.path), **origin, **_run_figures(cfg, parts, fitted)}
    if trainer.is_global_zero:
        judged, calibration = evaluate_test(
            trainer, module, run.path, fitted.tested["test_loss"], cfg
        )
        summary["metrics"] |= judged.pop("metrics")
        summary |= judged
        hold_after_test(calibration, module, datamodule, cfg)  # before the state is written
        calibrated = calibration.to_dict()
        summary |= export_best(
            cfg, parts.precision, module, datamodule, fitted.tested, run, calibrated
        )
        if fitted.best:  # the best checkpoint carries its calibration (predict applies it)
            annotate_checkpoint(fitted.best, calibration=json.dumps(calibrated))
    summary["splits"] = datamodule.splits
    summary["target"] = datamodule.schema.target_summary()
    summary["memory"] = memory_summary(parts.memory, trainer.strategy.root_device)
    if trainer.is_global_zero and datamodule.rolls:  # data.futures: where series were cut
        rolls = rolls_table(datamodule.rolls)
        write_atomic(run.path / ROLLS, lambda f: pacsv.write_csv(rolls, f))
        summary["rolls"] = str(run.path / ROLLS)
    return summary


def finish_validation(
    cfg: DictConfig, run: RunDir, parts: Assembled, fitted: Fitted, origin: dict[str, Any]
) -> dict[str, Any]:
    """summary.json of a run without a test period: its figures, and (rank 0) the best
    model's validation forecasts traded by the costed strategy of `eval` (its per-bar
    portfolio returns: what a tuning study's selection statistics are computed from)."""
    trainer, datamodule, module = parts.trainer, parts.datamodule, parts.module
    summary = {"run_dir": str(run.path), **origin, **_run_figures(cfg, parts, fitted)}
    summary["metrics"] = {"val_loss": fitted.best_score}
    if trainer.is_global_zero and fitted.best:
        module.load_state_dict(read_checkpoint_hparams(fitted.best)[2]["state_dict"])
        pred, _ = forecast_split(trainer, module, "val")
        summary["validation"] = validation_returns(
            datamodule.datasets["val"], datamodule.schema, pred, list(cfg.model.quantiles), cfg.eval
        )
    summary["splits"] = datamodule.splits
    summary["target"] = datamodule.schema.target_summary()
    summary["memory"] = memory_summary(parts.memory, trainer.strategy.root_device)
    return summary


def _run_figures(cfg: DictConfig, parts: Assembled, fitted: Fitted) -> dict[str, Any]:
    trainer, datamodule, schema = parts.trainer, parts.datamodule, parts.datamodule.schema
    return {
        "best_checkpoint": fitted.best,
        "last_checkpoint": fitted.last,
        "epochs": trainer.current_epoch,
        "training": fitted.ended,
        "global_step": trainer.global_step,
        "batch_size": datamodule.batch_size,  # per process
        "global_batch_size": datamodule.batch_size * trainer.world_size,
        "world_size": trainer.world_size,  # DDP processes
        "val_batch_size": datamodule.val_batch_size,
        "num_features": schema.num_features,
        "windows": {split: len(d) for split, d in datamodule.datasets.items()},
        "dropped_features": list(schema.dropped),  # constant over the training split
        "num_parameters": sum(p.numel() for p in parts.module.model.parameters()),
        "quantiles": list(cfg.model.quantiles),
        "metrics": headline_metrics(fitted.best_score, fitted.tested),
    }


def evaluate_test(
    trainer: L.Trainer, module: TFTModule, run_dir: Path, test_loss: float, cfg: DictConfig
) -> tuple[dict[str, Any], Calibration]:
    """The model's validation and test forecasts, once, evaluated (`foxhunt.evaluation.run`:
    calibrated on the validation windows, the test's judged beside the baselines on the same
    windows), written to test_forecasts.parquet. Returns summary.json's `baselines`,
    `evaluation`, `strategy` and `calibration`, its headline `metrics` merged in, and the
    calibration."""
    datamodule: ParquetDataModule = trainer.datamodule
    quantiles = list(cfg.model.quantiles)  # exact: the module's buffer is float32
    raw, model_crossing = _test_forecasts(trainer, module, test_loss, cfg)
    val_pred, _ = forecast_split(trainer, module, "calibration")
    done = evaluate_run(
        datamodule.datasets,
        datamodule.schema,
        val_pred,
        raw,
        model_crossing,
        quantiles,
        cfg.calibration,
        cfg.eval,
        cfg.seed,
    )
    write_atomic(run_dir / FORECASTS, lambda f: pq.write_table(done.judged.table, f))
    if cfg.report:
        plot_equity(done.judged.equity, run_dir / EQUITY_PLOT)
        if done.judged.book and "skipped" not in done.judged.book:
            plot_book(done.judged.book, run_dir / BOOK_PLOT)
    return done.summary, done.calibration


def _test_forecasts(
    trainer: L.Trainer, module: TFTModule, test_loss: float, cfg: DictConfig
) -> tuple[np.ndarray, float | None]:
    """[windows, H, Q] the test windows' forecasts and their crossing rate: the test step's
    own when it kept them, else made again (and checked to score what the test step did)."""
    datamodule: ParquetDataModule = trainer.datamodule
    if module.kept is not None:  # the test step's own forecasts
        raw = torch.cat(module.kept).numpy() if module.kept else np.empty((0, 0, 0), np.float32)
        model_crossing, module.kept = crossing_rate(raw), None
        assert len(raw) == len(datamodule.datasets["test"]), "the test step skipped windows"
        return raw, model_crossing
    raw, model_crossing = forecast_split(trainer, module, "test")
    quantiles = list(cfg.model.quantiles)
    own_loss = quantile_loss(raw, datamodule.datasets["test"], datamodule.schema, quantiles)
    if own_loss is not None and _every_window(cfg, "test"):
        if abs(own_loss / test_loss - 1) > 1e-3:
            log.warning(  # the same windows and model: a mismatch is a bug, not noise
                "the test forecasts score %.6g, the test step %.6g", own_loss, test_loss
            )
    return raw, model_crossing


def _every_window(cfg: DictConfig, split: str) -> bool:
    """Whether the Trainer's `split` pass sees every window (no trainer.limit_*_batches; an
    integer is a number of batches, 1 one batch, the float 1.0 all of them)."""
    limit = cfg.trainer.get(f"limit_{split}_batches")
    return limit is None or (isinstance(limit, float) and limit == 1.0)


def export_best(
    cfg: DictConfig,
    precision: Precision,
    module: TFTModule,
    datamodule: ParquetDataModule,
    tested: dict,
    run: RunDir,
    calibration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The best model, exported without pickle by its precision: safetensors (fp32, bf16), or
    int8 scored on the test split beside the fake-quant model it came from; with its
    calibration."""
    run.checkpoints.mkdir(exist_ok=True)  # none yet where a resume had nothing left to train
    best = BestModel(
        module.model,
        init=model_init(plain(cfg.model), datamodule.schema),
        schema=datamodule.schema.to_dict(),
        run=run,
        test_batches=datamodule.test_dataloader(sharded=False),
        quantiles=module.quantiles,
        test_loss=tested["test_loss"],
        calibration=calibration,
    )
    return precision.export(best)


def forecast_split(
    trainer: L.Trainer, module: L.LightningModule, split: str = "test"
) -> tuple[np.ndarray, float | None]:
    """[windows, H, Q] the module's quantile forecasts (normalized units) of every window of
    `split` (test, val, or calibration: the windows calibration fits on), in the dataset's
    order: the unsharded loader (rank 0 forecasts them all), under the Trainer's precision and
    grad mode, as the test step made them. And the share of steps whose quantiles crossed
    (none with model.monotone; a model trained before it may)."""
    datamodule = trainer.datamodule
    loaders = {
        "test": datamodule.test_dataloader,
        "val": datamodule.val_dataloader,
        "calibration": datamodule.calibration_dataloader,
    }
    loader = loaders[split](sharded=False)  # in order: no shuffle
    preds = []
    was_training = module.training
    module.eval()
    no_grad = torch.inference_mode if trainer.test_loop.inference_mode else torch.no_grad
    with no_grad(), trainer.precision_plugin.forward_context():
        for batch in loader:
            batch = {k: v.to(module.device) for k, v in batch.items()}
            preds.append(validation_forward(module.model, batch).float().cpu())
    module.train(was_training)
    pred = torch.cat(preds).numpy() if preds else np.empty((0, 0, 0), np.float32)
    assert len(pred) == len(loader.dataset), f"the {split} loader skipped windows"
    return pred, crossing_rate(pred)


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
def _torch_flags_kept() -> Iterator[None]:
    """torch's deterministic-algorithms switch as it was before the run: the next run in this
    process (a sweep's, a backtest's fold, a test's) sets its own."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


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


def memory_summary(callbacks: list[L.Callback], device: torch.device) -> dict:
    """What the memory policy did: sizes, backoffs, released state, the [MEMORY] lines."""
    out: dict[str, Any] = {"device": str(device)}
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
