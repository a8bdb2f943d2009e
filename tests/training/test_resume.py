"""resume=auto finds the newest run of the same experiment; nothing is resumed by accident."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from foxhunt.app.train.phases import train
from foxhunt.run.dir import RunDir
from foxhunt.run.resume import find_previous_run
from foxhunt.threads import usable_cpus
from foxhunt.training.checkpointing import Interrupted
from tests.helpers import (
    ROOT,
    compose_train,
    printed_summary,
    run_cli,
    tiny_overrides,
    train_until_a_checkpoint,
)


def _summary(result) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return printed_summary(result.stdout)


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in directory.glob("*.ckpt")}


@pytest.mark.slow  # several commands or trainings: the full run, not the fast tier
def test_resume_auto_takes_the_newest_run_of_the_same_experiment(tmp_path, table_path):
    base = tiny_overrides(table_path)
    first = _summary(run_cli(*base, "trainer.max_epochs=1", cwd=tmp_path))
    other = _summary(run_cli(*base, "trainer.max_epochs=1", "model.dropout=0.2", cwd=tmp_path))
    before = _digest(Path(first["run_dir"]) / "checkpoints")
    resumed = _summary(run_cli(*base, "trainer.max_epochs=2", "resume=auto", cwd=tmp_path))
    assert resumed["resumed_from"] == first["last_checkpoint"]  # not the dropout=0.2 run
    assert resumed["resumed_from"] != other["last_checkpoint"]
    assert resumed["epochs"] == 2
    assert resumed["run_dir"] != first["run_dir"]
    assert _digest(Path(first["run_dir"]) / "checkpoints") == before  # never overwritten


def _run_of(path: Path, overrides: list[str], age_s: float | None) -> Path:
    """A run directory with its overrides and (unless `age_s` is None) a `last.ckpt` written
    `age_s` seconds ago."""
    (path / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(overrides), path / ".hydra" / "overrides.yaml")
    last = RunDir(path).last_ckpt
    if age_s is not None:
        last.parent.mkdir()
        last.write_bytes(b"")
        os.utime(last, (time.time() - age_s,) * 2)
    return last


def test_resume_auto_takes_its_own_checkpoint_and_never_a_live_runs(tmp_path):
    experiment, runs = ["model.hidden_dim=8"], tmp_path / "outputs" / "2026-12-05"
    older = _run_of(runs / "10-00-00", experiment, age_s=60)
    live = _run_of(runs / "11-00-00", experiment, age_s=0)
    this = _run_of(runs / "12-00-00", experiment, age_s=None).parents[1]
    assert find_previous_run(this, experiment) == live  # the newest, while nothing holds it
    hold = "import sys; from filelock import FileLock; held = FileLock(sys.argv[1]); held.acquire()"
    hold += "; print(1, flush=True); sys.stdin.read()"  # held until this test closes stdin
    with subprocess.Popen(
        [sys.executable, "-c", hold, str(RunDir(live.parents[1]).lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdout.readline() == "1\n"  # a run training there now
        assert find_previous_run(this, experiment) == older
        own = _run_of(this, experiment, age_s=120)  # a requeued job: its own, though oldest
        assert find_previous_run(this, experiment) == own
        holder.stdin.close()


def test_resume_auto_with_nothing_to_resume_is_an_error(tmp_path, table_path):
    result = run_cli(*tiny_overrides(table_path), "resume=auto", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: resume=auto found no earlier run")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # 3 CPU-s: the full tier
def test_resume_auto_or_new_starts_fresh_when_allowed(tmp_path, table_path):
    args = (*tiny_overrides(table_path), "trainer.max_epochs=1", "resume=auto_or_new")
    summary = _summary(run_cli(*args, cwd=tmp_path))
    assert summary["resumed_from"] is None
    assert summary["epochs"] == 1


def _weights(summary: dict) -> dict[str, torch.Tensor]:
    return torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)[
        "state_dict"
    ]


def _assert_same_weights(a: dict, b: dict) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)


def _val_losses(run_dir: Path, log: str = "csv") -> list[float]:
    with open(run_dir / log / "metrics.csv") as f:
        return [float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]]


EXACT = ("trainer.deterministic=true", "optim.schedule=cosine", "model.dropout=0.1")


@pytest.mark.slow  # 9 CPU-s: the full tier
def test_train_two_then_resume_to_four_equals_four_straight(tmp_path, table_path):
    # the cosine schedule is sized by optim.schedule_epochs, so it does not depend on when the
    # first run stops
    common = (*EXACT, "optim.schedule_epochs=4")
    straight = train(
        compose_train(*tiny_overrides(table_path, *common, "trainer.max_epochs=4")),
        tmp_path / "straight",
    )
    first = train(
        compose_train(*tiny_overrides(table_path, *common, "trainer.max_epochs=2")),
        tmp_path / "first",
    )
    resumed = train(
        compose_train(
            *tiny_overrides(
                table_path, *common, "trainer.max_epochs=4", f"ckpt_path={first['last_checkpoint']}"
            )
        ),
        tmp_path / "resumed",
    )
    assert resumed["epochs"] == straight["epochs"] == 4
    _assert_same_weights(straight, resumed)
    assert _val_losses(tmp_path / "resumed") == _val_losses(tmp_path / "straight")[2:]
    assert resumed["metrics"] == straight["metrics"]


class _SignalAt(L.Callback):
    """Sends `signum` to this process after training batch `batch` of `epoch`."""

    def __init__(self, signum: int, epoch: int, batch: int) -> None:
        self.signum, self.epoch, self.batch = signum, epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            os.kill(os.getpid(), self.signum)


class _Seen(L.Callback):
    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.rows.setdefault(trainer.current_epoch, []).extend(batch["index"].tolist())


@pytest.mark.slow  # 11 CPU-s: the full tier
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_writes_a_checkpoint_and_resume_continues_the_epoch(tmp_path, table_path, signum):
    args = tiny_overrides(table_path, *EXACT, "trainer.max_epochs=2")
    straight_seen = _Seen()
    straight = train(compose_train(*args), tmp_path / "straight", extra_callbacks=[straight_seen])

    seen = _Seen()
    # Python's default, or SIG_IGN in a process started in the background (nohup, `&`)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted, match=f"{signal.Signals(signum).name} during epoch 1"):
        train(
            compose_train(*args), tmp_path / "cut", extra_callbacks=[_SignalAt(signum, 1, 3), seen]
        )
    assert signal.getsignal(signal.SIGINT) is handler  # the handler restored
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    assert not (tmp_path / "cut" / "summary.json").exists()

    resumed_seen = _Seen()
    resumed = train(
        compose_train(*args, f"ckpt_path={last}"),
        tmp_path / "resumed",
        extra_callbacks=[resumed_seen],
    )
    # epoch 1 picks up where the interrupt left it: every window once, in the same order
    assert seen.rows[1] + resumed_seen.rows[1] == straight_seen.rows[1]
    assert 0 < len(resumed_seen.rows[1]) < len(straight_seen.rows[1])
    assert resumed["global_step"] == straight["global_step"]
    _assert_same_weights(straight, resumed)
    assert resumed["metrics"] == straight["metrics"]


class _SignalInValidation(L.Callback):
    """Sends `signum` to this process during epoch `epoch`'s validation."""

    def __init__(self, signum: int, epoch: int) -> None:
        self.signum, self.epoch = signum, epoch

    def on_validation_batch_end(self, trainer, *args) -> None:
        if trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            os.kill(os.getpid(), self.signum)


@pytest.mark.slow  # 8 CPU-s: the full tier
def test_a_run_that_stopped_early_resumed_trains_no_more(tmp_path, table_path):
    # a SLURM job preempted during its test is requeued and resumes from its last.ckpt, written
    # after early stopping ended the training: Lightning's EarlyStopping would train on
    args = tiny_overrides(table_path, *EXACT, "trainer.max_epochs=8", "model.variable_dim=4")
    straight = train(compose_train(*args), tmp_path / "straight")
    assert straight["training"]["stopped"] == "early_stopping" and straight["epochs"] < 8
    last = tmp_path / "straight" / "checkpoints" / "last.ckpt"
    resumed = train(compose_train(*args, f"ckpt_path={last}"), tmp_path / "resumed")
    assert (resumed["global_step"], resumed["epochs"]) == (
        straight["global_step"],
        straight["epochs"],
    )
    _assert_same_weights(straight, resumed)
    assert resumed["metrics"] == straight["metrics"]


@pytest.mark.slow  # 8 CPU-s: the full tier
def test_a_signal_in_the_last_validation_stops_the_run_when_training_ends(tmp_path, table_path):
    args = tiny_overrides(table_path, *EXACT, "trainer.max_epochs=3")
    straight = train(compose_train(*args), tmp_path / "straight")
    cut = tmp_path / "cut"
    with pytest.raises(Interrupted, match="SIGUSR2 during epoch 2 after its last batch"):
        train(compose_train(*args), cut, extra_callbacks=[_SignalInValidation(signal.SIGUSR2, 2)])
    assert not (cut / "summary.json").exists()  # stopped before its test
    resumed = train(
        compose_train(*args, f"ckpt_path={cut / 'checkpoints' / 'last.ckpt'}"), tmp_path / "resumed"
    )
    assert resumed["global_step"] == straight["global_step"]
    _assert_same_weights(straight, resumed)
    assert resumed["metrics"] == straight["metrics"]


@pytest.mark.slow  # 4 CPU-s: the full tier
def test_resume_into_its_own_directory_keeps_the_earlier_logs(tmp_path, table_path):
    run_dir = tmp_path / "run"
    first = train(compose_train(*tiny_overrides(table_path, "trainer.max_epochs=1")), run_dir)
    metrics = (run_dir / "csv" / "metrics.csv").read_bytes()
    best = Path(first["best_checkpoint"]).read_bytes()
    args = tiny_overrides(
        table_path, "trainer.max_epochs=2", f"ckpt_path={first['last_checkpoint']}"
    )
    resumed = train(compose_train(*args), run_dir)
    assert resumed["epochs"] == 2 and resumed["resumed_from"] == first["last_checkpoint"]
    assert (run_dir / "csv" / "metrics.csv").read_bytes() == metrics  # not deleted by Lightning
    assert _val_losses(run_dir, "csv/resume-1")  # the continuation logs beside it
    if Path(first["best_checkpoint"]).exists():  # unless a better epoch replaced it
        assert Path(first["best_checkpoint"]).read_bytes() == best


@pytest.mark.slow  # 13 CPU-s: the full tier
def test_ctrl_c_on_the_cli_checkpoints_and_resume_auto_continues(tmp_path, table_path):
    args = tiny_overrides(table_path, "trainer.max_epochs=50")
    proc, last = train_until_a_checkpoint(args, tmp_path)  # epoch 0 done
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    message = err.strip().splitlines()[-1]
    assert message.startswith("interrupted: SIGINT during epoch "), message
    assert f"wrote {last.resolve()}" in message or f"wrote {last}" in message
    status = json.loads((last.parent.parent / "status.json").read_text())
    assert status["status"] == "interrupted"
    assert not (last.parent.parent / "summary.json").exists()

    epoch = int(message.split("during epoch ")[1].split()[0])
    resumed_args = tiny_overrides(table_path, f"trainer.max_epochs={epoch + 1}", "resume=auto")
    resumed = _summary(run_cli(*resumed_args, cwd=tmp_path))
    assert Path(resumed["resumed_from"]) == last.resolve()
    assert resumed["epochs"] == epoch + 1


@pytest.mark.slow
def test_deterministic_runs_do_not_depend_on_the_machines_load(tmp_path):
    """2 threads, a process beside them busy half the time: two runs, and a run resumed
    half-way, end bit-equal; the thread count never changed."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "FOXHUNT_THREADS")}
    probe = Path(__file__).with_name("determinism_probe.py")
    done = subprocess.run(
        [sys.executable, str(probe), str(tmp_path)],
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((tmp_path / "runs.json").read_text())
    threads = usable_cpus()
    assert {name: r["threads"] for name, r in runs.items()} == dict.fromkeys(runs, [threads])
    assert runs["again"]["val_loss"] == runs["straight"]["val_loss"]
    assert runs["resumed"]["val_loss"] == runs["straight"]["val_loss"]  # the first 2 restored
    assert runs["again"]["weights"] == runs["resumed"]["weights"] == runs["straight"]["weights"]
