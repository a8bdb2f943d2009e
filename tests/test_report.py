"""Interpretation and the run report: weights, calibration, files, the CLI, no matplotlib."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from foxhunt.app.interpret import PLOTS, variable_names
from foxhunt.app.report import LEARNING_CURVES, learning_curves, report_run
from foxhunt.app.train import train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.training.module import TFTModule
from tests.helpers import ROOT, compose_train, make_table, tiny_overrides, write_table


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One tiny model trained for an epoch, reloaded from its best checkpoint alone."""
    tmp = tmp_path_factory.mktemp("report")
    table = write_table(tmp / "bars.parquet", make_table({"AAA": 300, "BBB": 200}))
    cfg = compose_train(*tiny_overrides(table, "trainer.max_epochs=1", "report=true"))
    run_dir = tmp / "run"
    summary = train(cfg, run_dir)
    assert (run_dir / "report.md").stat().st_size > 0  # training wrote it
    module = TFTModule.load_from_checkpoint(summary["best_checkpoint"], map_location="cpu")
    datamodule = ParquetDataModule(cfg.data, schema=module.schema)
    datamodule.setup()
    return {"cfg": cfg, "run_dir": run_dir, "summary": summary, "module": module, "dm": datamodule}


def test_every_run_writes_the_report_by_default():
    assert compose_train().report is True


def test_selection_and_attention_weights_sum_to_one_per_window(trained):
    model = trained["module"].model.eval()
    batch = next(iter(trained["dm"].test_dataloader(sharded=False)))
    with torch.no_grad():
        out = model.interpret(batch)
    for key in ("static_variable_weights", "encoder_variable_weights", "decoder_variable_weights"):
        sums = out[key].sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums))
    rows = out["attention"].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_report_run_writes_interpretation_report_and_plots(trained):
    run_dir = trained["run_dir"]
    files = report_run(
        trained["cfg"], run_dir, trained["summary"], trained["module"], trained["dm"]
    )
    result = json.loads((run_dir / "interpretation.json").read_text())
    names = variable_names(trained["module"].schema)
    assert names["static"] == ["instrument"]
    assert names["encoder"] == ["y (target)", "f1", "f2", "k1", "relative time"]
    assert names["decoder"] == ["k1", "relative time"]
    for net, expected in names.items():
        found = result["variable_importance"][net]
        assert found["names"] == expected
        assert sum(found["weights"]) == pytest.approx(1.0, abs=1e-5)  # means of rows summing to 1
    assert sum(result["attention"]["by_lag"]) + sum(
        result["attention"]["decoder_share_by_horizon"]
    ) / len(result["attention"]["decoder_share_by_horizon"]) == pytest.approx(1.0, abs=1e-5)

    coverage = result["calibration"]["observed_coverage"]
    assert len(coverage) == len(result["calibration"]["quantiles"])
    assert all(0.0 <= c <= 1.0 for c in coverage)
    assert all(a <= b for a, b in zip(coverage, coverage[1:], strict=False))

    report = (run_dir / "report.md").read_text()
    assert files["report"] == run_dir / "report.md"
    for heading in ("## Data", "## Batch sizes and memory", "## Test metrics", "## Calibration"):
        assert heading in report
    # the conformal calibration: the model's own intervals, then each method's, and the plot
    conformal = report.split("## Conformal calibration")[1]
    for method in ("model", "cqr", "aci"):
        assert f"| {method} | 0.1-0.9 | 0.8 |" in conformal
    assert (run_dir / "calibration.png").stat().st_size > 5_000
    assert "AAA" in report and "2026-01-05" in report  # instruments and split dates
    for png in [*PLOTS.values(), LEARNING_CURVES]:
        assert f"]({png})" in report
        assert (run_dir / png).stat().st_size > 5_000, png


def test_without_matplotlib_report_but_no_plots(trained, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    run_dir = tmp_path / "run"
    (run_dir / "csv").mkdir(parents=True)
    shutil.copy(trained["run_dir"] / "csv" / "metrics.csv", run_dir / "csv")
    with caplog.at_level(logging.WARNING):
        files = report_run(
            trained["cfg"], run_dir, trained["summary"], trained["module"], trained["dm"]
        )
    assert files["report"].stat().st_size > 0
    assert not list(run_dir.glob("*.png"))
    assert [r.message for r in caplog.records if "matplotlib" in r.message] == [
        "matplotlib is not installed: no plots (pip install matplotlib)"
    ]


def run_interpret(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "interpret.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # 9 s: the fast tier stays under 120 s
def test_cli_interprets_a_checkpoint_and_rejects_a_missing_one(trained, tmp_path):
    # no data overrides: the data config comes from the checkpoint's run (.hydra/config.yaml)
    run_dir = trained["run_dir"]
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(trained["cfg"], run_dir / ".hydra" / "config.yaml")
    out = tmp_path / "out"
    ok = run_interpret(
        f'ckpt_path="{trained["summary"]["best_checkpoint"]}"', f"out_dir={out}", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    printed = json.loads(ok.stdout.strip().splitlines()[-1])
    assert printed["files"] == ["interpretation.json", *PLOTS.values()]
    assert all((out / f).stat().st_size > 0 for f in printed["files"])

    missing = tmp_path / "missing.ckpt"
    bad = run_interpret(f"ckpt_path={missing}", f"out_dir={out}", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: checkpoint not found: {missing}"]


def test_learning_curves_join_a_resumed_runs_csv_logs(tmp_path):
    def write(path: Path, rows: list[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("epoch,step,train_loss_epoch,val_loss\n" + "\n".join(rows) + "\n")

    write(tmp_path / "csv" / "metrics.csv", ["0,9,,0.5", "0,9,0.6,", "1,19,,0.45"])
    # resumed in place during epoch 1: that epoch is logged again, the later file wins
    write(tmp_path / "csv" / "resume-1" / "metrics.csv", ["1,19,,0.4", "1,19,0.5,", "2,29,,0.3"])
    assert learning_curves(tmp_path) == {
        0: {"train_loss_epoch": 0.6, "val_loss": 0.5},
        1: {"train_loss_epoch": 0.5, "val_loss": 0.4},
        2: {"val_loss": 0.3},
    }
