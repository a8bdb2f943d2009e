"""foxhunt as a user installs it: a wheel in a fresh virtualenv, its `foxhunt` command run from an
empty directory (the configs come from the package, the sample is generated there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.helpers import ROOT

SHORT = [  # a few batches of the default job: the plumbing, not the model, is under test
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "optim.schedule_steps=null",
    "report=false",
    "trainer.enable_progress_bar=false",
]


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-3000:])
    return done


def _tracked_copy(dst: Path) -> Path:
    """The checkout's files that git does not ignore, copied to `dst` as a fresh clone has them
    (a wheel built in the checkout itself takes stale files from its build/ and egg-info)."""
    git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not one deleted since the last commit
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


@pytest.mark.slow  # builds a wheel (three C builds) and trains through it: the full tier
def test_a_wheel_in_a_fresh_virtualenv_trains_and_predicts_from_an_empty_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", dist, _tracked_copy(tmp_path / "source"), cwd=tmp_path, env=env)  # fmt: skip
    wheel = next(dist.glob("foxhunt-*.whl"))
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    # its dependencies from this environment's site-packages (read as a plain path: the
    # editable foxhunt there is not loaded), foxhunt itself from the wheel alone
    site = Path(sysconfig.get_path("purelib", vars={"base": str(fresh), "platbase": str(fresh)}))
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    python, foxhunt = fresh / "bin" / "python", fresh / "bin" / "foxhunt"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel,
         cwd=tmp_path, env=env)  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    where = _run(python, "-c", "import foxhunt; print(foxhunt.__file__)", cwd=empty, env=env)
    assert where.stdout.startswith(str(fresh)), where.stdout  # not the checkout's
    assert "train" in _run(foxhunt, "--help", cwd=empty, env=env).stdout
    assert (
        "== Configuration groups ==" in _run(foxhunt, "train", "--help", cwd=empty, env=env).stdout
    )
    trained = _run(foxhunt, "train", *SHORT, cwd=empty, env=env)
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert (empty / "data" / "ES_FUT_small.parquet").is_file()  # the sample, made on first use
    best = summary["best_checkpoint"]
    predicted = _run(foxhunt, "predict", f"ckpt_path={best}", cwd=empty, env=env)
    assert "predictions.parquet" in predicted.stdout
    assert list(empty.glob("outputs/predict/*/*/predictions.parquet"))
