"""foxhunt.threads: intra-op threads follow the CPUs a process may use and the share other
processes leave it."""

from __future__ import annotations

import os

import pytest
import torch

from foxhunt import threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_cgroup_quota_caps_the_cpus(tmp_path, monkeypatch):
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


def test_busy_time_counts_the_process_s_cpus_only(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 900 5000 0 0 0 0 0 0\n"
        "cpu0 100 10 50 2000 30 5 5 20 0 0\n"  # busy: 100+10+50+5+5+20 = 190 ticks
        "cpu1 800 0 850 3000 0 0 0 0 0 0\n"
        "intr 12345\n"
    )
    ticks = os.sysconf("SC_CLK_TCK")
    assert threads.busy_seconds({0}, stat) == pytest.approx(190 / ticks)
    assert threads.busy_seconds({0, 1}, stat) == pytest.approx((190 + 1650) / ticks)
    assert threads.busy_seconds({0}, tmp_path / "missing") is None


def test_threads_follow_the_cpus_the_others_leave(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 4)
    # (wall, busy, own) seconds at each look; 1.2 s is too soon after 1.0: the clock alone
    walls = iter([0.0, 1.0, 1.2, 2.0, 3.0, 4.0])
    busy = iter([0.0, 4.0, 7.9, 10.9, 14.9])  # quiet: the others used 0.1 CPU; then 3.9, 2, 0
    own = iter([0.0, 3.9, 3.9, 4.9, 8.9])
    monkeypatch.setattr(threads, "clock", lambda: next(walls))
    monkeypatch.setattr(threads, "busy_seconds", lambda cpus: next(busy))
    monkeypatch.setattr(threads, "own_seconds", lambda: next(own))
    torch.set_num_threads(4)
    share = threads.CpuShare(interval_s=0.5)
    got = [share.update() for _ in range(5)]
    assert got == [4, 4, 1, 2, 4] and torch.get_num_threads() == 4 and share.changes == 3


def test_the_user_s_setting_and_off_win(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 1)
    assert threads.use_cpus() == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv("FOXHUNT_THREADS", "off")
    assert threads.off() and threads.use_cpus() is None
    monkeypatch.delenv("FOXHUNT_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's, or a launcher's share
    assert threads.off()


def test_a_rank_gets_its_share_of_its_node_not_of_the_machine(monkeypatch):
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8)  # this node's, for this process
    assert threads.rank_cpus(env={}) == 8  # one process
    # torchrun: LOCAL_WORLD_SIZE processes on this node (WORLD_SIZE counts every node's)
    assert threads.rank_cpus(env={"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "16"}) == 2
    assert threads.rank_cpus(env={"LOCAL_WORLD_SIZE": "3"}) == 2
    assert threads.rank_cpus(env={"LOCAL_WORLD_SIZE": "16"}) == 1  # at least one
    # the Trainer's processes on this node, once it runs, over the launcher's count
    assert threads.rank_cpus(2, env={"LOCAL_WORLD_SIZE": "4"}) == 4
    # SLURM: CPUs per task where given; else the job's CPUs on this node over its tasks here
    assert threads.rank_cpus(env={"SLURM_CPUS_PER_TASK": "3", "LOCAL_WORLD_SIZE": "4"}) == 3
    assert threads.rank_cpus(env={"SLURM_CPUS_PER_TASK": "32"}) == 8  # capped by usable
    slurm_node = {"SLURM_CPUS_ON_NODE": "6", "SLURM_NTASKS_PER_NODE": "2"}
    assert threads.rank_cpus(env=slurm_node) == 3


def test_use_cpus_sets_the_rank_s_share(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("FOXHUNT_THREADS", raising=False)
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads.use_cpus() == 1 and torch.get_num_threads() == 1
