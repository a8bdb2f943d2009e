"""The memory policy on real CPU runs: budgets that raise real OOMs, no mocks."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch

from foxhunt.app.train.phases import train
from foxhunt.errors import FoxhuntError
from foxhunt.memory import MB, estimate, search
from foxhunt.memory.budget import LiveTensorBytes, cuda_fraction, live_tensors
from tests.helpers import SMALL_MODEL, compose_train, make_table, tiny_overrides, write_table


def config(path: Path, *extra: str):
    return compose_train(*tiny_overrides(path, *SMALL_MODEL, *extra))


@pytest.fixture
def long_table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "long.parquet", make_table({"AAA": 2000, "BBB": 2000}))


def test_live_tensor_budget_raises_a_real_oom_and_counts_frees():
    with LiveTensorBytes(budget=10 * MB) as counter:
        a = torch.zeros(MB // 4)  # 1 MB
        assert counter.live == MB
        del a
        assert counter.live == 0
        with pytest.raises(torch.OutOfMemoryError, match="CPU budget exceeded"):
            torch.zeros(3 * MB)  # 12 MB
        assert counter.live == 0
        assert counter.peak >= 12 * MB


def test_a_cuda_budget_leaves_room_for_the_context():
    """gpu_4gb on an H200 let the allocator reserve 3918 MB beside a 767 MB context: 4685 MB
    on what was to be a 4 GB card. The cap is the budget less the context."""
    gib = 1024 * MB
    assert cuda_fraction(4 * gib, 800 * MB, 140 * gib) == pytest.approx((4096 - 800) / (140 * 1024))
    assert cuda_fraction(4 * gib, 0, 2 * gib) == 1.0  # a budget above the card: all of it
    assert cuda_fraction(500 * MB, 800 * MB, 140 * gib) == 0.0


@pytest.mark.slow  # real trial steps at every size, about 9 s
def test_search_finds_the_largest_batch_under_the_budget(tmp_path, table_path):
    n = 32
    # a budget that fits batch n (and its 1 MB margin), not 2n
    budget = estimate(config(table_path), n, n, device="cpu").peak / MB + 1.01
    cfg = config(
        table_path,
        "memory=search",
        "memory.val_batch_size=null",
        f"memory.budget_mb={budget}",
        "memory.safety_margin_mb=1",
        "trainer.max_epochs=1",
    )
    summary = train(cfg, tmp_path / "run")
    found = summary["memory"]["searched_batch_size"]
    assert n // 2 <= found <= n
    assert summary["batch_size"] == summary["val_batch_size"] == found
    # the run itself, training and validation at that size, met no OOM
    assert summary["memory"]["oom_backoffs"] == []
    assert all(t["fits"] == (t["batch_size"] <= found) for t in summary["memory"]["search_trials"])


class _LowerBudgetAt(L.Callback):
    """At training step k of the first epoch, lower the CPU budget so that the full batch no
    longer fits but half of it does; count every sample of that epoch's finished steps."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.seen: list[int] = []
        self.step_growth = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        counter = live_tensors()
        if trainer.current_epoch == 0 and batch_idx == self.k:
            counter.budget = counter.live + int(0.7 * self.step_growth)
        counter.reset_peak()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        counter = live_tensors()
        if batch_idx < self.k:
            self.step_growth = max(self.step_growth, counter.peak - counter.live)
        if trainer.current_epoch == 0:
            self.seen.extend(batch["index"].tolist())

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            self.expected = sorted(trainer.datamodule.datasets["train"].starts.tolist())
            self.steps = trainer.global_step


@pytest.mark.slow  # 15 CPU-s: the full tier
@pytest.mark.parametrize("keep_effective_batch", [True, False])
def test_oom_mid_epoch_is_survived_without_skipping_or_repeating_samples(
    tmp_path, table_path, caplog, keep_effective_batch
):
    probe = _LowerBudgetAt(k=5)
    cfg = config(
        table_path,
        "memory.budget_mb=4000",
        f"memory.oom_backoff.keep_effective_batch={keep_effective_batch}",
        "trainer.max_epochs=2",
    )
    with caplog.at_level(logging.WARNING, logger="foxhunt.memory.callbacks"):
        summary = train(cfg, tmp_path / "run", extra_callbacks=[probe])
    assert summary["epochs"] == 2
    assert sorted(probe.seen) == probe.expected  # every sample once
    batches = -(-len(probe.expected) // 16)
    if keep_effective_batch:  # one optimizer step per batch: the effective batch stayed
        assert probe.steps == batches
    else:  # one step per micro-batch from step 5 on
        assert probe.steps > batches
    events = summary["memory"]["oom_backoffs"]
    assert events[0]["kind"] == "train" and events[0]["step"] == 5
    assert (events[0]["from"], events[0]["to"]) == (16, 8)
    assert "OOM in train at step 5" in caplog.text


@pytest.mark.slow  # 12 CPU-s: the full tier
def test_batch_one_not_fitting_stops_with_what_it_needs(tmp_path, table_path):
    one = estimate(config(table_path), 1, 1, device="cpu").peak / MB
    cfg = config(table_path, f"memory.budget_mb={0.9 * one}", "memory.safety_margin_mb=0")
    with pytest.raises(FoxhuntError, match=r"out of memory at batch size 1 .* needs about"):
        train(cfg, tmp_path / "run")


@pytest.mark.slow  # 4 CPU-s: the full tier
def test_a_budget_below_the_model_is_one_clear_error(tmp_path, table_path):
    cfg = config(table_path, "memory.budget_mb=0.01", "memory.safety_margin_mb=0")
    with pytest.raises(FoxhuntError, match=r"out of memory outside a training step .* needs"):
        train(cfg, tmp_path / "run")


def _weights(summary):
    ckpt = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)
    return ckpt["state_dict"], ckpt["optimizer_states"][0]["state"]


@pytest.mark.slow  # 5 CPU-s: the full tier
def test_optimizer_release_leaves_training_bit_for_bit_the_same(tmp_path, table_path):
    common = ("trainer.max_epochs=3", "trainer.deterministic=true")
    off = train(config(table_path, *common), tmp_path / "off")
    on = train(config(table_path, *common, "memory.release_optimizer_state=true"), tmp_path / "on")
    assert on["memory"]["optimizer_state_released_mb"] > 0
    (w_off, s_off), (w_on, s_on) = _weights(off), _weights(on)
    assert w_off.keys() == w_on.keys()
    for k in w_off:
        assert torch.equal(w_off[k], w_on[k]), k
    for i in s_off:
        for k in s_off[i]:
            assert torch.equal(s_off[i][k], s_on[i][k]), (i, k)


class _LiveAfterValidationBatches(L.Callback):
    def __init__(self) -> None:
        self.live: list[int] = []

    def on_validation_batch_end(self, trainer, *args):
        if not trainer.sanity_checking:
            self.live.append(live_tensors().live)


@pytest.mark.slow  # 11 CPU-s: the full tier
def test_live_bytes_stay_flat_over_50_validation_batches(tmp_path, long_table):
    probe = _LiveAfterValidationBatches()
    cfg = config(
        long_table,
        "memory.budget_mb=4000",
        "memory.val_batch_size=8",
        "memory.clear_cache_every_n_batches=10",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "data.calibration_share=0",  # every validation window validates: 50 batches and more
    )
    train(cfg, tmp_path / "run", extra_callbacks=[probe])
    assert len(probe.live) >= 50
    assert max(probe.live) <= 1.01 * probe.live[0]


@pytest.mark.slow  # several commands or trainings: the full run, not the fast tier
def test_resumed_run_reuses_the_searched_batch_size(tmp_path, table_path):
    search = ("memory=search", "memory.budget_mb=60", "memory.safety_margin_mb=1")
    first = train(config(table_path, *search, "trainer.max_epochs=1"), tmp_path / "a")
    assert first["memory"]["search_trials"]
    resumed = train(
        config(
            table_path,
            *search,
            "trainer.max_epochs=2",
            f"ckpt_path={first['last_checkpoint']}",
        ),
        tmp_path / "b",
    )
    assert resumed["memory"]["search_trials"] == []
    assert resumed["batch_size"] == first["batch_size"]
    assert resumed["val_batch_size"] == first["val_batch_size"]
    assert resumed["epochs"] == 2


class _LowerBudgetInValidation(L.Callback):
    def __init__(self) -> None:
        self.growth = 0
        self.lowered = False

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        counter = live_tensors()
        if not trainer.sanity_checking and batch_idx == 1 and not self.lowered:
            counter.budget = counter.live + int(0.6 * self.growth)
            self.lowered = True
        counter.reset_peak()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        if not trainer.sanity_checking and batch_idx == 0:
            self.growth = live_tensors().peak - live_tensors().live

    def on_validation_end(self, trainer, pl_module):
        live_tensors().budget = 4000 * MB  # the OOM is forced in validation steps only


@pytest.mark.slow  # 6 CPU-s: the full tier
def test_oom_in_validation_backs_off_and_gives_the_same_metrics(tmp_path, long_table):
    common = (
        "memory.budget_mb=4000",
        "memory.val_batch_size=128",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
    )
    reference = train(config(long_table, *common), tmp_path / "ref")
    lowered = train(
        config(long_table, *common), tmp_path / "low", extra_callbacks=[_LowerBudgetInValidation()]
    )
    events = lowered["memory"]["oom_backoffs"]
    assert events and events[0]["kind"] == "val"
    assert lowered["memory"]["micro_batch_size"]["val"] < 128
    assert lowered["metrics"]["val_loss"] == pytest.approx(
        reference["metrics"]["val_loss"], rel=1e-5
    )


@pytest.mark.slow  # 3 CPU-s: the full tier
def test_the_search_s_first_guess_traces_no_batch_beyond_its_cap(monkeypatch):
    """The estimate only seeds the trials, which stop at max_batch_size: tracing beyond it cost
    the gpu_check's CPU dry run 28 s of its 34 s search."""
    cfg = compose_train("memory=search", "memory.batch_size_search.max_batch_size=8")
    limits = []
    real = search.max_batch_size

    def spy(*args, **kwargs):
        limits.append(kwargs["limit"])
        best, peaks = real(*args, **kwargs)
        assert max(peaks) <= 8
        return best, peaks

    monkeypatch.setattr(search, "max_batch_size", spy)
    assert search.BatchSizeSearch(cfg)._seed(4096, "both", torch.device("cpu"), 8) == 8
    assert limits == [8]
