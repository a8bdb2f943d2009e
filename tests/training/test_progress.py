"""Lightning's progress bar on a terminal, one line per epoch elsewhere
(`foxhunt.training.epoch_lines`); the lines themselves: tests/test_commands.py's tiny run."""

from __future__ import annotations

import io

import pytest
from lightning.pytorch.callbacks import TQDMProgressBar
from omegaconf import OmegaConf

from foxhunt.training.epoch_lines import EpochLines, epoch_lines


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stdout", "setting", "configured", "expected"),
    [
        (io.StringIO(), {}, [], [EpochLines]),  # a file or a pipe: a line per epoch
        (io.StringIO(), {"enable_progress_bar": None}, [], [EpochLines]),
        (Terminal(), {}, [], []),  # Lightning's own bar
        (io.StringIO(), {"enable_progress_bar": False}, [], []),  # neither
        (io.StringIO(), {}, [TQDMProgressBar()], []),  # the user's bar
    ],
)
def test_a_line_per_epoch_only_where_lightning_would_draw_its_bar_into_a_file(
    monkeypatch, stdout, setting, configured, expected
):
    monkeypatch.setattr("sys.stdout", stdout)
    chosen = epoch_lines(OmegaConf.create(setting), configured)
    assert [type(c) for c in chosen] == expected
