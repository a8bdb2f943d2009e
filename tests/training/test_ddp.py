"""trainer=ddp on CPU: two gloo processes started by Lightning from the CLI, one run directory,
the windows sharded, the metrics synced, and the result of a single process at the same
global batch. The processes run tests/training/ddp_probe.py: scripts/train.py with a callback
that writes what each process saw."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from foxhunt.app.report.console import FINAL, summary_path
from foxhunt.app.train.phases import train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.errors import ConfigError
from foxhunt.memory import estimate
from foxhunt.memory.estimator import MB
from tests.helpers import (
    SMALL_MODEL,
    compose_train,
    run_cli,
    tiny_overrides,
    train_until_a_checkpoint,
)
from tests.training.ddp_probe import OOM_STEP, Probe

PROBE = "../tests/training/ddp_probe.py"  # run_cli's scripts/ relative
DDP = ("trainer=ddp", "trainer.devices=2")
# 1 process at batch 16 against 2 at 8: the same global batches (356 train windows, even, so
# no padding: 23 steps); dropout off, as the processes' dropout masks differ from one
# process's. Validation at 23 gives the processes 2 and 1 batches (47 windows: 24 and 23): a
# collective in a validation step would hang.
COMMON = (
    "trainer.max_epochs=1",
    "model.dropout=0",
    "data.val_fraction=0.18",
    "memory.val_batch_size=23",
)
# float32 sums over 8 or 16 samples in another order: measured 0 for val_loss and test_loss
# and 1e-7 relative for test_mae after one epoch; 1e-5 leaves room for other
# thread counts and BLAS kernels while an off-by-one batch or a missed all-reduce is ~1e-2
REL_TOL = 1e-5


def summaries(stdout: str) -> list[dict]:
    """The summaries the runs' last lines name (`foxhunt.app.report.console.final_line`)."""
    lines = [line for line in stdout.splitlines() if FINAL in line]
    return [json.loads(summary_path(line).read_text()) for line in lines]


def probes(run_dir: Path) -> list[dict]:
    return [json.loads((run_dir / f"probe_rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_two_processes_shard_sync_and_match_one_at_the_same_global_batch(tmp_path, table_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = run_cli(
        *tiny_overrides(table_path, *COMMON, *DDP, "data.batch_size=8"),
        cwd=cwd,
        script=PROBE,
        own_process=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    # one run directory: the other process wrote into rank 0's, with no .hydra of its own
    (run_dir,) = (cwd / "outputs").glob("*/*")
    assert sorted(p.name for p in cwd.iterdir()) == ["outputs"]
    assert {p.name for p in run_dir.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    # the summary: named once, last, and the one written (by rank 0)
    (summary,) = summaries(result.stdout)
    assert summary_path(result.stdout.strip().splitlines()[-1]) == run_dir / "summary.json"
    assert Path(summary["run_dir"]) == run_dir
    sizes = (summary["world_size"], summary["batch_size"], summary["global_batch_size"])
    assert sizes == (2, 8, 16)

    # sharded: each train window once per epoch across the processes, and each global batch
    # (rank 0's k-th batch with rank 1's) is the single-process run's k-th batch of 16
    single = train(
        compose_train(*tiny_overrides(table_path, *COMMON)),
        tmp_path / "single",
        extra_callbacks=[Probe()],
    )
    one = json.loads((tmp_path / "single" / "probe_rank0.json").read_text())["batches"]
    two = [p["batches"] for p in probes(run_dir)]
    two_metrics = [p["metrics"] for p in probes(run_dir)]
    assert len(two[0]) == len(two[1]) == len(one) == summary["global_step"] == 23
    assert [sorted(a + b) for a, b in zip(*two, strict=True)] == [sorted(b) for b in one]
    dm = ParquetDataModule(compose_train(*tiny_overrides(table_path, *COMMON)).data)
    dm.setup()
    every = sorted(dm.datasets["train"].starts.tolist())
    assert sorted(i for b in two[0] + two[1] for i in b) == every

    # synced metrics: the same in both processes (what ModelCheckpoint compares) and the same
    # numbers as one process (the metrics' sums span both shards)
    assert two_metrics[0] == two_metrics[1]
    assert two_metrics[0]["val_loss"] == pytest.approx(summary["metrics"]["val_loss"], rel=1e-7)
    for key in ("val_loss", "test_loss", "test_mae", "test_coverage", "baseline_test_loss"):
        assert summary["metrics"][key] == pytest.approx(single["metrics"][key], rel=REL_TOL), key

    # resume=auto: rank 0 resolves the checkpoint and the other process gets that one
    resumed = run_cli(
        *tiny_overrides(table_path, *COMMON, *DDP, "data.batch_size=8"),
        "trainer.max_epochs=2",
        "resume=auto",
        cwd=cwd,
        own_process=True,
        script=PROBE,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (after,) = summaries(resumed.stdout)
    assert after["resumed_from"] == summary["last_checkpoint"]
    assert [p["resumed_from"] for p in probes(Path(after["run_dir"]))] == [
        summary["last_checkpoint"]
    ] * 2
    assert after["global_step"] == 2 * 23
    logs = {p.name: p.read_text() for p in Path(after["run_dir"]).glob("*.log")}
    assert "resume=auto: resuming from" in logs["train.log"]  # resolved by rank 0 alone
    assert "resume=auto" not in logs["train_ddp_process_1.log"]  # handed the path


@pytest.mark.slow
def test_an_oom_in_one_process_backs_off_both(tmp_path, table_path, monkeypatch):
    monkeypatch.setenv("FOXHUNT_PROBE_OOM_RANK", "1")
    result = run_cli(
        *tiny_overrides(
            table_path,
            *DDP,
            *SMALL_MODEL,
            "data.batch_size=8",
            "memory.budget_mb=4000",
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=6",
            "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=2",
        ),
        cwd=tmp_path,
        own_process=True,
        script=PROBE,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = summaries(result.stdout)
    rank0, rank1 = probes(Path(summary["run_dir"]))
    # both redid the step at half the batch and kept that size
    assert rank0["micro"]["train"] == rank1["micro"]["train"] == 4
    for probe in (rank0, rank1):
        assert probe["global_step"] == 6  # one optimizer step per batch, none skipped
        (event,) = [e for e in probe["events"] if e["kind"] == "train"]
        assert (event["step"], event["from"], event["to"]) == (OOM_STEP, 8, 4)
    assert "CPU budget exceeded" in [e for e in rank1["events"] if e["kind"] == "train"][0]["error"]
    assert rank0["events"][0]["error"] == "out of memory on process 1"
    assert summary["memory"]["oom_backoffs"][0]["error"] == "out of memory on process 1"


@pytest.mark.slow
def test_batch_size_search_takes_what_fits_in_every_process(tmp_path, table_path, monkeypatch):
    small = compose_train(*tiny_overrides(table_path, *SMALL_MODEL))
    # rank 0's budget holds batch 24 with room to spare, rank 1's 8 to 16 (the estimate's
    # accuracy, see test_search_finds_the_largest_batch_under_the_budget)
    budget_mb = estimate(small, 64, 64, device="cpu").peak / MB + 1.01
    rank1_mb = estimate(small, 16, 16, device="cpu").peak / MB + 0.01
    monkeypatch.setenv("FOXHUNT_PROBE_RANK1_BUDGET_MB", str(rank1_mb))
    result = run_cli(
        *tiny_overrides(
            table_path,
            *DDP,
            *SMALL_MODEL,
            "memory=search",
            "memory.val_batch_size=null",
            "memory.batch_size_search.max_batch_size=24",
            f"memory.budget_mb={budget_mb}",
            "memory.safety_margin_mb=1",
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=2",
        ),
        cwd=tmp_path,
        own_process=True,
        script=PROBE,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = summaries(result.stdout)
    rank0, rank1 = probes(Path(summary["run_dir"]))
    found = summary["memory"]["searched_batch_size"]
    assert rank0["batch_size"] == rank1["batch_size"] == summary["batch_size"] == found <= 16
    # batch 24 fit rank 0 (no OOM, peak under its limit) and was turned down for rank 1
    (first, *_) = summary["memory"]["search_trials"]
    assert first["batch_size"] == 24 and first["error"] is None and not first["fits"]
    assert first["peak_mb"] < budget_mb - 1


@pytest.mark.slow
def test_ddp_in_a_multirun_is_refused_with_what_to_do(tmp_path, table_path):
    result = run_cli(
        "-m", *tiny_overrides(table_path, *DDP, "seed=1,2"), cwd=tmp_path, own_process=True
    )
    assert "cannot run inside a Hydra multirun (-m)" in result.stderr
    assert "run each combination as its own command" in result.stderr
    statuses = list((tmp_path / "multirun").glob("*/*/*/status.json"))
    assert len(statuses) == 2
    assert all(json.loads(s.read_text())["status"] == "invalid" for s in statuses)
    assert not list(tmp_path.glob("*/*/*/*/checkpoints"))  # nothing trained


def test_backoff_that_adds_optimizer_steps_is_refused_before_any_process_starts(
    tmp_path, table_path
):
    cfg = compose_train(
        *tiny_overrides(table_path, *DDP, "memory.oom_backoff.keep_effective_batch=false")
    )
    with pytest.raises(ConfigError, match="keep_effective_batch=false .* keep it true with DDP"):
        train(cfg, tmp_path / "run")


@pytest.mark.slow
def test_ctrl_c_stops_both_processes_at_the_same_batch_with_one_checkpoint(tmp_path, table_path):
    args = tiny_overrides(table_path, *DDP, "trainer.max_epochs=50", "data.batch_size=8")
    proc, last = train_until_a_checkpoint(args, tmp_path)
    proc.send_signal(signal.SIGINT)  # to rank 0 alone: rank 1 must stop with it
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    # both processes, at the same batch; searched in the whole stream, not by line start: the
    # two processes share stderr, and one's line may follow the other's unfinished log line
    where = re.findall(
        r"interrupted: (?:SIGINT|a signal to another DDP process) (during [^;]+);", err
    )
    assert len(where) == 2 and where[0] == where[1], err[-2000:]
    status = json.loads((last.parent.parent / "status.json").read_text())
    assert status["status"] == "interrupted" and status["error"].startswith("SIGINT")
    assert list(tmp_path.glob("outputs/*/*")) == [last.parent.parent]  # one run directory
    assert not list(last.parent.glob("*.foxhunt-tmp"))
