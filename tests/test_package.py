"""foxhunt as a user installs it: a wheel in a fresh virtualenv, its `foxhunt` command run from an
empty directory (the configs come from the package, the sample is generated there); `pip install .`
from a checkout, with foxhunt_serve inside."""

from __future__ import annotations

import re
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_wheels, checked_run, pip_env, printed_summary, tracked_copy

SHORT = [  # a few batches of the default job: the plumbing, not the model, is under test
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "optim.schedule_steps=null",
    "report=false",
    "trainer.enable_progress_bar=false",
]


@pytest.mark.slow  # builds a wheel (three C builds) and trains through it: the full tier
def test_a_wheel_in_a_fresh_virtualenv_trains_and_predicts_from_an_empty_directory(tmp_path):
    env = pip_env()
    wheels = build_wheels(tmp_path / "dist")
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    # its dependencies from this environment's site-packages (read as a plain path: the
    # editable foxhunt and foxhunt-serve there are not loaded), foxhunt from its wheel alone:
    # foxhunt_serve comes inside it
    site = Path(sysconfig.get_path("purelib", vars={"base": str(fresh), "platbase": str(fresh)}))
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    python, foxhunt = fresh / "bin" / "python", fresh / "bin" / "foxhunt"
    checked_run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                wheels[0], cwd=tmp_path, env=env)  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    where = "import foxhunt, foxhunt_serve; print(foxhunt.__file__, foxhunt_serve.__file__)"
    where = checked_run(python, "-c", where, cwd=empty, env=env).stdout.split()
    assert all(w.startswith(str(fresh)) for w in where), where  # not the checkout's
    assert "train" in checked_run(foxhunt, "--help", cwd=empty, env=env).stdout
    assert (
        "== Configuration groups =="
        in checked_run(foxhunt, "train", "--help", cwd=empty, env=env).stdout
    )
    trained = checked_run(foxhunt, "train", *SHORT, cwd=empty, env=env)
    summary = printed_summary(trained.stdout)
    assert (empty / "data" / "ES_FUT_small.parquet").is_file()  # the sample, made on first use
    best = summary["best_checkpoint"]
    predicted = checked_run(foxhunt, "predict", f"ckpt_path={best}", cwd=empty, env=env)
    assert "predictions.parquet" in predicted.stdout
    assert list(empty.glob("outputs/predict/*/*/predictions.parquet"))


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower().replace("_", "-") for r in requirements}


def test_pip_install_from_a_checkout_asks_no_index_for_foxhunt_serve(tmp_path):
    """foxhunt ships foxhunt_serve (serve/src) and its dependencies rather than requiring
    foxhunt-serve, a name on no index: `pip install .` would look it up on PyPI, and find
    nothing or someone else's package. The metadata `pip install .` reads, from a fresh copy."""
    source, out = tracked_copy(tmp_path / "source"), tmp_path / "metadata"
    out.mkdir()
    hook = (  # PEP 517's hook, as pip calls it
        "import sys, setuptools.build_meta as b; "
        "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    made = checked_run(sys.executable, "-c", hook, out, cwd=source, env=pip_env())
    info = out / made.stdout.split()[-1]
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in (info / "METADATA").read_text().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    assert "foxhunt-serve" not in _names(requires)
    assert {"foxhunt", "foxhunt_serve"} <= set((info / "top_level.txt").read_text().split())
    serve = tomllib.loads((ROOT / "serve" / "pyproject.toml").read_text())["project"]
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(serve["dependencies"]) <= set(ours["dependencies"])  # and the same floors
    assert ours["scripts"]["foxhunt-serve"] == serve["scripts"]["foxhunt-serve"]
