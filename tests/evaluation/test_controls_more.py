"""The other positive controls, in a file of their own so that two test workers share them
(pytest-xdist runs a file's tests on one worker): see test_controls.py. The lazy path gives the
in-memory path's windows on a control's panel (tests/data/test_lazy.py), so it needs no
training of its own to find the signal."""

from __future__ import annotations

import pytest

from tests.helpers import check_control


@pytest.mark.slow
@pytest.mark.parametrize("name", ["static", "ar1", "volatility"])
def test_the_default_recipe_finds_what_is_planted_too(tmp_path, name):
    check_control(tmp_path, name)
