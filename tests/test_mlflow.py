"""logger=mlflow (foxhunt.app.train.tracking) against a real `mlflow server` on localhost, backed by
the PostgreSQL CI starts (FOXHUNT_TEST_POSTGRES; the server's database is <that db>_mlflow), read
back through `mlflow.MlflowClient`: the server .ci/run starts (FOXHUNT_TEST_MLFLOW, its URL), or
else each pytest worker's own on a free port."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from filelock import FileLock

from foxhunt.app.train import tracking
from foxhunt.files import read_export
from tests.helpers import (
    TINY_MODEL,
    free_port,
    make_table,
    printed_summary,
    run_script,
    tiny_overrides,
)
from tests.helpers import write_table as write_parquet
from tests.test_tune import TINY as TINY_STUDY
from tests.test_tune import write_panel

STARTUP_S = 120  # a fresh database's migrations, on a busy 2-core machine


def mlflow_database() -> str:
    """The server's database beside the test one: CI creates it (createdb -O foxhunt ...)."""
    url = os.environ.get("FOXHUNT_TEST_POSTGRES")
    if not url:
        pytest.skip("FOXHUNT_TEST_POSTGRES is not set (.ci/run starts a PostgreSQL server)")
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path}_mlflow"))


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This worker's `mlflow server` (one worker process, artifacts under a tmp dir); started
    under a lock across workers, so that one at a time migrates the shared database."""
    pytest.importorskip("mlflow")
    if uri := os.environ.get("FOXHUNT_TEST_MLFLOW"):  # the server .ci/run started
        deadline = time.monotonic() + STARTUP_S
        while (why := tracking.unreachable(uri, 1.0)) is not None:
            assert time.monotonic() < deadline, f"FOXHUNT_TEST_MLFLOW={uri}: {why}"
            time.sleep(0.5)
        yield uri
        return
    database = mlflow_database()
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", database]
    cmd += ["--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", "1"]
    log = (root / "server.log").open("wb")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    try:
        with FileLock(tmp_path_factory.getbasetemp().parent / "mlflow-migrations.lock"):
            deadline = time.monotonic() + STARTUP_S
            while tracking.unreachable(uri, 1.0) is not None:
                if server.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "server.log").read_text(errors="replace")[-3000:]
                    pytest.fail(
                        f"mlflow server did not start on {database} (does the database exist? "
                        f'su postgres -c "createdb -O foxhunt {urlsplit(database).path[1:]}"):'
                        f"\n{tail}"
                    )
                time.sleep(0.5)
        yield uri
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def train_logged(tmp_path: Path, uri: str, *extra: str) -> tuple[int, str, str]:
    """A tiny `foxhunt train` with logger=mlflow into tmp_path/run."""
    data = write_parquet(tmp_path / "bars.parquet", make_table({"AAA": 300, "BBB": 200}))
    args = [*tiny_overrides(data), *TINY_MODEL, f"hydra.run.dir={tmp_path / 'run'}"]
    args += ["logger=mlflow", f"logger.tracking_uri={uri}", *extra]
    return run_script("train.py", *args)


def only_run(mlflow, experiment: str):
    found = mlflow.get_experiment_by_name(experiment)
    runs = mlflow.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


@pytest.mark.slow  # a server and a training run with its ONNX export: about 20 s
def test_a_run_logs_its_epochs_config_figures_files_and_model(tmp_path, mlflow_server):
    name = f"t-{uuid.uuid4().hex[:8]}"
    code, out, err = train_logged(
        tmp_path, mlflow_server, f"logger.experiment_name={name}",
        f"logger.registered_model={name}", "report=true",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    summary = printed_summary(out)
    mlflow = client(mlflow_server)
    run = only_run(mlflow, name)
    assert run.info.status == "FINISHED"
    # every epoch's validation loss, as the CSV logger wrote it into the run directory
    history = mlflow.get_metric_history(run.info.run_id, "val_loss")
    assert len(history) == summary["epochs"] == 2
    local = (tmp_path / "run" / "csv" / "metrics.csv").read_text()
    assert f"{history[-1].value:.6g}"[:6] in local
    # the config, by its override names, and summary.json's figures by their paths
    assert run.data.params["model.hidden_dim"] == "8"
    assert run.data.params["data.target"] == "y"
    assert not any(k.startswith("logger.") for k in run.data.params)
    metrics = run.data.metrics
    assert metrics["metrics.test_loss"] == pytest.approx(summary["metrics"]["test_loss"])
    assert metrics["metrics.skill"] == pytest.approx(summary["metrics"]["skill"])
    # the run's files: summary, report, plots, forecasts, exports; not the checkpoints
    files = artifact_paths(mlflow, run.info.run_id)
    for logged in ("summary.json", "report.md", "equity.png", "test_forecasts.parquet"):
        assert logged in files
    assert "checkpoints/model_fp32.safetensors" in files and "hydra/config.yaml" in files
    assert not [f for f in files if f.endswith(".ckpt") or ".foxhunt" in f]
    # the model: a version of the registered model, files only (ONNX, its schema, calibration)
    (version,) = mlflow.search_model_versions(f"name='{name}'")
    assert version.run_id == run.info.run_id
    model = {f for f in files if f.startswith("model/")}
    expected = {"model.onnx", "model.json", "schema.json", "calibration.json"}
    assert model == {f"model/{f}" for f in expected | {"model_fp32.safetensors"}}
    got = Path(mlflow.download_artifacts(run.info.run_id, "model", str(tmp_path / "dl")))
    _, exported = read_export(summary["export"])  # what `foxhunt.load` reads from the export
    assert json.loads((got / "calibration.json").read_text()) == exported["calibration"]
    assert json.loads((got / "schema.json").read_text()) == exported["schema"]
    assert json.loads((got / "model.json").read_text())["calibration"] == exported["calibration"]


def artifact_paths(mlflow, run_id: str, folder: str | None = None) -> set[str]:
    found = set()
    for item in mlflow.list_artifacts(run_id, folder):
        found |= artifact_paths(mlflow, run_id, item.path) if item.is_dir else {item.path}
    return found


@pytest.mark.slow  # a server and a three-trial study
def test_a_study_nests_its_trials_under_its_run_with_dsr_and_pbo(tmp_path, mlflow_server):
    name = f"s-{uuid.uuid4().hex[:8]}"
    data = write_panel(tmp_path / "bars.parquet", signal_weight=0.0)
    args = [*TINY_STUDY, f"data.path={data}", "tune.trials=3", f"tune.dir={tmp_path / 'tune'}"]
    args += ["tune_space.model.num_heads.choices=[1,2]", "logger=mlflow"]
    args += [f"logger.tracking_uri={mlflow_server}", f"logger.experiment_name={name}"]
    code, out, err = run_script("tune.py", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    mlflow = client(mlflow_server)
    experiment = mlflow.get_experiment_by_name(name).experiment_id
    runs = {r.info.run_id: r for r in mlflow.search_runs([experiment])}
    parents = [r for r in runs.values() if tracking.PARENT_TAG not in r.data.tags]
    assert [p.info.run_name for p in parents] == [summary["study"]]
    parent = parents[0]
    trials = [
        r for r in runs.values() if r.data.tags.get(tracking.PARENT_TAG) == parent.info.run_id
    ]
    assert sorted(r.info.run_name for r in trials) == ["trial-0", "trial-1", "trial-2"]
    for trial in trials:  # its parameters and value; its fold's training run nested under it
        assert trial.data.params["model.num_heads"] in ("1", "2")
        folds = [
            r for r in runs.values() if r.data.tags.get(tracking.PARENT_TAG) == trial.info.run_id
        ]
        assert len(folds) == 2 and all("val_loss" in f.data.metrics for f in folds)
    best = runs[
        next(t.info.run_id for t in trials if t.info.run_name == f"trial-{summary['best_trial']}")
    ]
    assert best.data.metrics["value"] == pytest.approx(summary["best_val_loss"])
    selection = summary["selection"]
    assert parent.data.metrics["dsr"] == pytest.approx(selection["dsr"]["dsr"])
    assert parent.data.metrics["pbo"] == pytest.approx(selection["pbo"]["pbo"])
    assert {"tune_summary.json", "tune_report.md"} <= artifact_paths(mlflow, parent.info.run_id)


@pytest.mark.slow  # a tiny training run: about 5 s
def test_a_server_that_is_down_is_one_warning_and_the_run_goes_on(tmp_path, caplog):
    pytest.importorskip("mlflow")
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="foxhunt"):
        code, out, err = train_logged(tmp_path, dead)
    assert code == 0, err[-3000:]
    warned = [r.getMessage() for r in caplog.records if "mlflow" in r.getMessage()]
    assert len(warned) == 1 and dead in warned[0], warned
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file()
    assert printed_summary(out)["metrics"]["test_loss"] > 0
    assert time.perf_counter() - started < 60  # no minutes of MLflow's retries


def test_an_unreachable_server_is_found_in_one_try(caplog):
    pytest.importorskip("mlflow")
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="foxhunt"):
        loggers = tracking.mlflow_loggers("unused-dir", "", tracking_uri=dead, timeout_s=2)
    assert time.perf_counter() - started < 5  # MLflow's own client would retry for minutes
    assert [type(lg).__name__ for lg in loggers] == ["CSVLogger"]
    assert len([r for r in caplog.records if "does not answer" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    "uri",
    [
        "htp:/nowhere",  # the others in the full tier (#70): each composes and fails alike
        *(
            pytest.param(u, marks=pytest.mark.slow)
            for u in ("postgresql://foxhunt@127.0.0.1/foxhunt", "http://", "http://host:port")
        ),
    ],
)
def test_a_malformed_tracking_uri_is_one_error_line(tmp_path, uri):
    code, _, err = run_script(
        "train.py", "logger=mlflow", f"logger.tracking_uri={uri}", f"hydra.run.dir={tmp_path}"
    )
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and err.startswith(
        "error: logger.tracking_uri="
    )


def test_no_tracking_uri_is_one_error_line_that_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, _, err = run_script("train.py", "logger=mlflow", f"hydra.run.dir={tmp_path}")
    assert code == 2 and "MLFLOW_TRACKING_URI" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_logger_option_is_one_error_line(tmp_path):
    code, _, err = run_script(
        "train.py", "logger=mlflow", "logger.tracking_uri=http://127.0.0.1:1",
        "+logger.no_such_option=1", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert code == 2 and "no_such_option" in err and len(err.strip().splitlines()) == 1


def test_summary_figures_are_its_finite_numbers_by_path():
    summary = {"metrics": {"test_loss": 0.5, "by_instrument": {"ES=F": {"skill": -0.1}}}}
    summary |= {"epochs": 3, "ok": True, "nan": float("nan"), "lists": [1, 2], "run_dir": "/x"}
    assert tracking.figures(summary) == {
        "metrics.test_loss": 0.5,
        "metrics.by_instrument.ES_F.skill": -0.1,
        "epochs": 3.0,
    }
