"""Every `foxhunt` command end to end, in the fast tier: each on the one tiny trained run
(`tiny_run`, trained through `foxhunt train`) or its data; export in test_export.py's `plain`.
The commands' own behaviour is tested in their modules' tests (many in the full tier)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from foxhunt.models import cpu_kernels
from tests.helpers import PREDICT_BATCH, TINY_MODEL, printed_summary, run_script, tiny_overrides


def _ok(script: str, *args: str) -> tuple[str, dict]:
    code, out, err = run_script(script, *args)
    assert code == 0, err[-3000:]
    if script == "backtest.py":  # its last line names the summary's file
        return out, printed_summary(out)
    return out, json.loads(out.strip().splitlines()[-1])


def test_train_writes_its_run_and_says_what_it_found(tiny_run):
    s = tiny_run.summary
    assert tiny_run.ckpt.is_file() and (tiny_run.run / "summary.json").is_file()
    assert {"val_loss", "test_loss", "skill"} <= set(s["metrics"])
    assert (tiny_run.run / ".hydra" / "config.yaml").is_file()  # the data config it used
    assert "skill" in tiny_run.out  # the lines for a person before the last line


def test_train_says_which_cpu_kernels_ran_or_why_none(tiny_run):
    """summary.json and the printed summary name the build of the C kernels that ran (the tiny
    model's hidden size of 8 leaves them its dropout), or why none did."""
    kernels, build = tiny_run.summary["cpu_kernels"], cpu_kernels.status().build
    if build is None:
        assert not kernels["ran"] and kernels["why_not"] == cpu_kernels.status().reason
        assert f"CPU kernels did not run: {kernels['why_not']}" in tiny_run.out
        return
    assert kernels["ran"] and kernels["build"] == build and kernels["calls"]["dropout_flat"] > 0
    assert set(kernels["calls"]) == {"dropout_flat"}  # (hidden 8: no gate takes them)
    assert f"CPU kernels: {build} ran" in tiny_run.out


def test_train_ends_with_a_short_line_naming_its_summary(tiny_run):
    # the run directory, the headline and where summary.json is; not summary.json itself
    last = tiny_run.out.strip().splitlines()[-1]
    assert last.startswith(f"run {tiny_run.run}: skill ")
    assert last.endswith(f"; every figure in {tiny_run.run / 'summary.json'}")
    assert len(last) < 150 + 2 * len(str(tiny_run.run))


def test_train_into_a_capture_prints_a_line_per_epoch_not_a_progress_bar(tiny_run):
    # stdout is not a terminal here, and tiny_run leaves the progress bar on
    epochs = [line for line in tiny_run.out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 1, tiny_run.out[-3000:]
    assert re.fullmatch(
        r"epoch 1/1, step 4: train loss [\d.]+, val loss [\d.]+, [\d.]+ s", epochs[0]
    )
    assert "\r" not in tiny_run.out and "it/s" not in tiny_run.out


@pytest.mark.parametrize("where", ["in its run", "moved out of its run"])
def test_predict_reuses_the_checkpoints_data_config_with_no_data_option(tiny_run, tmp_path, where):
    # trained with data=parquet; predict's own default is the ES sample, which must not apply
    ckpt = tiny_run.ckpt
    if where != "in its run":  # no <run>/.hydra beside it: the checkpoint carries the config
        ckpt = Path(shutil.copy(ckpt, tmp_path / "moved.ckpt"))
    out = tmp_path / "p.parquet"
    code, stdout, err = run_script(
        "predict.py", f"ckpt_path={ckpt}", f"predict.out={out}", "predict.all_windows=true",
        f"predict.batch_size={PREDICT_BATCH}", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    table = pq.read_table(out)
    assert set(table.column("instrument").to_pylist()) == {"AAA", "BBB"}
    assert {"q0.1", "q0.5", "q0.9"} <= set(table.column_names)


# export: tests/test_export.py's `plain` fixture runs `foxhunt export` end to end.


def test_interpret_writes_importance_and_attention(tiny_run, tmp_path):
    _, result = _ok(
        "interpret.py", f"ckpt_path={tiny_run.ckpt}", f"out_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert "interpretation.json" in result["files"]
    assert (tmp_path / "interpretation.json").is_file()


def test_inspect_reports_the_panel_and_no_problem(tiny_run):
    data = tiny_overrides(tiny_run.data)[:6]  # the data keys alone
    out, facts = _ok("inspect_data.py", *data, *TINY_MODEL, "+time_batches=false")
    assert facts["problems"] == [] and "problems: none" in out


def test_estimate_memory_prints_a_table_and_its_json(tiny_run):
    out, plan = _ok("estimate_memory.py", *tiny_run.args[:-1])
    assert plan["train_peak_mb"] > 0 and "peak" in out


def test_backtest_runs_its_folds_and_pools_them(tiny_run, tmp_path):
    args = [*tiny_overrides(tiny_run.data, "trainer.max_epochs=1"), *TINY_MODEL]
    _, summary = _ok("backtest.py", *args, "backtest.folds=2", f"hydra.run.dir={tmp_path}")
    assert [f["fold"] for f in summary["folds"]] == [0, 1]
    assert (tmp_path / "oos_predictions.parquet").is_file()


def test_tune_runs_a_study_and_reports_its_best_trial(tiny_run, tmp_path):
    args = [*tiny_overrides(tiny_run.data, "trainer.max_epochs=1"), *TINY_MODEL]
    study = [
        "tune.trials=2", "tune.folds=1", "tune.refit=false", "tune.pruner=none",
        "tune.startup_trials=1", f"tune.dir={tmp_path / 'tune'}", "backtest.folds=1",
        "tune_space.model.hidden_dim.choices=[8]", "tune_space.model.num_heads.choices=[2]",
    ]  # fmt: skip
    _, summary = _ok("tune.py", *args, *study, f"hydra.run.dir={tmp_path / 'run'}")
    assert summary["trials_completed"] == 2 and "best_trial" in summary


def test_a_users_config_directory_adds_groups_and_experiments(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("hidden_dim: 24\nnum_heads: 3\n")
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "big.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: tft_base\nmodel:\n  dropout: 0.3\n"
    )
    code, out, err = run_script(
        "train.py", "--cfg", "job", "--config-dir", str(tmp_path), "model=mine"
    )
    assert code == 0, err
    assert "hidden_dim: 24" in out and "num_heads: 3" in out
    search = f"hydra.searchpath=[file://{tmp_path}]"
    code, out, err = run_script("train.py", "--cfg", "job", search, "experiment=big")
    assert code == 0, err
    assert "hidden_dim: 256" in out and "dropout: 0.3" in out and "num_features: 225" in out
