"""What several test modules build with: configs, small Parquet tables, CLI runs, model batches.

Plain functions and constants, one definition each; the fixtures built from them are in
conftest.py. Test modules import from here, never from each other.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import replace
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from filelock import FileLock
from foxhunt_serve import MONTH_CODES, Contract, third_friday
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from foxhunt.app.report.console import summary_path
from foxhunt.app.train.phases import train
from foxhunt.conf import CONF_DIR
from foxhunt.config import DataConfig, register_configs
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.evaluation import gbm
from foxhunt.evaluation.controls import baseline_forecasts, make_control, score
from foxhunt.models import TemporalFusionTransformer

ROOT = Path(__file__).resolve().parents[1]
CONF = str(CONF_DIR)

# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

# the TFT's architecture for tests that build it directly (its constructor takes every one:
# foxhunt.config.ModelConfig holds the defaults), without the highway and the monotone head
ARCH = dict(
    hidden_dim=64,
    num_heads=4,
    lstm_layers=1,
    dropout=0.1,
    variable_dim=16,
    quantiles=(0.1, 0.5, 0.9),
    highway=False,
    monotone=False,
    highway_first=False,
)

# the smallest TFT, a few batches of each split: commands end to end, not the model's skill
TINY_MODEL = (
    "model.hidden_dim=8",
    "model.num_heads=2",
    "model.variable_dim=4",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
)

# predict's batch size where a test is not about it: the memory estimator's trace that sizes
# it otherwise (a second or two a call) runs in tests/test_predict.py and the inspect commands'
PREDICT_BATCH = 1024

# a quarter of tft_small's width: quick steps for the memory and DDP tests
SMALL_MODEL = ("model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4")


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=list(overrides))


def tiny_overrides(path: Path, *extra: str) -> list[str]:
    """Overrides for a two-epoch CPU run on a `make_table` file at `path`."""
    return [
        "data=parquet",
        f"data.path={path}",
        "data.target=y",
        "data.group_column=symbol",
        "data.features=[f1,f2]",
        "data.known_features=[k1]",
        "data.encoder_length=16",
        "data.prediction_length=4",
        "data.batch_size=16",
        "trainer.max_epochs=2",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.accelerator=cpu",
        "trainer.log_every_n_steps=1",
        "report=false",  # the report (about 1 s a run) has its own tests: tests/test_report.py
        *extra,
    ]


def with_(cfg: DataConfig, **changes) -> DataConfig:
    return replace(cfg, **changes)


def futures_cfg(
    path: Path | str, confirm_bars: int = 2, cache_dir: Path | None = None
) -> DataConfig:
    """A data config reading a contract file (or folder) at `path` with data.futures on."""
    cfg = DataConfig(
        path=str(path),
        group_column="symbol",
        features="ohlcv",
        encoder_length=16,
        prediction_length=4,
        lazy=False,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    cfg.futures.enabled = True
    cfg.futures.roll.confirm_bars = confirm_bars
    return cfg


def ohlcv_cfg(cfg: DataConfig, path: Path | str) -> DataConfig:
    """`cfg` on OHLCV bars at `path` (the ES sample's schema): derived features, 32-bar encoder,
    a lazy store (if any) in a `cache` folder beside the file."""
    return with_(
        cfg,
        path=str(path),
        target=None,
        features="ohlcv",
        known_features=[],
        encoder_length=32,
        prediction_length=4,
        cache_dir=str(Path(path).parent / "cache"),
    )


# --------------------------------------------------------------------------------------------
# Data files
# --------------------------------------------------------------------------------------------

T0 = np.datetime64("2026-01-05T00:00:00", "ns").astype(np.int64)
FIVE_MIN = 5 * 60 * 10**9


def make_table(lengths: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Columns of a multi-instrument file: time, symbol, two features, a known input, target."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for symbol, n in lengths.items():
        t = T0 + FIVE_MIN * np.arange(n)
        cols["timestamp"].append(t)
        cols["symbol"].append(np.full(n, symbol))
        cols["f1"].append(rng.normal(size=n))
        cols["f2"].append(rng.normal(size=n) * 10 + 3)
        cols["k1"].append(np.sin(np.arange(n) / 10))
        cols["y"].append(np.cumsum(rng.normal(size=n)))
    return {k: np.concatenate(v) for k, v in cols.items()}


def session_times(
    zone: str, first: str, last: str, hours: tuple[str, str], step_min: int = 5
) -> np.ndarray:
    """UTC ns of bars every `step_min` minutes from `hours[0]` to before `hours[1]` local time
    in `zone` (09:30, 16:00; 16:00, 16:01: one daily bar), Monday to Friday from `first` to
    `last` (ISO dates), made with datetime and zoneinfo alone."""
    (h0, m0), (h1, m1) = (map(int, hm.split(":")) for hm in hours)
    day, end, out = date.fromisoformat(first), date.fromisoformat(last), []
    while day <= end:
        if day.weekday() < 5:
            at = datetime(day.year, day.month, day.day, h0, m0, tzinfo=ZoneInfo(zone))
            close = at.replace(hour=h1, minute=m1)
            while at < close:
                out.append(int(at.timestamp()) * 10**9)
                at += timedelta(minutes=step_min)  # wall-clock arithmetic: local time
        day += timedelta(days=1)
    return np.array(out, dtype=np.int64)


def session_bars(times: np.ndarray, symbol: str = "SPX", seed: int = 0) -> dict[str, np.ndarray]:
    """OHLCV columns of one instrument at `times`: a random walk from 5000."""
    rng = np.random.default_rng(seed)
    n = len(times)
    close = 5000 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))
    open_ = np.concatenate([[close[0]], close[:-1]])
    return {
        "timestamp": times,
        "symbol": np.full(n, symbol),
        "open": open_,
        "high": np.maximum(open_, close) * 1.0005,
        "low": np.minimum(open_, close) * 0.9995,
        "close": close,
        "volume": rng.integers(1, 5000, n).astype(float),
    }


def write_table(path: Path, cols: dict[str, np.ndarray]) -> Path:
    arrays = {
        k: pa.array(v, pa.timestamp("ns", tz="UTC")) if k == "timestamp" else pa.array(v)
        for k, v in cols.items()
    }
    pq.write_table(pa.table(arrays), path)
    return path


@contextmanager
def read_only(directory: Path) -> Iterator[Path]:
    """`directory` unwritable for this process while the block runs: `chattr +i` for root
    (which permission bits do not stop), mode 0o555 otherwise; skips where neither works."""
    directory.mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0
    if root:
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("chattr +i is not available to make a directory unwritable for root")
    else:
        directory.chmod(0o555)
    try:
        yield directory
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        else:
            directory.chmod(0o755)


# --------------------------------------------------------------------------------------------
# Futures
# --------------------------------------------------------------------------------------------

DAY = 86_400 * 10**9
YEAR = 365.25 * DAY
PRICES = ("open", "high", "low", "close")


def ns(day: str) -> int:
    return int(np.datetime64(day, "ns").astype(np.int64))


def listing(
    carry: float = 0.03, seed: int = 0, root: str = "ES"
) -> tuple[list[Contract], np.ndarray]:
    """Quarterly contracts of one daily price path, 2026-01-01 to 2027-11-15 (the data ends
    mid-quarter): each listed 280 days before its expiry (3-4 months trade at once), its close
    path x exp(carry x years to its expiry), its volume rising from 8 days before the previous
    contract's expiry and falling from 8 days before its own (a noisy crossover)."""
    rng = np.random.default_rng(seed)
    start, end = ns("2026-01-01"), ns("2027-11-15")
    t = np.arange(start, end + 1, DAY)
    path = 5000 * np.exp(np.cumsum(rng.normal(0, 0.01, len(t))))
    months = [(2025, 12)] + [(y, m) for y in (2026, 2027, 2028) for m in (3, 6, 9, 12)]
    expiries = [third_friday(y, m) for y, m in months]
    out = []
    for (year, month), before, expiry in zip(months[1:], expiries, expiries[1:], strict=False):
        held = (t >= expiry - 280 * DAY) & (t <= expiry)
        if not held.any():
            continue
        close = path[held] * np.exp(carry * (expiry - t[held]) / YEAR)
        rising = 1 / (1 + np.exp(-(t[held] - (before - 8 * DAY)) / (2 * DAY)))
        falling = 1 / (1 + np.exp(-((expiry - 8 * DAY) - t[held]) / (2 * DAY)))
        out.append(
            Contract(
                id=f"{root}{MONTH_CODES[month - 1]}{year % 10}",
                root=root,
                month=month,
                year=year,
                time_ns=t[held],
                prices={p: close.copy() for p in PRICES},
                volume=10 + 1000 * rising * falling + rng.uniform(0, 200, held.sum()),
            )
        )
    return out, path


def contracts_table(cs: list[Contract]) -> pa.Table:
    """Contracts as one table of OHLCV bars, one row per contract and bar, symbol = the id."""
    return pa.table(
        {
            "timestamp": pa.array(
                np.concatenate([c.time_ns for c in cs]), pa.timestamp("ns", tz="UTC")
            ),
            "symbol": np.concatenate([np.full(len(c.time_ns), c.id) for c in cs]),
            **{p: np.concatenate([c.prices[p] for c in cs]) for p in PRICES},
            "volume": np.concatenate([c.volume for c in cs]),
        }
    )


# --------------------------------------------------------------------------------------------
# Command-line runs
# --------------------------------------------------------------------------------------------


_ended_s: dict[Path, float] = {}  # when the last in-process command run from a directory ended


def run_cli(
    *args: str, cwd: Path, script: str = "train.py", own_process: bool = False
) -> subprocess.CompletedProcess:
    """scripts/<script> with `args`, run from `cwd`: in this process (`run_script`), or
    `own_process` (what DDP and joblib's launcher need: they start processes of their own)."""
    if not own_process:
        named = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in args)
        if not named and int(_ended_s.get(cwd, 0)) >= int(time.time()):
            # Hydra's default run directory is named by the second a command starts in: one
            # started in `cwd` in the second the last one there ended in could share its
            time.sleep(1 - time.time() % 1)
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(cwd)
            code, out, err = run_script(script, *args)
        _ended_s[cwd] = time.time()
        return subprocess.CompletedProcess([script, *args], code, out, err)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def wait_for(path_glob: str, root: Path, proc: subprocess.Popen, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(root.glob(path_glob))
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise AssertionError(f"no {path_glob} under {root} after {timeout} s")


def start_until(
    script: str, args: list[str], cwd: Path, path_glob: str
) -> tuple[subprocess.Popen, Path]:
    """scripts/<script> running in the background, once a file `path_glob` (under `cwd`) is
    there."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, wait_for(path_glob, cwd, proc)


def train_until_a_checkpoint(args: list[str], cwd: Path) -> tuple[subprocess.Popen, Path]:
    """scripts/train.py running in the background, once its first last.ckpt is written."""
    return start_until("train.py", args, cwd, "outputs/*/*/checkpoints/last.ckpt")


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def make_batch(
    model: TemporalFusionTransformer,
    batch: int = 4,
    enc_len: int = 12,
    cardinalities: tuple[int, ...] = (),
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n_enc = model.num_observed + model.num_known
    static_cat = (
        torch.stack([torch.randint(0, c, (batch,), generator=gen) for c in cardinalities], dim=1)
        if cardinalities
        else torch.zeros(batch, 0, dtype=torch.long)
    )
    return {
        "encoder_cont": torch.randn(batch, enc_len, n_enc, generator=gen),
        "decoder_known": torch.randn(
            batch, model.prediction_length, model.num_known, generator=gen
        ),
        "static_cat": static_cat,
        "static_real": torch.randn(batch, model.num_static_real, generator=gen),
    }


# --------------------------------------------------------------------------------------------
# Positive controls (foxhunt.evaluation.controls)
# --------------------------------------------------------------------------------------------

CAPTURED, IC_GAP = 0.8, 0.1  # 80% of the oracle's gain at horizon 1, its IC within 0.1


# the controls' tests train half the default schedule (800 steps): each of the four passes there
# too (measured: benchmarks/positive_controls.py optim.schedule_steps=400, README), in half
# the CI time; the benchmark runs the default. (300 steps is the same training: the schedule
# rounds up to whole epochs, 2 on these panels either way.)
CONTROL_STEPS = 400


def check_control(tmp_path: Path, name: str, lazy: bool = False) -> None:
    """Train control `name` with the default recipe at CONTROL_STEPS; the TFT must find what is
    planted, and the linear and LightGBM baselines what they can represent (a linear mean:
    observed, ar1)."""
    control = make_control(name, tmp_path)
    cfg = compose_train(
        *control.overrides,
        f"optim.schedule_steps={CONTROL_STEPS}",
        f"data.lazy={str(lazy).lower()}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "report=false",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
    )
    train(cfg, tmp_path / "run")
    found = score(control, pq.read_table(tmp_path / "run" / "test_forecasts.parquet"))
    assert found["captured"] >= CAPTURED, found
    assert abs(found["model_ic_h1"] - found["oracle_ic_h1"]) <= IC_GAP, found
    if lazy:
        return
    datamodule = ParquetDataModule(cfg.data, seed=cfg.seed)
    datamodule.setup()
    theirs = baseline_forecasts(datamodule.datasets, datamodule.schema, list(cfg.model.quantiles))
    ic = {n: score(control, t)["model_ic_h1"] for n, t in theirs.items()}
    for who in ("linear", "lightgbm") if name in ("observed", "ar1") else ("lightgbm",):
        if who in ic:  # lightgbm: the baselines extra
            assert abs(ic[who] - found["oracle_ic_h1"]) <= IC_GAP, (who, ic, found)


@contextmanager
def shared_dir(factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A directory built once per test session and read by every xdist worker: yields (path,
    True) to the first worker, which builds it under a lock, and (path, False) to the others once
    it is built. A build that failed is retried by the next worker that asks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = factory.getbasetemp().parent if worker else factory.getbasetemp()
    path, done = root / name, root / f"{name}.done"
    with FileLock(root / f"{name}.lock"):
        if done.exists():
            yield path, False
            return
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        yield path, True
        done.touch()


def needs(module: str) -> None:
    """Skip the calling test module unless `module` is installed: found, not imported (the
    export imports onnxscript where it needs it; importing it at collection costs each worker
    about 2 s)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"could not import {module!r}", allow_module_level=True)


@contextmanager
def without_lightgbm() -> Iterator[None]:
    """The LightGBM baseline skipped, as where lightgbm is not installed: for the runs and fits
    that test something else (its fit takes seconds on a panel; tests/evaluation/test_gbm.py
    and test_baselines.py test it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gbm, "available", lambda: False)
        yield


def run_script(script: str, *args: str, full_error: bool = False) -> tuple[int, str, str]:
    """`foxhunt <command> ...` for scripts/<script> (train.py: `foxhunt train`), in this process
    (a subprocess would spend seconds importing torch again): (exit code, stdout, stderr).
    `full_error`: with the user's HYDRA_FULL_ERROR=1 (an error raises)."""
    from foxhunt.app.commands import main

    hydra = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(out), redirect_stderr(err):
        mp.setattr(sys, "argv", ["foxhunt", command_of(script), *args, *hydra])
        if full_error:
            mp.setenv("HYDRA_FULL_ERROR", "1")
        else:
            mp.delenv("HYDRA_FULL_ERROR", raising=False)
        GlobalHydra.instance().clear()
        try:
            main()
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code
        finally:
            GlobalHydra.instance().clear()
    return code, out.getvalue(), err.getvalue()


def printed_summary(stdout: str) -> dict:
    """The summary a `foxhunt train` or `foxhunt backtest` names on its last line, read from
    its file (summary.json, backtest_summary.json): what a script that wants every figure does."""
    return json.loads(summary_path(stdout.strip().splitlines()[-1]).read_text())


def command_of(script: str) -> str:
    """The `foxhunt` command a scripts/ shim runs (inspect_data.py: inspect)."""
    name = script.removesuffix(".py")
    return {"inspect_data": "inspect", "estimate_memory": "estimate-memory"}.get(name, name)


def checked_run(*cmd: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-3000:])
    return done


def tracked_copy(dst: Path) -> Path:
    """The checkout's files that git does not ignore, copied to `dst` as a fresh clone has them
    (a wheel built in the checkout itself takes stale files from its build/ and egg-info)."""
    git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not one deleted since the last commit
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


def pip_env() -> dict[str, str]:
    """This environment's variables without those that point pip or python at it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


def build_wheels(dist: Path) -> tuple[Path, Path]:
    """foxhunt's and foxhunt-serve's wheels, built in `dist` from a copy of the checkout."""
    source = tracked_copy(dist.parent / "source")
    for project in (source / "serve", source):
        checked_run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", dist, project, cwd=dist.parent, env=pip_env())  # fmt: skip
    return next(dist.glob("foxhunt-*.whl")), next(dist.glob("foxhunt_serve-*.whl"))


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env() -> dict[str, str]:
    """This environment for processes a launcher starts (torchrun, sbatch): without the
    tests' thread pin, so foxhunt sizes each rank's threads itself."""
    drop = ("HYDRA_FULL_ERROR", "OMP_NUM_THREADS", "FOXHUNT_THREADS")
    return {k: v for k, v in os.environ.items() if k not in drop}


def walked_from_the_run_s_start(ckpt: Path, path: Path, run: Path) -> tuple[pa.Table, pa.Table]:
    """#68's parity: each name's latest forecasts of `path` from ACI's stored state (the test
    windows pending then and the windows after the test split held, the rest cut) against ACI
    walked over every window from where the run's began (the nominal level at the name's first
    test window in `run`'s test_forecasts.parquet), asserted equal to float32 rounding for the
    names with a state of their own; returns those two tables. A replay of the whole file
    differs from both by where its level stood at that window: tests/evaluation/
    test_calibration.py bounds that, docs/export.md measures it."""
    from foxhunt_serve import POOLED

    import foxhunt

    predictor = foxhunt.load(ckpt)
    resumed = predictor.predict(path)
    cal = predictor.calibration
    test = pq.read_table(run / "test_forecasts.parquet")
    names, horizon = test["instrument"].to_numpy(), test["horizon"].to_numpy()
    origin, target = (test[c].cast(pa.int64()).to_numpy() for c in ("origin_time", "target_time"))
    nominal = [cal.alphas.tolist()] * (horizon.max() + 1 - horizon.min())
    start = {POOLED: {"miscoverage": nominal, "seen_ns": None}}
    for name in set(cal.state) - {POOLED}:
        first = (names == name) & (origin == origin[names == name].min())
        steps = target[first][np.argsort(horizon[first])]
        start[name] = {"miscoverage": nominal, "seen_ns": (steps - 1).tolist()}
    cal.state = start  # outcomes counted up to the first test window's: none of the run's
    walked = predictor.predict(path)
    own = pa.array(np.isin(resumed["instrument"].to_numpy(), list(start)))
    got, want = resumed.filter(own), walked.filter(own)
    assert got.num_rows > 0
    for column in ("instrument", "origin_time", "horizon", "target_time"):
        assert got[column].equals(want[column]), column
    quantiles = [c for c in got.column_names if c.startswith("q")]
    a, b = (np.column_stack([t[q].to_numpy() for q in quantiles]) for t in (got, want))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
    return got, want
