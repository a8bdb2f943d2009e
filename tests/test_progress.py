"""Progress of long work: shown on a terminal (step n of N, elapsed, time left), nothing
written elsewhere; wired into the baselines, the report and a backtest's folds."""

from __future__ import annotations

import io
import sys
import time

import pytest
from hydra import compose, initialize_config_dir

from foxhunt.app.backtest import folds as backtest
from foxhunt.config import register_configs
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.evaluation.baselines import fit_baselines
from foxhunt.run.progress import steps
from tests.helpers import CONF, make_table, tiny_overrides, write_table


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, and keeps what was written to it."""

    def isatty(self) -> bool:
        return True


def fake_stderr(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> io.StringIO:
    """sys.stderr as a terminal, or as a log file; set in the test itself (pytest's capture
    sets sys.stderr again between a fixture's setup and the test)."""
    stream = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


on_a_terminal = pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log"])


@on_a_terminal
def test_a_bar_counts_the_steps_on_a_terminal_and_writes_nothing_elsewhere(terminal, monkeypatch):
    stderr = fake_stderr(monkeypatch, terminal)
    seen = []
    for item in steps(["a", "b", "c"], "work", label=str.upper):
        seen.append(item)
        time.sleep(0.15)  # past tqdm's 0.1 s between redraws: each step is drawn
    assert seen == ["a", "b", "c"]  # every item, in order, whatever is shown
    written = stderr.getvalue()
    if not stderr.isatty():
        assert written == ""
        return
    assert "work:  67%" in written and "2/3 [00:00<00:00" in written  # n of N [elapsed<left]
    assert "step/s, C]" in written  # the step under way beside the count
    assert written.endswith("\r")  # and the bar cleared at the end


@on_a_terminal
def test_lines_mode_writes_a_line_as_each_step_starts_and_one_at_the_end(terminal, monkeypatch):
    stderr = fake_stderr(monkeypatch, terminal)
    assert list(steps([7, 8], "backtest", "fold", label=lambda k: f"fold {k}", lines=True)) == [
        7,
        8,
    ]
    lines = stderr.getvalue().splitlines()
    if not stderr.isatty():
        assert lines == []
        return
    assert [line.split(":")[0] for line in lines] == [
        "backtest (fold 7)",
        "backtest (fold 8)",
        "backtest",
    ]
    assert "0/2 [00:00<?" in lines[0] and "1/2 [" in lines[1] and "2/2 [" in lines[2]
    assert "fold/s]" in lines[2] or "s/fold]" in lines[2]


@on_a_terminal
def test_the_baselines_show_their_fits_on_a_terminal(terminal, monkeypatch, data_cfg):
    stderr = fake_stderr(monkeypatch, terminal)
    dm = ParquetDataModule(data_cfg)
    dm.setup()
    fit_baselines(dm.datasets["train"], dm.schema.target_kind, [0.1, 0.5, 0.9])
    written = stderr.getvalue()
    if stderr.isatty():
        assert "baselines: fit:   0%" in written and "/6 [" in written and "lightgbm]" in written
    else:
        assert written == ""


@on_a_terminal
def test_a_backtest_shows_each_fold_as_it_starts(terminal, tmp_path, monkeypatch):
    stderr = fake_stderr(monkeypatch, terminal)
    # the folds themselves (training runs) and the pooling are stubbed: only the loop is shown
    table = write_table(tmp_path / "bars.parquet", make_table({"AAA": 300, "BBB": 300}))
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("backtest", overrides=[*tiny_overrides(table), "backtest.folds=3"])
    started = []

    def run_fold(cfg, fold, fold_dir, overrides, **kwargs) -> dict:
        started.append(fold.index)
        return {"best_checkpoint": str(fold_dir / "best.ckpt")}

    monkeypatch.setattr(backtest, "run_fold", run_fold)
    monkeypatch.setattr(backtest, "summarize", lambda out_dir: {})
    backtest.run(cfg, tmp_path / "backtest", ["backtest.folds=3"])
    assert started == [0, 1, 2]
    lines = stderr.getvalue().splitlines()
    if not stderr.isatty():
        assert lines == []
        return
    assert [line.split(":")[0] for line in lines] == [
        "backtest (fold 0)",
        "backtest (fold 1)",
        "backtest (fold 2)",
        "backtest",
    ]
    assert "3/3 [" in lines[-1]
