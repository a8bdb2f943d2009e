"""foxhunt.threads: OpenMP's wait policy is set before torch loads, in every entry point, and
intra-op threads follow the CPUs a process may use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from foxhunt import threads

ROOT = Path(__file__).resolve().parents[1]
# runs a script with --help, recording OMP_WAIT_POLICY when torch is first imported
PROBE = """
import importlib.abc, os, runpy, sys
seen = []
class Probe(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
        return None
sys.meta_path.insert(0, Probe())
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
print("POLICY", seen[0] if seen else "torch not imported")
"""


def _policy_at_torch_import(script: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "FOXHUNT_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(script)],
        capture_output=True,
        text=True,
        env=clean | env,
        cwd=ROOT,
        timeout=120,
    ).stdout
    return out.rsplit("POLICY ", 1)[-1].strip()


@pytest.mark.parametrize(
    "script",
    sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.name != "make_sample_data.py"),
)
def test_every_entry_point_sets_the_wait_policy_before_torch_loads(script):
    assert _policy_at_torch_import(ROOT / "scripts" / script) == "PASSIVE"


def test_the_user_s_setting_and_off_win():
    script = ROOT / "scripts" / "train.py"
    assert _policy_at_torch_import(script, OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert _policy_at_torch_import(script, FOXHUNT_THREADS="off") == "None"


def test_a_cgroup_quota_caps_the_threads(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # cgroup v2: 1.5 CPUs
    assert threads.cgroup_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpus(tmp_path) == 0.5

    monkeypatch.setattr(threads, "cgroup_cpus", lambda: 0.5)
    assert threads.usable_cpus() == 1
    monkeypatch.setattr(threads, "cgroup_cpus", lambda: None)
    assert threads.usable_cpus() == len(os.sched_getaffinity(0))


def test_threads_follow_the_usable_cpus_unless_the_user_set_them(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "usable_cpus", lambda: 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert threads.use_cpus() == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert threads.use_cpus() is None
    finally:
        torch.set_num_threads(before)
