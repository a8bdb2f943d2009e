"""The other positive controls, in a file of their own so that two test workers share them
(pytest-xdist runs a file's tests on one worker): see test_controls.py."""

from __future__ import annotations

import pytest

from tests.helpers import check_control


@pytest.mark.slow
@pytest.mark.parametrize("name", ["static", "ar1"])
def test_the_default_recipe_finds_what_is_planted_too(tmp_path, name):
    check_control(tmp_path, name)


@pytest.mark.slow
def test_the_lazy_path_finds_it_too(tmp_path):
    # the planted column on the disk-backed window store (its windows equal the in-memory
    # path's: tests/data/test_fuzz.py); the signal must survive that path as well
    check_control(tmp_path, "observed", lazy=True)
