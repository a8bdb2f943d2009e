"""scripts/tune.py (`foxhunt.app.tune.search`): a study finds a planted parameter, sees through
selection on noise, never reads a test period, continues after a SIGKILL, and shares one study
between workers on a journal file and on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import matplotlib
import numpy as np
import optuna
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict
from optuna.trial import TrialState

from foxhunt.app.backtest.folds import plan_folds
from foxhunt.app.train.phases import train
from foxhunt.app.tune import search as tune
from foxhunt.app.tune.study import JOURNAL, ended, repair_journal
from foxhunt.config import register_configs
from foxhunt.data.read import timeline
from foxhunt.errors import DataError, FoxhuntError
from tests.helpers import CONF, run_cli, start_until

DAY = 86_400 * 10**9
T0 = np.datetime64("2020-01-01", "ns").astype(np.int64)
# a study of the tiniest TFT, each training 2 epochs of a 2-instrument daily panel (~1 s)
TINY = (
    "data=parquet",
    "data.target=y",
    "data.target_kind=return",
    "data.group_column=symbol",
    "data.features=[f1]",
    "data.known_features=[junk]",
    "data.encoder_length=16",
    "data.prediction_length=2",
    "data.batch_size=32",
    "model.hidden_dim=8",
    "model.num_heads=2",
    "model.variable_dim=4",
    "model.instrument_embedding=true",  # the recipe these studies' pinned outcomes hold for
    "optim.schedule_steps=40",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.accelerator=cpu",
    "report=false",
    "backtest.folds=1",
    "tune.folds=2",
    "tune.refit=false",
    "tune.pruner=none",
    "tune_space.model.hidden_dim.choices=[8]",
    "tune_space.model.num_heads.choices=[2]",
)


def write_panel(path: Path, signal_weight: float, seed: int = 0, n: int = 600) -> Path:
    """Two instruments' daily returns y; `sig`, a known input at the target's own time, carries
    `signal_weight` of it (0: pure noise), `junk` and f1 nothing."""
    rng = np.random.default_rng(seed)
    parts = []
    for symbol in ("A", "B"):
        sig = rng.normal(size=n)
        parts.append(
            {
                "timestamp": T0 + DAY * np.arange(n),
                "symbol": np.full(n, symbol),
                "f1": rng.normal(size=n),
                "sig": sig,
                "junk": rng.normal(size=n),
                "y": 0.01 * (signal_weight * sig + rng.normal(size=n)),
            }
        )
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    table = {k: pa.array(v) for k, v in cols.items()}
    table["timestamp"] = pa.array(cols["timestamp"], pa.timestamp("ns", tz="UTC"))
    pq.write_table(pa.table(table), path)
    return path


def overrides(data: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [*TINY, f"data.path={data}", f"tune.dir={tmp_path / 'tune'}", *extra]


def compose_tune(args: list[str], space: dict | None = None):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("tune", overrides=args)
    if space is not None:
        with open_dict(cfg):
            cfg.tune_space = OmegaConf.create(space)
    return cfg


def journal(path: Path) -> optuna.storages.JournalStorage:
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))


def trials_of(summary: dict) -> list[optuna.trial.FrozenTrial]:
    storage = journal(Path(summary["study_dir"]) / JOURNAL)
    return optuna.load_study(study_name=summary["study"], storage=storage).get_trials()


@pytest.mark.slow  # a whole study: trials trained end to end
def test_the_study_finds_the_planted_feature_set(tmp_path):
    data = write_panel(tmp_path / "planted.parquet", signal_weight=3.0)
    space = {
        "data": {
            "known_features": {
                "type": "categorical",
                "choices": {"signal": ["sig"], "noise": ["junk"]},
            }
        }
    }
    cfg = compose_tune(overrides(data, tmp_path, "tune.trials=4", "tune.startup_trials=2"), space)
    style = matplotlib.rcParams["axes.facecolor"]
    summary = tune.tune(cfg, [])
    assert matplotlib.rcParams["axes.facecolor"] == style  # Optuna's plots set ggplot's
    report = (Path(summary["study_dir"]) / tune.REPORT).read_text()
    assert "![Optimization history](optimization_history.png)" in report
    tried = {t.params["data.known_features"] for t in trials_of(summary)}
    assert tried == {"signal", "noise"}, tried  # both were tried within the budget
    assert summary["best_params"] == {"data.known_features": ["sig"]}
    assert summary["trials_completed"] == 4
    sel = summary["selection"]
    assert sel["dsr"]["significant"], sel  # a real edge survives the deflation


@pytest.mark.slow  # a whole study: trials trained end to end
def test_selection_on_noise_is_called_what_it_is(tmp_path):
    """20 trials on pure noise: the best looks good, DSR sees through it, PBO is above 0.5.
    PBO on noise is 0.5 in expectation and varies from panel to panel (measured on five noise
    panels like this one: 0.09 to 0.94; DSR 0.03 to 0.48, never significant), so the panel is
    pinned (seed 1: PBO 0.80 with 2 threads, 0.89 with 1) and its thread count fixed
    (trainer.deterministic=true)."""
    data = write_panel(tmp_path / "noise.parquet", signal_weight=0.0, seed=1)
    fixed = "trainer.deterministic=true"
    args = overrides(data, tmp_path, "tune.trials=20", "tune.folds=1", fixed)
    summary = tune.tune(compose_tune(args), [])
    sel = summary["selection"]
    assert sel["trials"] == 20
    assert sel["naive_best_sharpe"] > 1.0, sel  # annualized: the best of 20 looks good
    assert not sel["dsr"]["significant"], sel
    assert sel["pbo"]["pbo"] > 0.5, sel


@pytest.mark.slow  # a whole study: trials trained end to end
def test_the_study_never_reads_a_test_period(tmp_path):
    path = write_panel(tmp_path / "panel.parquet", signal_weight=1.0)
    args = overrides(path, tmp_path, "tune.trials=2")
    cfg = compose_tune(args)
    test_start = plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)[0].test_start
    table = pq.read_table(path)
    later = pa.compute.greater_equal(
        table["timestamp"], pa.scalar(test_start, table["timestamp"].type)
    )
    y = np.where(later.to_numpy(zero_copy_only=False), np.nan, table["y"].to_numpy())
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", pa.array(y)), path)
    with pytest.raises(
        DataError, match="NaN/inf values in instrument A"
    ):  # a plain run reads the test targets
        train(compose_tune(args), tmp_path / "plain")
    summary = tune.tune(cfg, [])
    assert summary["trials_completed"] == 2
    fold = json.loads(next((tmp_path / "tune").glob("*/trial-0/fold-1/summary.json")).read_text())
    assert fold["splits"]["cuts"]["test_end"] == fold["splits"]["cuts"]["test_start"]


@pytest.mark.parametrize(
    ("runs", "gone"),
    [
        ("", False),  # accounting has not heard of the job yet
        ("PENDING\n", False),  # queued, or started before accounting recorded it (CI, #68)
        ("RUNNING\n", False),
        ("COMPLETING\n", False),
        ("CANCELLED by 0\n", True),
        ("TIMEOUT\n", True),
        ("OUT_OF_MEMORY\n", True),
        ("COMPLETED\n", True),
        ("REQUEUED\n", True),  # its run killed, the next not yet recorded
        ("REQUEUED\nPENDING\n", True),  # its run killed, waiting to run again
        ("REQUEUED\nRUNNING\n", False),  # a new run (an old trial: its heartbeat tells)
    ],
)
def test_a_trials_slurm_job_counts_as_ended_only_in_a_state_it_cannot_leave(runs, gone):
    """`sacct -D`'s states of the job that ran a running trial: only an ended run (or a
    requeued job waiting) lets another worker fail the trial and queue it again."""
    assert ended(runs) is gone


@pytest.mark.slow  # a whole study: trials trained end to end
def test_a_killed_study_continues_with_the_same_command(tmp_path):
    data = write_panel(tmp_path / "panel.parquet", signal_weight=1.0)
    args = overrides(data, tmp_path, "tune.trials=3", "tune.folds=1", "optim.schedule_steps=100")
    during_trial_1 = "tune/*/trial-1/fold-0/checkpoints/last.ckpt"
    proc, _ = start_until("tune.py", args, tmp_path, during_trial_1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    done = run_cli(*args, cwd=tmp_path, script="tune.py")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    trials = trials_of(summary)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 3 and summary["trials_finished"] == 3
    killed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.number for t in killed] == [1], [(t.number, t.state) for t in trials]
    retry = [t for t in complete if t.user_attrs.get("retry_of") == 1]
    assert len(retry) == 1 and retry[0].params == killed[0].params


def postgres_url() -> str:
    url = os.environ.get("FOXHUNT_TEST_POSTGRES")
    if not url:
        pytest.skip("FOXHUNT_TEST_POSTGRES is not set (.ci/run starts a PostgreSQL server)")
    return url


@pytest.mark.slow  # a whole study: trials trained end to end
@pytest.mark.parametrize("store", ["journal", "postgresql"])
def test_two_workers_share_one_study(tmp_path, store):
    data = write_panel(tmp_path / "panel.parquet", signal_weight=1.0)
    extra = ["tune.jobs=2", "tune.trials=4", "tune.folds=1"]
    extra.append(f"tune.study=shared-{uuid.uuid4().hex[:8]}")
    if store == "postgresql":
        extra.append(f"tune.storage={postgres_url()}")
    cfg = compose_tune(overrides(data, tmp_path, *extra))
    tune.tune(cfg, [])
    storage = cfg.tune.storage or journal(tmp_path / "tune" / cfg.tune.study / JOURNAL)
    study = optuna.load_study(study_name=cfg.tune.study, storage=storage)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert len({t.user_attrs["pid"] for t in trials}) == 2  # both workers ran trials
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4  # none twice


@pytest.mark.slow  # a whole study: trials trained end to end
def test_multirun_jobs_are_workers_and_the_plain_command_refits(tmp_path):
    data = write_panel(tmp_path / "panel.parquet", signal_weight=1.0)
    args = overrides(data, tmp_path, "tune.trials=3", "tune.folds=1")
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    jobs = run_cli("-m", "tune.worker=0,1", *args, sweep, cwd=tmp_path, script="tune.py")
    assert jobs.returncode == 0, jobs.stderr[-2000:]
    searched = [json.loads(line) for line in jobs.stdout.splitlines() if line.startswith("{")]
    assert len(searched) == 2 and len({s["study"] for s in searched}) == 1  # one study
    assert all(s["trials_finished"] == 3 and "best_trial" not in s for s in searched)
    done = run_cli(*args, cwd=tmp_path, script="tune.py")  # no new trial: the summary
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["study"] == searched[0]["study"] and summary["trials_completed"] == 3
    assert "tune: trial" not in done.stdout
    assert (Path(summary["study_dir"]) / tune.REPORT).is_file()
    other = [*args, f"tune.study={summary['study']}", "tune_space.model.dropout.high=0.5"]
    refused = run_cli(*other, cwd=tmp_path, script="tune.py")
    assert refused.returncode == 2 and "begun with another tune_space" in refused.stderr


def test_a_journal_cut_off_mid_line_loses_nothing_after_it(tmp_path):
    path = tmp_path / JOURNAL

    def study() -> optuna.Study:
        return optuna.create_study(study_name="s", storage=journal(path), load_if_exists=True)

    study().add_trial(optuna.trial.create_trial(value=1.0))
    with open(path, "ab") as f:  # a worker killed while appending
        f.write(b'{"op_code": 4, "worker_id": "cut')
    repair_journal(path)
    study().add_trial(optuna.trial.create_trial(value=2.0))
    assert [t.value for t in study().trials] == [1.0, 2.0]


@pytest.mark.slow  # 4 CPU-s: the full tier
def test_a_trial_that_cannot_fit_is_pruned_with_the_reason(tmp_path):
    data = write_panel(tmp_path / "panel.parquet", signal_weight=1.0)
    budget = ("memory.budget_mb=0.01", "memory.safety_margin_mb=0")  # not even the model fits
    cfg = compose_tune(overrides(data, tmp_path, "tune.trials=2", *budget))
    with pytest.raises(FoxhuntError, match="no trial of study .* completed .* out of memory"):
        tune.tune(cfg, [])
    path = next((tmp_path / "tune").glob(f"*/{JOURNAL}"))
    trials = optuna.load_study(study_name=None, storage=journal(path)).get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    assert all("out of memory" in t.user_attrs["pruned"] for t in trials)
