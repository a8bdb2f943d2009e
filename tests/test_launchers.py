"""The sweep plugins (pip install -e ".[sweeps]"): joblib's parallel jobs and the SLURM launcher
config (an Optuna study: tests/test_tune.py). Each test is skipped when its plugin is not
installed."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from foxhunt.config import register_configs
from tests.helpers import CONF, run_cli, tiny_overrides


def compose_with_hydra(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def summary_rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


def overrides(row: dict[str, str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in row["overrides"].split())


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
