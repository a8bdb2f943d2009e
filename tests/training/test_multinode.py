"""trainer=ddp across nodes: two torchrun commands on this machine, each a node with one
process, meeting at a c10d rendezvous on localhost (what a user starts once per machine).
One run directory decided by rank 0 (`foxhunt.run.ranks`), only rank 0 writing the run's
files, the lock held for all ranks, resume=auto after a node died, the result of one process
at the global batch, one batch-size search for all, each rank's share of its node's CPUs.
The workers run tests/training/multinode_probe.py (`foxhunt train` with probes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from foxhunt import threads
from foxhunt.app.train.phases import train
from foxhunt.errors import FoxhuntError
from foxhunt.memory import estimate, max_batch_size
from foxhunt.memory.estimator import MB
from foxhunt.run import ranks
from foxhunt.run.guard import LOCK_NAME
from tests.helpers import (
    ROOT,
    SMALL_MODEL,
    compose_train,
    free_port,
    launcher_env,
    run_cli,
    tiny_overrides,
    wait_for,
)
from tests.training.ddp_probe import Probe

PROBE = Path(__file__).with_name("multinode_probe.py")
NODES = ("trainer=ddp", "trainer.num_nodes=2")
# as tests/training/test_ddp.py: 2 ranks at batch 8 against 1 process at 16, dropout off, 23
# steps, validation batches the ranks split 2 and 1
COMMON = (
    "trainer.max_epochs=1",
    "model.dropout=0",
    "data.val_fraction=0.18",
    "memory.val_batch_size=23",
)
REL_TOL = 1e-5  # test_ddp's: float sums in another order; a missed all-reduce is ~1e-2
WAIT_S = 300  # a node's command, at most (each ends in 10-40 s on a busy 2-core machine)


def start_nodes(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, node1_env: dict | None = None
) -> list[subprocess.Popen]:
    """Node 0's and node 1's torchrun (one process each) running the probe with `args`, with
    `env` added to both nodes' environment and `node1_env` to node 1's."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    base = launcher_env() | {"PYTHONPATH": str(ROOT), **(env or {})}
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}"]
        out = (cwd.parent / f"node{node}.out").open("a")
        procs.append(
            subprocess.Popen(
                [*cmd, str(PROBE), *args],
                cwd=cwd,
                env=base | ((node1_env or {}) if node else {}),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # one process group: the agent and its worker
            )
        )
    return procs


def finish(procs: list[subprocess.Popen], cwd: Path) -> list[int]:
    """The nodes' exit codes; a node still running after WAIT_S is killed with its worker."""
    deadline = time.monotonic() + WAIT_S
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


def output(cwd: Path) -> str:
    return "".join((cwd.parent / f"node{n}.out").read_text() for n in (0, 1))


def run_nodes(args: list[str], cwd: Path, **kwargs) -> str:
    """Both nodes to the end; their output (both must succeed)."""
    cwd.mkdir(parents=True, exist_ok=True)
    codes = finish(start_nodes(args, cwd, **kwargs), cwd)
    assert codes == [0, 0], output(cwd)[-4000:]
    return output(cwd)


def node_probe(cwd: Path, rank: int) -> dict:
    return json.loads((cwd / f"node_rank{rank}.json").read_text())


def rank_probe(run_dir: Path, rank: int) -> dict:
    return json.loads((run_dir / f"probe_rank{rank}.json").read_text())


def written_in(run_dir: Path, cwd: Path, rank: int) -> set[str]:
    """What `rank` wrote in `run_dir`, relative to it (the probe's own file aside)."""
    inside = [Path(p) for p in node_probe(cwd, rank)["written"]]
    found = {
        str(p.relative_to(run_dir.resolve())) for p in inside if run_dir.resolve() in p.parents
    }
    return found - {f"probe_rank{rank}.json"}


def state(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


# ------------------------------------------------------------------------------------------
# rank 0 decides, the others follow (no training)
# ------------------------------------------------------------------------------------------


def test_other_ranks_take_rank_0_s_run_directory_and_resume_point(tmp_path, monkeypatch):
    """Two ranks' hand-over through a real TCPStore, as torchrun's agent hosts it."""
    port = free_port()
    server = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    for key, value in {
        "TORCHELASTIC_RUN_ID": "x",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(key, value)
    config = OmegaConf.create({"hydra": {"run": {"dir": "outputs/a"}, "job": {"name": "train"}}})
    OmegaConf.set_readonly(config.hydra, True)  # as Hydra hands it to a callback
    monkeypatch.setenv("RANK", "0")
    assert not ranks.other_rank()
    assert ranks.follow_run_dir(config, tmp_path / "a") == tmp_path / "a"
    assert ranks.decided("resume", lambda: "a/last.ckpt") == "a/last.ckpt"
    assert config.hydra.run.dir == "outputs/a"  # rank 0's own config is left as it was

    monkeypatch.setenv("RANK", "1")
    assert ranks.other_rank()
    assert ranks.follow_run_dir(config, None) == tmp_path / "a"
    assert config.hydra.run.dir == str(tmp_path / "a")
    assert config.hydra.output_subdir is None and config.hydra.job.name == "train_ddp_process_1"
    assert ranks.decided("resume", lambda: pytest.fail("rank 1 decided")) == "a/last.ckpt"
    # rank 0 never answered: one line that says so, not a hang
    with pytest.raises(FoxhuntError, match="rank 0 did not hand over the run's plan"):
        ranks.decided("plan", lambda: None, wait_s=0.5)
    del server


def test_a_lone_process_decides_for_itself(monkeypatch):
    for key in ("TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert ranks.launched() is None and not ranks.other_rank()
    assert ranks.decided("resume", lambda: "mine") == "mine"
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's own DDP start: a re-run command
    assert ranks.launched() is None and ranks.other_rank()


# ------------------------------------------------------------------------------------------
# two nodes
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_nodes_train_one_run_written_by_rank_0_as_one_process_would(tmp_path, table_path):
    cwd = tmp_path / "cwd"
    args = tiny_overrides(table_path, *COMMON, *NODES, "data.batch_size=8")
    # rank 1 starts 2 s late: its own Hydra would name another run directory. Node 1 has 1
    # CPU per process by SLURM's count (which Lightning's launcher does not read)
    late, slurm = {"FOXHUNT_PROBE_LATE_RANK": "1"}, {"SLURM_CPUS_PER_TASK": "1"}
    out = run_nodes(args, cwd, env=late, node1_env=slurm)

    (run_dir,) = (cwd / "outputs").glob("*/*")  # one run directory, rank 0's
    assert {p.name for p in run_dir.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    assert out.count("every figure in") == 1  # the summary line, printed by rank 0 alone
    summary = json.loads((run_dir / "summary.json").read_text())
    sizes = (summary["world_size"], summary["batch_size"], summary["global_batch_size"])
    assert sizes == (2, 8, 16)

    # rank 0 wrote the run's files; rank 1 its log alone (no .hydra/, checkpoint, export)
    mine = written_in(run_dir, cwd, 0)
    for name in ("summary.json", "checkpoints/last.ckpt", "checkpoints/model_fp32.safetensors"):
        assert name in mine, sorted(mine)
    assert any(n.startswith("checkpoints/best-") for n in mine)
    assert written_in(run_dir, cwd, 1) == {"train_ddp_process_1.log"}

    # the global batches and the result of one process at batch 16
    single = train(compose_train(*tiny_overrides(table_path, *COMMON)), tmp_path / "one", [Probe()])
    one = json.loads((tmp_path / "one" / "probe_rank0.json").read_text())["batches"]
    two = [rank_probe(run_dir, r)["batches"] for r in (0, 1)]
    assert len(two[0]) == len(two[1]) == len(one) == summary["global_step"] == 23
    assert [sorted(a + b) for a, b in zip(*two, strict=True)] == [sorted(b) for b in one]
    for key in ("val_loss", "test_loss", "test_mae", "test_coverage", "baseline_test_loss"):
        assert summary["metrics"][key] == pytest.approx(single["metrics"][key], rel=REL_TOL), key

    # each rank's share of its own node's CPUs: node 1 has one, node 0 all this machine's (in
    # fit: Lightning's launcher set its own count before, from the affinity alone)
    expected = (threads.rank_cpus(env={"LOCAL_WORLD_SIZE": "1"}), 1)
    assert tuple(node_probe(cwd, r)["threads"] for r in (0, 1)) == expected
    for rank, log in ((0, "train.log"), (1, "train_ddp_process_1.log")):
        assert f"threads: {expected[rank]} on rank {rank} of 2" in (run_dir / log).read_text()


@pytest.mark.slow
def test_the_lock_holds_for_all_ranks_and_int8_and_the_search_agree(tmp_path, table_path):
    cwd, run_dir = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    small = compose_train(*tiny_overrides(table_path, *SMALL_MODEL))
    budget_mb = estimate(small, 64, 64, device="cpu").peak / MB + 1.01  # batch 24 fits rank 0
    rank1_mb = estimate(small, 16, 16, device="cpu").peak / MB + 0.01  # rank 1 between 8, 16
    search = (
        "memory=search",
        "memory.val_batch_size=null",
        "memory.batch_size_search.max_batch_size=24",
        f"memory.budget_mb={budget_mb}",
        "memory.safety_margin_mb=1",
    )
    limits = ("trainer.limit_train_batches=2", "trainer.limit_val_batches=2")
    args = tiny_overrides(
        table_path, *NODES, *SMALL_MODEL, *search, *limits, "precision=int8",
        "trainer.max_epochs=2", "trainer.limit_test_batches=2", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    procs = start_nodes(args, cwd, env={"FOXHUNT_PROBE_RANK1_BUDGET_MB": str(rank1_mb)})
    try:
        # rank 1 has followed rank 0 into the directory rank 0 locked: another run is refused
        wait_for("train_ddp_process_1.log", run_dir, procs[1], timeout=WAIT_S)
        other = run_cli(*tiny_overrides(table_path, f"hydra.run.dir={run_dir}"), cwd=cwd)
        assert other.returncode == 2, other.stderr[-2000:]
        assert f"is in use by another foxhunt run (it holds {LOCK_NAME})" in other.stderr
    finally:
        codes = finish(procs, cwd)
    assert codes == [0, 0], output(cwd)[-4000:]
    assert not (cwd / "outputs").exists()  # hydra.run.dir for both ranks

    mine, theirs = written_in(run_dir, cwd, 0), written_in(run_dir, cwd, 1)
    assert {"summary.json", "checkpoints/model_int8.safetensors"} <= mine, sorted(mine)
    assert theirs == {"train_ddp_process_1.log"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["export"] == str(
        run_dir / "checkpoints" / "model_int8.safetensors"
    )

    # one search for all ranks: the same trials, decisions and sizes (rank 1's smaller budget
    # turned down what fit rank 0); its first trial the estimator's batch, on every rank
    found = [node_probe(cwd, r)["search"] for r in (0, 1)]
    assert found[0]["batch_size"] == found[1]["batch_size"] == summary["batch_size"] <= 16
    decisions = [[(t["batch_size"], t["kind"], t["fits"]) for t in f["trials"]] for f in found]
    assert decisions[0] == decisions[1]
    ran = compose_train(*tiny_overrides(table_path, *SMALL_MODEL, *search, "precision=int8"))
    seed, _ = max_batch_size(ran, budget_mb, step="both", device="cpu", limit=24)
    assert found[0]["trials"][0]["batch_size"] == max(seed, 1)
    lines = [
        [
            ln.split(" - ", 1)[1]
            for ln in (run_dir / log).read_text().splitlines()
            if "search:" in ln
        ]
        for log in ("train.log", "train_ddp_process_1.log")
    ]
    assert lines[0] == lines[1] and len(lines[0]) == 1, lines


@pytest.mark.slow
def test_resume_auto_after_a_node_died_ends_as_the_run_that_was_not_stopped(tmp_path, table_path):
    exact = ("trainer.deterministic=true", "trainer.max_epochs=3", "data.batch_size=8")
    args = tiny_overrides(table_path, *NODES, *exact, "trainer.limit_train_batches=8")
    straight = tmp_path / "straight" / "cwd"
    run_nodes(args, straight)

    cwd = tmp_path / "killed" / "cwd"
    cwd.mkdir(parents=True)
    procs = start_nodes(args, cwd)
    try:
        last = wait_for("outputs/*/*/checkpoints/last.ckpt", cwd, procs[0], timeout=WAIT_S)
        time.sleep(1)  # into the next epoch
        os.kill(int((cwd / "pid_rank1").read_text()), signal.SIGKILL)  # node 1's process
    finally:
        codes = finish(procs, cwd)
    assert codes[0] != 0 and codes[1] != 0  # both nodes' agents gave up
    assert torch.load(last, weights_only=True)["global_step"] < 3 * 8  # mid-training
    run_nodes([*args, "resume=auto"], cwd)
    runs = sorted((cwd / "outputs").glob("*/*"))
    assert len(runs) == 2 and runs[0] == last.parent.parent
    summary = json.loads((runs[1] / "summary.json").read_text())
    assert summary["resumed_from"] == str(last)
    assert [rank_probe(runs[1], r)["resumed_from"] for r in (0, 1)] == [str(last)] * 2

    (reference,) = (straight / "outputs").glob("*/*")
    expected = json.loads((reference / "summary.json").read_text())
    assert summary["global_step"] == expected["global_step"] == 3 * 8
    assert summary["metrics"]["val_loss"] == expected["metrics"]["val_loss"]
    assert summary["metrics"]["test_loss"] == expected["metrics"]["test_loss"]
    ours, theirs = (state(r / "checkpoints" / "last.ckpt") for r in (runs[1], reference))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
