"""The benchmarks' synthetic panels: reproducible, with the scale the docstrings promise."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt.data.samples.synthetic import ar1, synthetic_panel


def test_panel_columns_and_reproducibility():
    a = synthetic_panel(["s0", "s1"], 50, 3, seed=7)
    assert list(a) == ["time", "series", "target", "f0", "f1", "f2"]
    assert a["time"].tolist() == [*range(50), *range(50)]
    assert a["series"].tolist() == ["s0"] * 50 + ["s1"] * 50
    assert a["target"].dtype == a["f0"].dtype == np.float32
    b = synthetic_panel(["s0", "s1"], 50, 3, seed=7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["target"], synthetic_panel(["s0", "s1"], 50, 3, seed=8)["target"])


def test_ar1_has_unit_variance_and_phi_one_is_a_random_walk():
    x = ar1(np.random.default_rng(0), 50_000, phi=0.9)
    assert x.std() == pytest.approx(1, abs=0.05)
    assert np.corrcoef(x[1:], x[:-1])[0, 1] == pytest.approx(0.9, abs=0.01)
    walk = ar1(np.random.default_rng(0), 50_000, phi=1.0)
    assert np.diff(walk).std() == pytest.approx(1, abs=0.02)
    with pytest.raises(ValueError, match="phi"):
        ar1(np.random.default_rng(0), 10, phi=1.5)
