"""foxhunt tune: an Optuna study over walk-forward validation periods, pruned per fold and
epoch, in a storage several processes and machines share; then the winner refit on every
backtest fold and scored once on the test periods, beside the strongest baseline, with the
deflated Sharpe ratio and the probability of backtest overfitting of having chosen it
(`foxhunt.evaluation.selection`). See docs/tune.md.

- **Folds.** The backtest's fold plan (`foxhunt.app.backtest.folds`, conf/backtest.yaml) fixes the
  test periods. The study reads nothing from the first of them on: its `tune.folds` validation
  periods, each the backtest's val_span bars, end where that test period starts (the last is
  the backtest's first validation period), and a trial trains on what precedes each of them
  (expanding or rolling, with the embargo), the data cut at the period's end as it is read
  (`foxhunt.data.read.read_end`). Its value is the mean of the folds' best validation losses.
- **The space is configuration**: conf/tune_space/<option>.yaml, one entry per config key.
- **Optuna directly**, an ask-and-tell loop of our own rather than `study.optimize`: the loop
  ends on finished trials (completed or pruned) across every worker, not on this process's
  count; a trial that cannot fit in memory or whose combination is invalid is pruned with the
  reason; each running trial writes a heartbeat, so a resumed study re-runs the trials of dead
  workers (Optuna's own heartbeat is the RDB storage's alone, and only inside optimize).
- **Storage** (`foxhunt.app.tune.study`): a journal file in the study's directory (the default;
  file locks, so it works on a shared filesystem) or an RDB URL (PostgreSQL for several
  machines). The study is named after the command's overrides (tune.study to choose), so the
  same command continues it."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing as mp
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from foxhunt.app.backtest import folds as backtest
from foxhunt.app.backtest.folds import Fold
from foxhunt.app.train import tracking
from foxhunt.app.train.phases import train
from foxhunt.app.tune.study import (
    Heartbeat,
    counts,
    counts_toward,
    mark_worker,
    open_study_or_explain,
    recover,
    same_plan,
    storage_label,
)
from foxhunt.config import validate
from foxhunt.data.names import resolve_data
from foxhunt.data.read import timeline
from foxhunt.data.splits import NO_START
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.evaluation import selection
from foxhunt.files import write_json, write_text
from foxhunt.memory.callbacks import OutOfMemoryAtMinimum
from foxhunt.run.dir import RunDir
from foxhunt.run.resume import experiment_key

log = logging.getLogger(__name__)
SUMMARY = "tune_summary.json"
REPORT = "tune_report.md"
FOLD_STEPS = 10_000  # a trial reports fold k's n-th validation at step k * FOLD_STEPS + n
# what names a study: the overrides but how many trials, where, by how many workers
NOT_THE_STUDY = ("tune.trials", "tune.jobs", "tune.worker", "tune.refit", "tune.dir")
NOT_THE_STUDY += ("tune.storage", "tune.heartbeat_s", "tune.grace_s", "hydra")


def tune(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, Any]:
    """The study (continued where its storage holds it), then (unless a worker job) the refit
    and the summary, written to the study's directory."""
    check(cfg)
    resolve_data(cfg.data)  # the sample generated; the columns found (foxhunt.data.names)
    folds = study_folds(timeline(cfg.data), cfg)
    plan = {
        "space": OmegaConf.to_container(cfg.tune_space, resolve=True),
        "folds": [f.split() for f in folds],
    }
    name = study_name(cfg, overrides, plan)
    study_dir = Path(cfg.tune.dir).expanduser().resolve() / name
    study_dir.mkdir(parents=True, exist_ok=True)
    study = open_study_or_explain(cfg, name, study_dir, cfg.seed)
    same_plan(study, plan)
    cfg = tracking.study_run(cfg, study)  # logger=mlflow: the study's run, its trials nested
    if not cfg.tune.worker:  # one process re-queues a dead worker's trials: the first
        recover(study, cfg.tune.grace_s)
    log.info("tune: study %s in %s, %d folds", name, storage_label(cfg, study_dir), len(folds))
    search(cfg, folds, name, study_dir)
    if cfg.tune.worker is not None:  # a multirun's job: the command without -m refits
        return {"study": name, "study_dir": str(study_dir), **counts(study)}
    return summarize(cfg, study, study_dir)


def check(cfg: DictConfig) -> None:
    """What a study refuses before any data is read."""
    t = cfg.tune
    for key in ("trials", "jobs", "folds"):
        if t[key] < 1:
            raise ConfigError(f"tune.{key} must be at least 1, got {t[key]}")
    space = entries(cfg.tune_space or {})
    if not space:
        raise ConfigError("tune_space is empty: choose one (tune_space=tft) or write one")
    for key in space:
        if OmegaConf.select(cfg, key, default="absent") == "absent":
            raise ConfigError(f"tune_space names {key}, which is not a config key")
    if cfg.backtest.fold is not None:
        raise ConfigError("a study plans its own folds: drop backtest.fold")
    backtest.check(cfg)


def study_folds(times: np.ndarray, cfg: DictConfig) -> list[Fold]:
    """The study's folds on the common timeline `times`: tune.folds validation periods of the
    backtest's val_span bars, consecutive, the last ending where its first test period starts;
    each with no test period (test_start = test_end: nothing from there on is read)."""
    plan = backtest.plan_folds(times, cfg.backtest, cfg.data)
    first_test = int(np.searchsorted(times, plan[0].test_start))
    val_span = first_test - int(np.searchsorted(times, plan[0].val_start))
    rolling = plan[0].train_start != NO_START
    train_span = first_test - val_span - int(np.searchsorted(times, plan[0].train_start))
    n = cfg.tune.folds
    data = cfg.data
    embargo = data.prediction_length if data.split.embargo is None else data.split.embargo
    first_val = first_test - n * val_span
    least = data.encoder_length + data.prediction_length + embargo
    if first_val - (train_span if rolling else 0) < least:
        raise ConfigError(
            f"{n} validation periods of {val_span} bars before the first test period leave "
            f"the first study fold {first_val} bars of training, too few for one window: "
            "lower tune.folds or backtest.val_span (or backtest.folds)"
        )
    folds = []
    for k in range(n):
        val = first_val + k * val_span
        end = int(times[val + val_span])
        start = int(times[val - train_span]) if rolling else NO_START
        folds.append(Fold(k, start, int(times[val]), end, end))
    return folds


def study_name(cfg: DictConfig, overrides: Sequence[str], plan: dict[str, Any]) -> str:
    """tune.study, or a name from the command's overrides and the study's plan (its space and
    folds: the same command on data that grew is another study)."""
    if cfg.tune.study:
        return str(cfg.tune.study)
    kept = experiment_key(overrides)
    parsed = OverridesParser.create().parse_overrides([o for o in overrides if o in kept])
    # by value, the last of a key's (as Hydra applies them): a multirun's job spells
    # report=false as report=False, and gets a key given twice once
    values = {o.key_or_group: json.dumps(o.value(), sort_keys=True, default=str) for o in parsed}
    key = [f"{k}={v}" for k, v in sorted(values.items()) if not k.startswith(NOT_THE_STUDY)]
    key.append(json.dumps(plan, sort_keys=True))
    return "tune-" + hashlib.sha256("\n".join(key).encode()).hexdigest()[:10]


def search(cfg: DictConfig, folds: list[Fold], name: str, study_dir: Path) -> None:
    """Trials until the study has tune.trials finished ones, in tune.jobs processes: this one
    and tune.jobs - 1 started beside it, all beginning once every one is ready."""
    jobs = int(cfg.tune.jobs)
    base_seed = cfg.seed + (cfg.tune.worker or 0) * jobs
    if jobs == 1:
        work(cfg, folds, name, study_dir, base_seed)
        return
    spawn = mp.get_context("spawn")  # a fresh interpreter: no fork of torch's threads
    ready = spawn.Barrier(jobs)
    others = [
        spawn.Process(
            target=_worker_process,
            # the config as plain containers: its schema's types are made at runtime
            args=(_plain(cfg), folds, name, study_dir, base_seed + k, ready),
            name=f"tune-worker-{k}",
        )
        for k in range(1, jobs)
    ]
    for p in others:
        p.start()
    try:
        ready.wait(timeout=600)
        work(cfg, folds, name, study_dir, base_seed)
    finally:
        for p in others:
            p.join()
    failed = [p.name for p in others if p.exitcode != 0]
    if failed:
        log.warning("tune: %s exited with an error (its trials are in the study)", failed)


def _plain(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def _worker_process(
    plain: dict[str, Any], folds: list[Fold], name: str, study_dir: Path, seed: int, ready: Any
) -> None:
    """A worker of `search` in its own process (its own logging: nothing is inherited)."""
    from foxhunt.threads import use_cpus

    cfg = OmegaConf.create(plain)
    OmegaConf.set_struct(cfg, True)

    logging.basicConfig(level=logging.WARNING, format="[%(processName)s] %(message)s")
    logging.getLogger("foxhunt").setLevel(logging.INFO)
    use_cpus()
    try:
        open_study_or_explain(cfg, name, study_dir, seed)
    finally:
        ready.wait(timeout=600)
    work(cfg, folds, name, study_dir, seed)


def work(cfg: DictConfig, folds: list[Fold], name: str, study_dir: Path, seed: int) -> None:
    """Ask, run and tell trials until the study's finished and running trials reach
    tune.trials; a progress line after each."""
    study = open_study_or_explain(cfg, name, study_dir, seed)
    budget, started, done_here = int(cfg.tune.trials), time.perf_counter(), 0
    while (n := counts(study))["trials_finished"] + n["trials_running"] < budget:
        trial = study.ask()
        ahead = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.number < trial.number and counts_toward(t)
        ]
        if len(ahead) >= budget:  # another worker took the last one meanwhile
            trial.set_user_attr("failed", "not run: the study had its trials")
            study.tell(trial, state=TrialState.FAIL)
            break
        state, value = run_and_tell(cfg, folds, study, trial, study_dir)
        done_here += 1
        progress(study, trial.number, state, value, budget, started, done_here, cfg.tune.jobs)


def run_and_tell(
    cfg: DictConfig, folds: list[Fold], study: optuna.Study, trial: optuna.Trial, study_dir: Path
) -> tuple[TrialState, float | None]:
    """One trial, told to the study: complete, pruned (by the pruner, for memory, for an
    invalid combination: the reason in its user attribute `pruned`), or failed (a
    FoxhuntError, raised on after it is told: the study stops with its one line)."""
    mark_worker(trial)
    started = time.perf_counter()
    state, value = TrialState.COMPLETE, None
    try:
        with Heartbeat(trial, cfg.tune.heartbeat_s), tracking.trial_run(cfg, trial) as trial_cfg:
            value = run_trial(trial_cfg, folds, trial, study_dir)
    except (optuna.TrialPruned, OutOfMemoryAtMinimum, _Invalid) as why:
        state = TrialState.PRUNED
        trial.set_user_attr("pruned", str(why) or "by the pruner")
    except FoxhuntError as exc:
        trial.set_user_attr("error", str(exc))
        study.tell(trial, state=TrialState.FAIL)
        raise
    except BaseException as interrupted:  # an interrupt, a bug: failed, and queued again
        try:
            trial.set_user_attr("failed", "interrupted")
            study.tell(trial, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # a cancelled SLURM job, whose trial
            raise interrupted from None  # another worker's `recover` failed and queued first
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        raise
    trial.set_user_attr("wall_s", round(time.perf_counter() - started, 1))
    if state == TrialState.PRUNED:
        study.tell(trial, state=state)
    else:
        study.tell(trial, value)
    return state, value


class _Invalid(FoxhuntError):
    """A combination of the space the config checks refuse."""


def run_trial(cfg: DictConfig, folds: list[Fold], trial: optuna.Trial, study_dir: Path) -> float:
    """The trial's parameters trained on each study fold in turn, validation losses reported
    to the pruner; the mean of the folds' best validation losses. The folds' portfolio
    returns on their validation windows go to the trial's `returns` (for DSR and PBO)."""
    params = suggest(trial, cfg.tune_space)
    losses, times, nets = [], [], []
    for fold in folds:
        fold_cfg = trial_config(cfg, fold, params)
        run_dir = study_dir / f"trial-{trial.number}" / f"fold-{fold.index}"
        try:
            summary = train(
                fold_cfg, run_dir, extra_callbacks=[ReportValidation(trial, fold.index)], test=False
            )
        finally:  # a trial keeps its figures, not its weights: the refit retrains the best
            shutil.rmtree(RunDir(run_dir).checkpoints, ignore_errors=True)
        losses.append(summary["metrics"]["val_loss"])
        found = summary.get("validation", {})
        if "net" in found:
            times += found["time_ns"]
            nets += found["net"]
    trial.set_user_attr("fold_val_losses", losses)
    trial.set_user_attr("returns", {"time_ns": times, "net": nets})
    value = float(np.mean(losses))
    return value if math.isfinite(value) else float("inf")


def entries(space: Any, prefix: str = "") -> dict[str, Any]:
    """The space's entries by config key: its nodes with a `type`, at their dotted paths."""
    found = {}
    for key, node in space.items():
        if isinstance(node, DictConfig | dict) and "type" in node:
            found[f"{prefix}{key}"] = node
        elif isinstance(node, DictConfig | dict):
            found |= entries(node, f"{prefix}{key}.")
        else:
            raise ConfigError(
                f"tune_space.{prefix}{key} is {node!r}: an entry is a mapping with a type "
                "(categorical, float or int)"
            )
    return found


def suggest(trial: optuna.Trial, space: DictConfig) -> dict[str, Any]:
    """Each config key of the space, suggested by the trial: its config value (a categorical
    mapping's label is what the trial records, its value what the config gets)."""
    params = {}
    for key, spec in entries(space).items():
        kind = spec.get("type")
        if kind == "categorical":
            choices = spec.choices
            if isinstance(choices, DictConfig):  # {label: value}
                label = trial.suggest_categorical(key, [str(c) for c in choices])
                params[key] = OmegaConf.to_container(choices, resolve=True)[label]
            else:
                params[key] = trial.suggest_categorical(key, list(choices))
        elif kind == "float":
            log_scale = bool(spec.get("log", False))
            params[key] = trial.suggest_float(key, spec.low, spec.high, log=log_scale)
        elif kind == "int":
            params[key] = trial.suggest_int(key, spec.low, spec.high, step=spec.get("step", 1))
        else:
            raise ConfigError(
                f"tune_space.{key}.type must be categorical, float or int, got {kind!r}"
            )
    return params


def trial_config(cfg: DictConfig, fold: Fold, params: dict[str, Any]) -> DictConfig:
    """The fold's training config with the trial's parameters; an invalid combination
    (hidden_dim not divisible by num_heads, say) is `_Invalid`."""
    fold_cfg = with_params(cfg, params)
    fold_cfg.data.split.merge_with(fold.split())
    fold_cfg.report = False
    fold_cfg.resume = None
    try:
        validate(fold_cfg)
    except ConfigError as exc:
        raise _Invalid(f"invalid combination: {exc}") from None
    return fold_cfg


def with_params(cfg: DictConfig, params: dict[str, Any]) -> DictConfig:
    out = cfg.copy()
    for key, value in params.items():
        OmegaConf.update(out, key, value, merge=False)
    return out


class ReportValidation(L.Callback):
    """Each validation loss to the trial, fold k's n-th at step k * FOLD_STEPS + n, and the
    trial stopped where the pruner says. (optuna-integration's Lightning callback reports by
    epoch alone: a trial's second fold would report at the first fold's steps again.)"""

    def __init__(self, trial: optuna.Trial, fold: int) -> None:
        self.trial, self.fold, self.seen = trial, fold, 0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or "val_loss" not in trainer.callback_metrics:
            return
        step = self.fold * FOLD_STEPS + self.seen
        self.seen += 1
        self.trial.report(float(trainer.callback_metrics["val_loss"]), step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned in fold {self.fold}, validation {self.seen}")


def progress(
    study: optuna.Study,
    number: int,
    state: TrialState,
    value: float | None,
    budget: int,
    started: float,
    done_here: int,
    jobs: int,
) -> None:
    """One line per finished trial: its value, the best so far, the pruned count, the elapsed
    time and an ETA (this worker's pace times the workers)."""
    n = counts(study)
    try:
        best = f"best {study.best_value:.6g} (trial {study.best_trial.number})"
    except ValueError:
        best = "no trial completed yet"
    elapsed = time.perf_counter() - started
    left = max(budget - n["trials_finished"], 0)
    eta = elapsed / done_here * left / max(jobs, 1)
    what = f"{value:.6g}" if state == TrialState.COMPLETE else state.name.lower()
    print(
        f"tune: trial {number} {what} | {best} | {n['trials_finished']}/{budget} finished, "
        f"{n['trials_pruned']} pruned | {_clock(elapsed)} elapsed, ETA {_clock(eta)}",
        flush=True,
    )


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


# --- after the search ----------------------------------------------------------------------


def summarize(cfg: DictConfig, study: optuna.Study, study_dir: Path) -> dict[str, Any]:
    """The refit of the best trial's configuration on every backtest fold (once on the test
    periods), the selection statistics over the completed trials, tune_summary.json and
    tune_report.md."""
    from foxhunt.app.tune.report import write_report

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        reasons = sorted({t.user_attrs.get("pruned", "") for t in trials} - {""})
        raise FoxhuntError(
            f"no trial of study {study.study_name} completed ({len(trials)} ran"
            + (f"; pruned: {reasons[0]}" if reasons else "")
            + "): widen tune_space or raise tune.trials"
        )
    best = study.best_trial
    params = suggest(optuna.trial.FixedTrial(best.params), cfg.tune_space)
    summary: dict[str, Any] = {
        "study": study.study_name,
        "study_dir": str(study_dir),
        "best_trial": best.number,
        "best_params": params,
        "best_val_loss": best.value,
        "fold_val_losses": best.user_attrs.get("fold_val_losses"),
        **counts(study),
        "pruning_saved_s": pruning_saved(trials),
        "search_wall_s": round(sum(t.user_attrs.get("wall_s", 0) for t in trials), 1),
        "selection": selection.selection_stats(
            {t.number: t.user_attrs.get("returns") or {} for t in complete}, best.number
        ),
    }
    if cfg.tune.refit:
        summary["refit"] = refit(cfg, params, study_dir / f"refit-trial-{best.number}")
    write_json(study_dir / SUMMARY, summary)
    write_text(study_dir / REPORT, write_report(summary, study, study_dir))
    tracking.log_study(cfg, summary, study_dir)  # logger=mlflow: DSR, PBO, the report
    return summary


def pruning_saved(trials: list[optuna.trial.FrozenTrial]) -> float | None:
    """Seconds the pruned trials did not run: each the mean completed trial's time less its
    own (an estimate: a pruned trial would have taken as long as the completed ones)."""
    done = [t.user_attrs["wall_s"] for t in trials if t.state == TrialState.COMPLETE]
    done = [w for w in done if w is not None]
    if not done:
        return None
    mean = float(np.mean(done))
    cut = [t.user_attrs.get("wall_s", 0.0) for t in trials if t.state == TrialState.PRUNED]
    return round(sum(max(mean - w, 0.0) for w in cut), 1)


def refit(cfg: DictConfig, params: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The best configuration trained on every backtest fold and scored once on its test
    period (`foxhunt.app.backtest.folds.run`, which continues a killed refit); the headline."""
    refit_cfg = with_params(cfg, params)
    bt = backtest.run(refit_cfg, out_dir, overrides=[])
    m, baselines = bt["metrics"], bt.get("baselines", {})
    best = m.get("best_baseline")
    return {
        "backtest_dir": str(out_dir),
        "test_loss": m.get("test_loss"),  # the model's own quantiles, pooled over the folds
        "calibrated_test_loss": m.get("calibrated_test_loss"),  # the delivered forecasts
        "skill": m.get("skill"),  # against the strongest baseline, on the delivered ones
        "best_baseline": best,
        "best_baseline_test_loss": baselines.get(best, {}).get("test_loss") if best else None,
        "val_loss": m.get("val_loss"),
        "strategy_sharpe": (bt.get("strategy") or {}).get("sharpe"),
        "folds": [
            {
                "fold": f["fold"],
                "val_loss": f["metrics"].get("val_loss"),
                "calibrated_test_loss": f["metrics"].get("calibrated_test_loss"),
                "best_baseline": f["metrics"].get("best_baseline"),
                "best_baseline_test_loss": f.get("baselines", {})
                .get(f["metrics"].get("best_baseline") or "", {})
                .get("test_loss"),
            }
            for f in bt["folds"]
        ],
    }
