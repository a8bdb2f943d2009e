"""MLflow tracking (`logger=mlflow`, docs/tracking.md): a run's epochs, config, figures, files
and model on the tracking server a team already runs; a tuning study as a parent run with its
trials nested under it.

The rules:

- **Local first.** A run writes its run directory as always (the CSV logger, `<run>/csv/`)
  and logs to the server beside it. A server that cannot be reached when the run starts is one
  warning line and the run goes on with its CSV logger alone; one that fails later is one
  warning line too, and the server gets nothing more from that run.
- **A tracking server only**: `logger.tracking_uri` (default: MLFLOW_TRACKING_URI) is an
  http(s) URL of `mlflow server`. The server owns the database (PostgreSQL) and the artifact
  store; a database URL here would give each training process the database itself.
- **Nothing registered runs code.** The registered model is files: the safetensors export,
  `schema.json` and `calibration.json` (from the export's own header), and `model.onnx` with
  `model.json` (`foxhunt.app.predict.export`) where the export extra is installed; no pickled
  pyfunc.
- **No process-wide MLflow state.** Each call takes its client: Lightning's MLFlowLogger would
  set mlflow's global tracking URI (and the MLFLOW_TRACKING_URI environment variable).
- **Nesting.** The study's run id is kept in the Optuna study (`mlflow_run_id`), so every
  worker logs under one parent; a trial's run is nested under it, and each of the trial's
  folds under the trial (`logger.parent_run_id`, set here, never by hand).

mlflow is imported only on this path: the rest of foxhunt runs without it.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import optuna
from lightning.fabric.utilities.logger import _flatten_dict
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.files import read_export, write_json

log = logging.getLogger(__name__)
TARGET = "foxhunt.app.train.tracking.mlflow_loggers"  # conf/logger/mlflow.yaml's _target_
PARENT_TAG = "mlflow.parentRunId"  # what MLflow's UI nests runs by
STUDY_ATTR = "mlflow_run_id"  # the study's parent run, in the Optuna study's user attributes
CSV = {"_target_": "lightning.pytorch.loggers.CSVLogger", "name": "csv"}  # conf/logger/csv.yaml


def enabled(cfg: DictConfig) -> bool:
    """Whether the run's logger group is this one (logger=mlflow)."""
    return cfg.get("logger", {}).get("_target_") == TARGET


def server_uri(tracking_uri: str | None) -> str:
    """The tracking server's URL, checked; a missing or malformed one is a ConfigError."""
    if not tracking_uri:
        raise ConfigError(
            "logger=mlflow needs a tracking server: logger.tracking_uri=http://host:5000 "
            "(or MLFLOW_TRACKING_URI)"
        )
    parts = urlsplit(str(tracking_uri))
    try:
        well_formed = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        well_formed = False
    if not well_formed:
        raise ConfigError(
            f"logger.tracking_uri={_shown(str(tracking_uri))} is not the http(s) URL of an "
            "MLflow tracking server (such as http://127.0.0.1:5000)"
        )
    return str(tracking_uri).rstrip("/")


def _shown(uri: str) -> str:
    """A URL as a message names it: without a password."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return uri.replace(f":{parts.password}@", ":***@", 1)


def unreachable(uri: str, timeout_s: float) -> str | None:
    """Why the server does not answer one API request within `timeout_s`, or None. One try:
    MLflow's own client retries a dead server for minutes (MLFLOW_HTTP_REQUEST_MAX_RETRIES)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        response = http_request(
            get_default_host_creds(uri),
            "/api/2.0/mlflow/experiments/search",
            "GET",
            max_retries=0,
            timeout=timeout_s,
            raise_on_status=False,
            params={"max_results": 1},
        )
    except Exception as exc:  # noqa: BLE001 - refused, DNS, TLS, timeout: all one reason
        return _first_line(exc)
    return None if response.status_code == 200 else f"HTTP {response.status_code}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


class ServerLogger(MLFlowLogger):
    """Lightning's MLFlowLogger on a run made by `start_run` (its parent and tags), its own
    client and no process-wide tracking URI; a failure is one warning, then nothing more."""

    def __init__(self, client: Any, run: Any) -> None:
        super().__init__(tracking_uri=client.tracking_uri, run_id=run.info.run_id)
        self._mlflow_client, self._experiment_id = client, run.info.experiment_id
        self._initialized = True
        self.failed: str | None = None

    @property
    def experiment(self) -> Any:
        return self._mlflow_client  # Lightning's sets mlflow.set_tracking_uri (process-wide)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """Lightning's hparams (the module's, with its data schema) are not logged: the run's
        config is (`log_config`), and the schema goes with the registered model."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.guarded(super().log_metrics, metrics, step)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        self.guarded(super().finalize, status)

    def guarded(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, unless an earlier call failed; a failure is one warning."""
        if self.failed is not None:
            return None
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - the server's, the network's: the run goes on
            self.failed = _first_line(exc)
            log.warning(
                "mlflow: %s; the run goes on, logging to its run directory alone", self.failed
            )
            return None


def mlflow_loggers(
    save_dir: str,
    version: str | int | None = None,
    *,
    tracking_uri: str | None = None,
    experiment_name: str = "foxhunt",
    run_name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
    timeout_s: float = 10.0,
    name: str = "csv",
    registered_model: str | None = None,
    onnx: bool = True,
) -> list[Logger]:
    """The CSV logger into the run directory and, if the server answers, a `ServerLogger` on
    a new run (`registered_model`, `onnx`: read by `publish`)."""
    del registered_model, onnx
    local = CSVLogger(save_dir, name=name, version=version)
    uri = server_uri(tracking_uri)
    if find_spec("mlflow") is None:
        raise ConfigError('logger=mlflow needs mlflow: pip install -e ".[mlflow]"')
    if rank_zero_only.rank != 0:  # under DDP, one process logs to the server
        return [local]
    why = unreachable(uri, timeout_s)
    if why is not None:
        log.warning(
            "mlflow: the tracking server %s does not answer (%s); this run logs to its run "
            "directory alone",
            _shown(uri),
            why,
        )
        return [local]
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run_dir = Path(save_dir).resolve()
    run_tags = {**(tags or {}), "foxhunt.run_dir": str(run_dir)}
    run = start_run(
        client, experiment_name, run_name or _run_name(run_dir), run_tags, parent_run_id
    )
    log.info("mlflow: run %s in experiment %s at %s", run.info.run_id, experiment_name, _shown(uri))
    return [local, ServerLogger(client, run)]


def _run_name(run_dir: Path) -> str:
    """The run directory's last two names: outputs/<date>/<time>, a study's trial-3/fold-0."""
    return f"{run_dir.parent.name}/{run_dir.name}"


def start_run(
    client: Any, experiment: str, name: str, tags: Mapping[str, Any], parent: str | None
) -> Any:
    """A new run in `experiment` (made if missing), nested under `parent` if given."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found is None or found.lifecycle_stage != "active":
        try:
            experiment_id = client.create_experiment(experiment)
        except MlflowException:  # another process made it meanwhile
            experiment_id = client.get_experiment_by_name(experiment).experiment_id
    else:
        experiment_id = found.experiment_id
    tags = {k: str(v) for k, v in tags.items()} | ({PARENT_TAG: parent} if parent else {})
    return client.create_run(experiment_id, tags=tags, run_name=name)


def server_logger(loggers: Sequence[Logger]) -> ServerLogger | None:
    """The run's `ServerLogger`, if it has one that has not failed."""
    found = next((lg for lg in loggers if isinstance(lg, ServerLogger)), None)
    return found if found is not None and found.failed is None else None


def log_config(cfg: DictConfig, loggers: Sequence[Logger]) -> None:
    """The run's composed config as the run's params, by their override names
    (`model.hidden_dim`); the logger group's own keys (where it logs) left out."""
    server = server_logger(loggers)
    if server is None:
        return
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config.pop("logger", None)  # type: ignore[union-attr]
    params = {k: str(v) for k, v in _flatten_dict(config, delimiter=".").items()}  # type: ignore[arg-type]
    server.guarded(MLFlowLogger.log_hyperparams, server, params)


# --- the end of a run ------------------------------------------------------------------------


def figures(tree: Any, prefix: str = "") -> dict[str, float]:
    """summary.json's numbers by their dotted paths (metrics.test_loss); lists, text, flags
    and non-finite values left out."""
    found: dict[str, float] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            # MLflow's keys: letters, digits and _-./ and space (an instrument may be ES=F)
            safe = "".join(c if c.isalnum() or c in "_-./ " else "_" for c in str(key))
            found |= figures(value, f"{prefix}{safe}.")
    elif isinstance(tree, int | float) and not isinstance(tree, bool) and math.isfinite(tree):
        found[prefix.rstrip(".")[:250]] = float(tree)
    return found


def run_files(run_dir: Path) -> Iterator[tuple[Path, str]]:
    """The files of a run directory an artifact store gets, each with its folder there: the
    summary, report, plots, forecasts, rolls, logs and exports; not the checkpoints (the
    exports are the models), nor hidden files (the lock, temps) but Hydra's config."""
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir)
        hidden = (
            any(part.startswith(".") for part in relative.parts) and relative.parts[0] != ".hydra"
        )
        if path.is_file() and path.suffix != ".ckpt" and not hidden:
            folder = relative.parent.as_posix().replace(".hydra", "hydra")
            yield path, "" if folder == "." else folder


def publish(
    cfg: DictConfig, run_dir: Path, summary: dict[str, Any], loggers: Sequence[Logger]
) -> None:
    """At the end of a run (rank 0): summary.json's figures as metrics, the run directory's
    files as artifacts, and the exported model registered (logger.registered_model)."""
    server = server_logger(loggers)
    if server is None:
        return
    client, run_id = server.experiment, server.run_id
    server.guarded(_log_figures, client, run_id, summary)
    for path, folder in run_files(run_dir):
        server.guarded(client.log_artifact, run_id, str(path), folder or None)
    name = cfg.logger.get("registered_model")
    if name and summary.get("export") and server.failed is None:
        version = server.guarded(register, cfg, client, run_id, Path(summary["export"]), summary)
        if version is not None:
            log.info("mlflow: registered %s version %s", name, version)


def _log_figures(client: Any, run_id: str, summary: dict[str, Any]) -> None:
    from mlflow.entities import Metric
    from mlflow.utils.time import get_current_time_millis

    now = get_current_time_millis()
    metrics = [Metric(k, v, now, 0) for k, v in figures(summary).items()]
    client.log_batch(run_id, metrics=metrics)


def register(
    cfg: DictConfig, client: Any, run_id: str, export: Path, summary: dict[str, Any]
) -> str:
    """The export, its schema and calibration (and model.onnx, model.json) logged as the run's
    `model` artifacts, registered as a new version of logger.registered_model."""
    from mlflow.exceptions import MlflowException

    name = str(cfg.logger.registered_model)
    with tempfile.TemporaryDirectory(prefix="foxhunt-model-") as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        shutil.copy2(export, model_dir / export.name)
        _, meta = read_export(export)
        write_json(model_dir / "schema.json", meta.get("schema"))
        write_json(model_dir / "calibration.json", meta.get("calibration"))
        if cfg.logger.get("onnx", True):
            _onnx(export, model_dir, cfg.data)
        client.log_artifacts(run_id, str(model_dir), "model")
    try:
        client.create_registered_model(name)
    except MlflowException:  # it exists (made by an earlier run)
        pass
    metrics = summary.get("metrics", {})
    tags = {k: str(metrics[k]) for k in ("test_loss", "skill", "best_baseline") if k in metrics}
    source = f"{client.get_run(run_id).info.artifact_uri}/model"
    return client.create_model_version(name, source, run_id=run_id, tags=tags).version


def _onnx(export: Path, model_dir: Path, data: DictConfig) -> None:
    """model.onnx and model.json beside the export; one warning where they cannot be made."""
    from foxhunt.app.predict.export import export_onnx

    try:
        export_onnx(export, model_dir, data_defaults=data, overwrite=True)
    except FoxhuntError as exc:
        log.warning("mlflow: the model is registered without model.onnx (%s)", exc)


# --- a tuning study --------------------------------------------------------------------------


def study_run(cfg: DictConfig, study: optuna.Study) -> DictConfig:
    """`cfg` whose runs nest under the study's run (made on first use, kept in the study);
    `cfg` itself without logger=mlflow, and with the CSV logger if the server is down."""
    if not enabled(cfg):
        return cfg
    opts, out = cfg.logger, cfg.copy()
    uri = server_uri(opts.get("tracking_uri"))
    parent = study.user_attrs.get(STUDY_ATTR)
    why = unreachable(uri, opts.get("timeout_s", 10.0))
    with open_dict(out):
        if why is not None:
            log.warning(
                "mlflow: the tracking server %s does not answer (%s); the study logs to its "
                "directory alone",
                _shown(uri),
                why,
            )
            out.logger = CSV
            return out
        if parent is None:
            from mlflow import MlflowClient

            tags = {**(opts.get("tags") or {}), "optuna.study": study.study_name}
            run = start_run(MlflowClient(uri), opts.experiment_name, study.study_name, tags, None)
            parent = run.info.run_id
            study.set_user_attr(STUDY_ATTR, parent)
        out.logger.parent_run_id = parent
        out.logger.registered_model = None  # a study's runs are not models to serve
    return out


@contextmanager
def trial_run(cfg: DictConfig, trial: optuna.Trial) -> Iterator[DictConfig]:
    """The trial's run under the study's (then its parameters, value and how it ended);
    yields the config its folds train with, their runs nested under the trial's. A server
    that fails is one warning a trial; the study goes on."""
    if not enabled(cfg) or not cfg.logger.get("parent_run_id"):
        yield cfg
        return
    from mlflow import MlflowClient

    out = cfg.copy()
    try:
        client = MlflowClient(server_uri(cfg.logger.tracking_uri))
        parent = client.get_run(cfg.logger.parent_run_id).info
        experiment = client.get_experiment(parent.experiment_id).name
        tags = {"optuna.trial": trial.number}
        run = start_run(client, experiment, f"trial-{trial.number}", tags, parent.run_id)
        run_id = run.info.run_id
    except Exception as exc:  # noqa: BLE001 - the server's, the network's: the study goes on
        log.warning("mlflow: trial %d logs locally alone (%s)", trial.number, _first_line(exc))
        with open_dict(out):
            out.logger = CSV
        yield out
        return
    out.logger.parent_run_id = run_id
    status, why = "FINISHED", None
    try:
        yield out
    except optuna.TrialPruned as exc:
        status, why = "KILLED", f"pruned: {exc}"
        raise
    except BaseException as exc:
        status, why = "FAILED", _first_line(exc)
        raise
    finally:
        try:
            _end_trial(client, run_id, trial, status, why)
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("mlflow: trial %d's end not logged (%s)", trial.number, _first_line(exc))


def _end_trial(client: Any, run_id: str, trial: optuna.Trial, status: str, why: str | None) -> None:
    """The trial's parameters (suggested as it ran), each fold's validation loss, its value
    (their mean), and how it ended."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils.time import get_current_time_millis

    now = get_current_time_millis()
    losses = trial.user_attrs.get("fold_val_losses") or []
    metrics = [Metric("fold_val_loss", x, now, k) for k, x in enumerate(losses)]
    if losses and all(math.isfinite(x) for x in losses):
        metrics.append(Metric("value", sum(losses) / len(losses), now, 0))
    params = [Param(k, str(v)) for k, v in trial.params.items()]
    tags = [RunTag("foxhunt.ended", why[:5000])] if why else []
    client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
    client.set_terminated(run_id, status)


def log_study(cfg: DictConfig, summary: dict[str, Any], study_dir: Path) -> None:
    """On the study's run: its figures (the deflated Sharpe ratio `dsr`, the probability of
    backtest overfitting `pbo`, the best value, the trial counts), its best parameters, its
    summary, report and plots."""
    parent = cfg.logger.get("parent_run_id") if enabled(cfg) else None
    if not parent:
        return
    try:
        _log_study(server_uri(cfg.logger.tracking_uri), parent, summary, study_dir)
    except Exception as exc:  # noqa: BLE001 - the study is done and written: one warning
        log.warning("mlflow: the study's results not logged (%s)", _first_line(exc))


def _log_study(uri: str, parent: str, summary: dict[str, Any], study_dir: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    selection = summary.get("selection", {})
    found = figures({k: v for k, v in summary.items() if k != "refit"})
    for name in ("dsr", "pbo"):  # by their short names too: what a dashboard plots
        if isinstance(value := selection.get(name, {}).get(name), int | float):
            found[name] = float(value)
    for key, value in found.items():
        client.log_metric(parent, key, value)
    for key, value in summary.get("best_params", {}).items():
        client.set_tag(parent, f"best.{key}", json.dumps(value, default=str))
    for path in sorted(study_dir.glob("*")):
        if path.is_file() and path.suffix in (".json", ".md", ".png"):
            client.log_artifact(parent, str(path))
    client.set_terminated(parent, "FINISHED")
