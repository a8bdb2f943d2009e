"""model.compile: auto is each device's measured default; true, false and torch.compile's modes
are what they say."""

from __future__ import annotations

import pytest

from foxhunt.training import module
from foxhunt.training.module import compile_mode


def test_auto_is_the_measured_default_of_the_device(monkeypatch):
    # measured on CPU: eager (docs/performance.md); CUDA: eager until gpu_check measures it
    assert compile_mode("auto", "cpu") is None
    monkeypatch.setitem(module.COMPILE_BY_DEVICE, "cuda", "reduce-overhead")
    assert compile_mode("auto", "cuda") == "reduce-overhead"
    assert compile_mode("auto", "mps") is None  # a device not measured runs eagerly


@pytest.mark.parametrize(
    "setting, mode",
    [(True, "default"), (False, None), (None, None), ("max-autotune", "max-autotune")],
)
def test_explicit_settings_win_over_the_device(setting, mode):
    assert compile_mode(setting, "cpu") == compile_mode(setting, "cuda") == mode
