"""The positive control `ar1` in a file of its own: pytest-xdist runs a file's tests on one
worker (`--dist loadfile`), and a minute of training per file balances the two workers better
than two minutes; see test_controls.py."""

from __future__ import annotations

import pytest

from tests.helpers import check_control


@pytest.mark.slow
def test_the_default_recipe_finds_what_is_planted(tmp_path):
    check_control(tmp_path, "ar1")
