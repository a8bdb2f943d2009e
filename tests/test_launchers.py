"""The sweep plugins (pip install -e ".[sweeps]"): Optuna search, joblib's parallel jobs, and the
SLURM launcher config. Each test is skipped when its plugin is not installed."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf

from foxhunt.config import register_configs
from tests.helpers import CONF, run_cli, tiny_overrides

SEARCHED = {"model.hidden_dim", "model.num_heads", "model.dropout", "optim.lr"}


def compose_with_hydra(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def summary_rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


def overrides(row: dict[str, str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in row["overrides"].split())


def choices(sweep: str) -> list[int]:
    override = OverridesParser.create().parse_override(f"key={sweep}")
    return list(override.sweep_iterator())


def test_optuna_search_space_has_no_invalid_combination():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = compose_with_hydra("hparams_search=optuna_tft")
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper")
    assert sweeper.direction == "minimize" and sweeper.sampler.seed is not None
    assert set(sweeper.params) == SEARCHED
    # an invalid trial would be a wasted one (it returns inf)
    dims = choices(sweeper.params["model.hidden_dim"])
    heads = choices(sweeper.params["model.num_heads"])
    assert all(d % h == 0 for d, h in itertools.product(dims, heads))


@pytest.mark.slow
def test_optuna_search_finds_best_params(tmp_path, table_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep_dir = tmp_path / "search"
    result = run_cli(
        *tiny_overrides(table_path, "trainer.max_epochs=1", "model.variable_dim=4"),
        "hparams_search=optuna_tft",  # multirun without -m: the config sets hydra.mode
        "hydra.sweeper.n_trials=3",
        "model.hidden_dim=choice(8,16)",  # a command-line sweep replaces the config's range
        "model.num_heads=choice(2,4)",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        own_process=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    best = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert set(best.best_params) == SEARCHED
    assert best.best_params["model.hidden_dim"] in (8, 16)
    assert 1e-4 <= best.best_params["optim.lr"] <= 1e-2
    rows = summary_rows(sweep_dir)
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    # what each job returned is what Optuna ranked
    assert best.best_value == pytest.approx(min(float(r["metric"]) for r in rows))
    assert all(not math.isnan(float(r["metric"])) for r in rows)


@pytest.mark.slow
def test_joblib_runs_the_sweep_in_worker_processes(tmp_path, table_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *tiny_overrides(table_path, "trainer.max_epochs=1", "model.variable_dim=4"),
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "model.hidden_dim=8,12,10",  # 10 does not split into 4 heads: fails alone in its worker
        "model.num_heads=4",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        own_process=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr
    rows = {overrides(r)["model.hidden_dim"]: r for r in summary_rows(sweep_dir)}
    assert [rows[d]["status"] for d in ("8", "12", "10")] == ["ok", "ok", "invalid"]
    assert "not divisible by model.num_heads=4" in rows["10"]["error"]


def test_slurm_launcher_config_composes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_with_hydra("hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}")
    launcher = cfg.hydra.launcher
    assert (
        launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    )
    assert launcher.partition is None  # the cluster default unless given on the command line
    assert launcher.gpus_per_node == 1 and launcher.tasks_per_node == 1
    assert launcher.timeout_min > 0 and launcher.signal_delay_s > 0

    cfg = compose_with_hydra(
        "hydra/launcher=slurm", "hydra.launcher.partition=gpu", f"hydra.sweep.dir={tmp_path}"
    )
    launcher = cfg.hydra.launcher
    assert launcher.partition == "gpu"
    assert launcher.submitit_folder == f"{tmp_path}/.submitit/%j"
    assert launcher.name == cfg.hydra.job.name  # "train" from scripts/train.py
    assert type(instantiate(launcher)).__name__ == "SlurmLauncher"  # no job is submitted
