"""Walk-forward backtests: the fold plan, the pooled out-of-sample forecasts, finetune, resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from hydra import compose, initialize_config_dir

from foxhunt.app.backtest import folds as backtest
from foxhunt.app.train.phases import train
from foxhunt.config import register_configs
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.read import timeline
from foxhunt.data.splits import NO_CUT, NO_START, SPLITS
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.training.checkpoint_io import read_checkpoint
from foxhunt.training.checkpointing import Interrupted
from tests.helpers import (
    CONF,
    FIVE_MIN,
    ROOT,
    compose_train,
    contracts_table,
    listing,
    make_table,
    printed_summary,
    run_cli,
    tiny_overrides,
    wait_for,
    write_table,
)


def compose_backtest(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("backtest", overrides=list(overrides))


@pytest.fixture
def staggered(tmp_path: Path) -> Path:
    """Three instruments with different histories on a 750-bar common timeline: AAA the first
    500 bars, BBB the last 500, CCC bars 400 to 700."""
    cols = make_table({"AAA": 500, "BBB": 500, "CCC": 300})
    for symbol, shift in (("BBB", 250), ("CCC", 400)):
        cols["timestamp"][cols["symbol"] == symbol] += shift * FIVE_MIN
    return write_table(tmp_path / "staggered.parquet", cols)


def _index(times: np.ndarray, t: int) -> int:
    return len(times) if t == NO_CUT else int(np.searchsorted(times, t))


@pytest.mark.parametrize("mode", ["expanding", "rolling"])
def test_folds_are_consecutive_embargoed_and_never_train_on_a_test_period(staggered, mode):
    cfg = compose_backtest(*tiny_overrides(staggered), "backtest.folds=4", f"backtest.mode={mode}")
    times = timeline(cfg.data)
    folds = backtest.plan_folds(times, cfg.backtest, cfg.data)
    E, embargo = 16, 4  # tiny_overrides' encoder; the embargo defaults to prediction_length

    # the test periods: consecutive, equally long (the last 15% of the timeline, in 4), to the end
    assert [f.test_end for f in folds[:-1]] == [f.test_start for f in folds[1:]]
    assert folds[-1].test_end == NO_CUT
    test_spans = {_index(times, f.test_end) - _index(times, f.test_start) for f in folds}
    assert test_spans == {int(750 * 0.15) // 4}
    # validation just before each test period, equally long
    assert len({_index(times, f.test_start) - _index(times, f.val_start) for f in folds}) == 1
    train_spans = {_index(times, f.val_start) - _index(times, f.train_start) for f in folds}
    if mode == "expanding":
        assert {f.train_start for f in folds} == {NO_START}
    else:  # a fixed window: the first fold's training history, from the data's start
        assert folds[0].train_start == times[0] and len(train_spans) == 1

    for fold in folds:
        data = ParquetDataModule(backtest.fold_config(cfg, fold).data)
        data.setup()
        targets = {
            s: data.datasets[s].target_times(np.arange(len(data.datasets[s]))) for s in SPLITS
        }
        # over every instrument at once: each split's targets inside its own period...
        assert targets["train"].min() >= (times[E] if mode == "expanding" else fold.train_start)
        assert targets["val"].min() >= fold.val_start
        assert targets["test"].min() >= fold.test_start
        assert targets["test"].max() < (fold.test_end if fold.test_end != NO_CUT else 2**63 - 1)
        # ...and the embargo's bars before each cut hold no target of the earlier split
        assert targets["train"].max() < times[_index(times, fold.val_start) - embargo]
        assert targets["val"].max() < times[_index(times, fold.test_start) - embargo]
        # no fold trains or validates on its own test period or a later fold's
        assert max(targets["train"].max(), targets["val"].max()) < fold.test_start
        assert {len(targets[s]) > 0 for s in SPLITS} == {True}


def test_a_plan_that_does_not_fit_is_one_config_error(staggered):
    cfg = compose_backtest(*tiny_overrides(staggered), "backtest.folds=40")
    with pytest.raises(ConfigError, match="a test period of 2 bars holds no 4-step forecast"):
        backtest.plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)
    cfg = compose_backtest(*tiny_overrides(staggered), "backtest.test_span=150")
    with pytest.raises(ConfigError, match="5 test periods of 150 bars take the whole 750-bar"):
        backtest.plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)
    cfg = compose_backtest(
        *tiny_overrides(staggered), "backtest.test_span=140", "backtest.val_span=30"
    )
    with pytest.raises(ConfigError, match="too few for one window: lower backtest.folds"):
        backtest.plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)
    cfg = compose_backtest(*tiny_overrides(staggered), "data.split.test_start=2026-01-06")
    with pytest.raises(ConfigError, match="the backtest sets data.split.test_start for each"):
        backtest.check(cfg)


def _actuals(path: Path) -> dict[tuple[str, int], float]:
    table = pq.read_table(path)
    times = table["timestamp"].cast("int64").to_numpy()
    return dict(
        zip(
            zip(table["symbol"].to_pylist(), times.tolist(), strict=True),
            table["y"].to_numpy().tolist(),
            strict=True,
        )
    )


@pytest.mark.slow  # 8 CPU-s: the full tier
def test_oos_predictions_hold_every_fold_s_test_windows_once(tmp_path, staggered):
    overrides = ["backtest.folds=3"]
    cfg = compose_backtest(*tiny_overrides(staggered, "trainer.max_epochs=1"), *overrides)
    out = tmp_path / "backtest"
    out.mkdir()
    summary = backtest.run(cfg, out, overrides)

    oos = pq.read_table(out / "oos_predictions.parquet")
    assert oos.column_names[:5] == ["fold", "instrument", "origin_time", "horizon", "target_time"]
    assert {"q0.1", "q0.5", "q0.9", "actual"} <= set(oos.column_names)
    fold_of = oos["fold"].to_numpy()
    origin = oos["origin_time"].cast("int64").to_numpy()
    target = oos["target_time"].cast("int64").to_numpy()
    instrument = oos["instrument"].to_pylist()
    actuals = _actuals(staggered)
    for fold in backtest.plan_folds(timeline(cfg.data), cfg.backtest, cfg.data):
        data = ParquetDataModule(backtest.fold_config(cfg, fold).data)
        data.setup()
        test = data.datasets["test"]
        names = [test.series.names[g] for g in test.window_series().tolist()]
        times = test.target_times(np.arange(len(test)))
        expected = Counter(
            (name, int(t), step + 1)
            for name, row in zip(names, times, strict=True)
            for step, t in enumerate(row)
        )
        mine = fold_of == fold.index
        rows = Counter(
            (instrument[i], int(target[i]), int(h))
            for i, h in zip(np.flatnonzero(mine), oos["horizon"].to_numpy()[mine], strict=True)
        )
        assert rows == expected  # every test window of the fold, each step exactly once
        steps = oos["horizon"].to_numpy()[mine].astype(np.int64)
        assert (target[mine] - origin[mine] == steps * FIVE_MIN).all()
        got = oos["actual"].to_numpy()[mine]
        want = [actuals[(instrument[i], int(target[i]))] for i in np.flatnonzero(mine)]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    # backtest_summary.json: each fold's own summary, the mean val_loss, the pooled figures
    written = json.loads((out / "backtest_summary.json").read_text())
    assert written == json.loads(json.dumps(summary))
    assert written["folds_missing"] == [] and [f["fold"] for f in written["folds"]] == [0, 1, 2]
    fold_summaries = [
        json.loads((out / f"fold-{k}" / "summary.json").read_text()) for k in range(3)
    ]
    for row, own in zip(written["folds"], fold_summaries, strict=True):
        assert row["metrics"] == own["metrics"] and row["cuts"] == own["splits"]["cuts"]
    pooled, rows = written["metrics"], [f["test_rows"] for f in written["folds"]]
    assert sum(rows) == oos.num_rows == pooled["test_rows"]
    assert pooled["val_loss"] == pytest.approx(
        np.mean([s["metrics"]["val_loss"] for s in fold_summaries])
    )
    # the rows are the forecasts the folds' tests scored: pooled = the folds' row-weighted mean
    for name in ("test_loss", "test_mae", "test_coverage"):
        folds_mean = np.average([s["metrics"][name] for s in fold_summaries], weights=rows)
        assert pooled[name] == pytest.approx(folds_mean, rel=1e-4), name
    assert 0 <= pooled["test_up_share"] <= 1
    for name, scores in written["baselines"].items():
        losses = [s["baselines"][name]["test_loss"] for s in fold_summaries]
        assert scores["test_loss"] == pytest.approx(np.average(losses, weights=rows))
    if written["baselines"]:
        best = pooled["best_baseline"]
        assert pooled["skill"] == pytest.approx(  # the model's own against the baselines'
            1 - pooled["test_loss"] / written["baselines"][best]["test_loss"]
        )
    # per instrument: each fold's per-instrument figures pooled by their windows, the skill
    # against the instrument's own strongest baseline
    instruments = set(instrument)
    assert set(pooled["by_instrument"]) == instruments
    for name in instruments:
        per = [s["metrics"]["by_instrument"].get(name) for s in fold_summaries]
        weights = [p["windows"] if p else 0 for p in per]
        mine = pooled["by_instrument"][name]
        assert mine["windows"] == sum(weights)
        losses = [p["test_loss"] if p else 0.0 for p in per]  # the model's own forecasts'
        expected = np.average(losses, weights=weights)
        assert mine["test_loss"] == pytest.approx(expected, rel=1e-4)
        rivals = {}
        for rival, scores in written["baselines"].items():
            found = [s["baselines"][rival]["test_by_instrument"].get(name) for s in fold_summaries]
            losses = [f["test_loss"] if f else 0.0 for f in found]
            rivals[rival] = np.average(losses, weights=weights)
            assert scores["test_by_instrument"][name]["test_loss"] == pytest.approx(rivals[rival])
        if rivals:
            skill = 1 - mine["test_loss"] / min(rivals.values())
            assert mine["skill"] == pytest.approx(skill)
    # each fold calibrated on its own validation windows: the pooled rows before and after
    cal = written["calibration"]
    assert cal["method"] == "aci" and cal["verdict"] in ("better", "worse", "mixed")
    folds_raw = np.average(
        [s["calibration"]["before"]["intervals"][0]["coverage"] for s in fold_summaries],
        weights=rows,
    )
    assert cal["before"]["intervals"][0]["coverage"] == pytest.approx(folds_raw)
    folds_after = np.average(
        [s["calibration"]["after"]["intervals"][0]["coverage"] for s in fold_summaries],
        weights=rows,
    )
    assert cal["after"]["intervals"][0]["coverage"] == pytest.approx(folds_after)
    # the IC, calibration and strategy over every fold's rows together
    assert written["evaluation"]["windows"] * 4 == pooled["test_rows"]
    assert -1 <= pooled["ic"] <= 1 and pooled["ic_se"] > 0 and pooled["crps"] > 0
    assert "skipped" in written["strategy"] or "sharpe" in written["strategy"]
    report = (out / "backtest_report.md").read_text()
    assert "### Per instrument" in report
    assert "| metric | fold 0 | fold 1 | fold 2 | pooled |" in report
    assert f"| val_loss | {fold_summaries[0]['metrics']['val_loss']:.4g} |" in report
    for own in fold_summaries:
        assert own["splits"]["cuts"]["test_start"] in report


@pytest.mark.slow  # 6 CPU-s: the full tier
def test_a_name_listed_in_the_last_fold_is_forecast_and_scored_apart(tmp_path):
    """NEW lists at bar 700 of 750, in the last fold's test period: that fold forecasts it
    through the unseen row and its summary scores it apart (#60)."""
    cols = make_table({"AAA": 750, "BBB": 750, "NEW": 50})
    cols["timestamp"][cols["symbol"] == "NEW"] += 700 * FIVE_MIN
    path = write_table(tmp_path / "listed.parquet", cols)
    overrides = ["backtest.folds=3"]
    cfg = compose_backtest(*tiny_overrides(path, "trainer.max_epochs=1"), *overrides)
    out = tmp_path / "backtest"
    out.mkdir()
    backtest.run(cfg, out, overrides)
    oos = pq.read_table(out / "oos_predictions.parquet")
    new = np.array(oos["instrument"].to_pylist()) == "NEW"
    assert new.any() and set(oos["fold"].to_numpy()[new]) == {2}
    last = json.loads((out / "fold-2" / "summary.json").read_text())
    assert last["metrics"]["unseen"]["names"] == ["NEW"]


@pytest.mark.slow  # 5 CPU-s: the full tier
def test_a_fold_without_its_summary_resumes_and_finished_folds_are_kept(tmp_path, table_path):
    overrides = ["backtest.folds=2"]
    cfg = compose_backtest(*tiny_overrides(table_path), *overrides)
    out = tmp_path / "backtest"
    out.mkdir()
    backtest.run(cfg, out, overrides)
    kept = (out / "fold-0" / "summary.json").read_bytes()
    (out / "fold-1" / "summary.json").unlink()  # as if killed after its last epoch
    (out / "backtest_summary.json").unlink()

    summary = backtest.run(cfg, out, overrides)
    assert (out / "fold-0" / "summary.json").read_bytes() == kept  # not trained again
    resumed = json.loads((out / "fold-1" / "summary.json").read_text())
    last = (out / "fold-1" / "checkpoints" / "last.ckpt").resolve()
    assert resumed["resumed_from"] == str(last) and resumed["epochs"] == 2
    assert [f["fold"] for f in summary["folds"]] == [0, 1]


def _weights(ckpt: str) -> dict[str, torch.Tensor]:
    return read_checkpoint(ckpt)[1]["state_dict"]


@pytest.mark.slow  # 7 CPU-s: the full tier
def test_finetune_starts_each_fold_from_the_previous_fold_s_best_weights(tmp_path, table_path):
    # train(init_weights=): the weights only; a learning rate of ~0 keeps them where they began
    first = train(
        compose_train(*tiny_overrides(table_path, "trainer.max_epochs=1")), tmp_path / "a"
    )
    still = ("trainer.max_epochs=1", "optim.lr=1e-12", "optim.weight_decay=0")
    tuned = train(
        compose_train(*tiny_overrides(table_path, *still)),
        tmp_path / "b",
        init_weights=Path(first["best_checkpoint"]),
    )
    fresh = train(compose_train(*tiny_overrides(table_path, *still)), tmp_path / "c")
    start, end = _weights(first["best_checkpoint"]), _weights(tuned["best_checkpoint"])
    assert all(torch.allclose(start[k], end[k], atol=1e-6) for k in start)
    assert not all(torch.equal(start[k], _weights(fresh["best_checkpoint"])[k]) for k in start)
    # a fresh optimizer and epoch count: one epoch's steps, not the earlier run's on top
    assert tuned["epochs"] == 1 and tuned["global_step"] == first["global_step"]
    assert tuned["initialized_from"] == first["best_checkpoint"]

    overrides = ["backtest.folds=3", "backtest.refit=finetune"]
    cfg = compose_backtest(*tiny_overrides(table_path, "trainer.max_epochs=1"), *overrides)
    summary = backtest.run(cfg, tmp_path / "backtest", overrides)
    folds = summary["folds"]
    best = [
        json.loads((tmp_path / "backtest" / f"fold-{k}" / "summary.json").read_text())[
            "best_checkpoint"
        ]
        for k in range(3)
    ]
    assert [f["initialized_from"] for f in folds] == [None, best[0], best[1]]


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_refused_backtests_are_one_line_and_exit_2(tmp_path, table_path):
    args = tiny_overrides(table_path)
    result = run_cli(
        "-m",
        *args,
        "backtest.refit=finetune",
        "backtest.fold=0,1",
        cwd=tmp_path,
        script="backtest.py",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("error: backtest.refit=finetune starts each fold from")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "multirun").exists()  # refused before any directory

    with pytest.raises(FoxhuntError, match="resume=auto found no earlier backtest with the"):
        backtest.resume_argv([*args, "resume=auto"], root=tmp_path / "outputs")
    assert backtest.resume_argv([*args, "resume=auto_or_new"], root=tmp_path) == [
        *args,
        "resume=auto_or_new",
    ]

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "backtest.json").write_text("{}")  # another backtest's directory
    result = run_cli(*args, f"hydra.run.dir={taken}", cwd=tmp_path, script="backtest.py")
    assert result.returncode == 2
    assert "already holds a run's results (backtest.json)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_killed_backtest_resumes_at_its_fold(tmp_path, table_path):
    args = [*tiny_overrides(table_path, "trainer.max_epochs=3"), "backtest.folds=3"]
    command = [sys.executable, str(ROOT / "scripts" / "backtest.py"), *args]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # fold 0 finishes; fold 1 is killed (no chance to write anything) after its first epoch
    wait_for("outputs/*/*/fold-1/checkpoints/last.ckpt", tmp_path, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    (backtest_dir,) = tmp_path.glob("outputs/*/*")
    finished = (backtest_dir / "fold-0" / "summary.json").read_bytes()
    assert not (backtest_dir / "fold-1" / "summary.json").exists()

    time.sleep(1.1)  # a new backtest would get a new ${now:%H-%M-%S} directory
    result = run_cli(*args, "resume=auto", cwd=tmp_path, script="backtest.py")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"continuing the backtest in {backtest_dir.relative_to(tmp_path)}" in result.stderr
    assert list(tmp_path.glob("outputs/*/*")) == [backtest_dir]
    assert (backtest_dir / "fold-0" / "summary.json").read_bytes() == finished  # not re-run
    resumed = json.loads((backtest_dir / "fold-1" / "summary.json").read_text())
    last = backtest_dir / "fold-1" / "checkpoints" / "last.ckpt"
    assert resumed["resumed_from"] == str(last.resolve()) and resumed["epochs"] == 3
    fresh = json.loads((backtest_dir / "fold-2" / "summary.json").read_text())
    assert fresh["resumed_from"] is None
    summary = printed_summary(result.stdout)  # its file named last
    assert summary == json.loads((backtest_dir / "backtest_summary.json").read_text())
    # before it, the pooled figures for a person, ending with the report's path
    person = result.stdout.strip().splitlines()[-2]
    assert person == f"report: {backtest_dir.resolve() / 'backtest_report.md'}"
    assert [f["fold"] for f in summary["folds"]] == [0, 1, 2]


@pytest.mark.slow
def test_folds_run_as_parallel_jobs_and_are_pooled_at_the_end(tmp_path, table_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *tiny_overrides(table_path, "trainer.max_epochs=1"),
        "backtest.folds=2",
        "backtest.fold=0,1",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        script="backtest.py",
        own_process=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((sweep_dir / "backtest_summary.json").read_text())
    assert summary["folds_missing"] == []
    assert [Path(f["run_dir"]).name for f in summary["folds"]] == ["0", "1"]  # the job dirs
    oos = pq.read_table(sweep_dir / "oos_predictions.parquet")
    assert sorted(set(oos["fold"].to_pylist())) == [0, 1]
    assert (sweep_dir / "backtest_report.md").exists()
    assert (sweep_dir / "sweep_summary.csv").exists()  # the jobs' own table too


def test_an_interrupted_fold_says_how_to_resume_a_backtest(tmp_path, table_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise Interrupted(signal.SIGTERM, tmp_path / "last.ckpt", 1, 7)

    monkeypatch.setattr(backtest, "train", interrupted)
    cfg = compose_backtest(*tiny_overrides(table_path), "backtest.folds=2")
    fold = backtest.plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)[1]
    with pytest.raises(Interrupted) as caught:
        backtest.run_fold(cfg, fold, tmp_path / "fold-1", [])
    # ckpt_path is refused by backtest.py: the hint names only what works
    assert str(caught.value) == (
        f"SIGTERM during epoch 1 after batch 7; wrote {tmp_path / 'last.ckpt'} (resume with "
        "the same command and resume=auto: it continues at this fold)"
    )


@pytest.mark.parametrize("adjust", ["ratio", "difference"])
def test_folds_ending_mid_quarter_see_the_rolls_and_windows_a_file_ending_there_gives(
    tmp_path, adjust
):
    """3-4 listed futures months, folds of 45 days (each ends mid-quarter, its front still
    trading, the later months listed): each fold's rolls are a prefix of the full run's, the
    rolls of the file cut at its end, and its windows are those of that file (difference too:
    its derived inputs are the ratio-adjusted series', so no later roll reaches them)."""
    table = contracts_table(listing()[0])
    full_path = tmp_path / "es.parquet"
    pq.write_table(table, full_path)
    futures = (
        "data.features=ohlcv",
        "data.target=null",
        "data.known_features=[]",
        "data.futures.enabled=true",
        "data.futures.roll.confirm_bars=3",
        f"data.futures.roll.adjust={adjust}",
    )
    cfg = compose_backtest(*tiny_overrides(full_path), *futures, "backtest.folds=4")
    cfg.backtest.test_span = 45
    folds = backtest.plan_folds(timeline(cfg.data), cfg.backtest, cfg.data)
    t = table["timestamp"].cast(pa.int64())
    full = None
    for fold in folds:
        data = ParquetDataModule(backtest.fold_config(cfg, fold).data)
        data.setup()
        full = full or data.rolls
        assert data.rolls == full  # every fold reads the whole file: the full schedule
        cut = tmp_path / f"fold-{fold.index}.parquet"
        pq.write_table(table.filter(pc.less(t, fold.test_end)), cut)
        fold_cfg = backtest.fold_config(cfg, fold).data
        fold_cfg.path = str(cut)
        until = ParquetDataModule(fold_cfg, schema=data.schema)
        until.setup()
        prefix = [r for r in full if r.time_ns < fold.test_end]
        key = [(r.time_ns, r.from_id, r.to_id) for r in prefix]
        assert [(r.time_ns, r.from_id, r.to_id) for r in until.rolls] == key
        np.testing.assert_allclose([r.factor for r in until.rolls], [r.factor for r in prefix])
        held = until.rolls[-1].to_id
        if fold.test_end != NO_CUT:  # mid-quarter: the front held at the cut trades on after it
            trading = pc.and_(pc.equal(table["symbol"], held), pc.greater(t, fold.test_end))
            assert table.filter(trading).num_rows > 0
        for split in SPLITS:
            x, y = data.datasets[split], until.datasets[split]
            assert len(x) == len(y) > 0 and torch.equal(x.starts, y.starts)
            index = list(range(0, len(x), 5))
            bx, by = x.__getitems__(index), y.__getitems__(index)
            for k in bx:
                torch.testing.assert_close(by[k], bx[k], rtol=0, atol=1e-5)
