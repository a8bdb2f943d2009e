"""Conformal calibration (foxhunt.evaluation.calibration) on panels whose conditional
quantiles are known: CQR repairs a miscalibrated model, ACI follows a volatility shift that a
static interval cannot, and neither looks at an outcome before it is known."""

from __future__ import annotations

import json

import numpy as np
import pytest
from foxhunt_serve.calibration import aci
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from foxhunt.evaluation import calibration as cal

QUANTILES = [0.1, 0.5, 0.9]
Z = norm.ppf(0.9)
H = 4
STEP = 300 * 10**9  # five-minute bars


LEVELS = [0.5, 1.0, 2.0, 3.0]  # each instrument's volatility level, in every period


def panel(rng: np.random.Generator, windows: int, instruments: int, width: float, shift=0.0):
    """A heteroscedastic panel: each instrument its own volatility level and a volatility
    that moves with a per-window factor; the model forecasts the true conditional quantiles
    with intervals `width` times the true width, its median off by `shift` sigmas."""
    names = np.repeat([f"I{k}" for k in range(instruments)], windows)
    level = np.repeat(LEVELS[:instruments], windows)
    sigma = level[:, None] * np.exp(0.5 * rng.standard_normal((len(names), 1))) * np.ones(H)
    sigma = sigma * np.sqrt(np.arange(1, H + 1))  # wider further ahead
    y = sigma * rng.standard_normal(sigma.shape)
    pred = np.stack([-Z * width * sigma, 0 * sigma, Z * width * sigma], -1)
    return pred + shift * sigma[..., None], y, names


def inside(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (pred[..., 0] <= y) & (y <= pred[..., 2])


@pytest.mark.parametrize("width,shift", [(0.6, 0.0), (1.5, 0.0), (1.0, 0.6)])
@pytest.mark.parametrize("seed", range(4))
def test_cqr_brings_every_horizon_s_coverage_within_2_points_of_nominal(width, shift, seed):
    rng = np.random.default_rng(seed)
    pred_c, y_c, names_c = panel(rng, 1500, 4, width, shift)
    pred_t, y_t, names_t = panel(rng, 6000, 4, width, shift)
    before = inside(pred_t, y_t).mean(axis=0)
    assert (np.abs(before - 0.8) > 0.03).all()  # miscalibrated at every horizon
    fitted = cal.fit(pred_c, y_c, names_c, QUANTILES)
    after = inside(fitted.apply(pred_t, names_t), y_t).mean(axis=0)
    assert np.abs(after - 0.8).max() < 0.02, after
    # the median is left alone, and an interval too wide shrinks
    np.testing.assert_array_equal(fitted.apply(pred_t, names_t)[..., 1], pred_t[..., 1])
    assert (fitted.offsets[cal.POOLED] < 0).all() == (width > 1)


def test_cqr_s_offset_is_the_finite_sample_quantile_of_the_scores():
    pred = np.zeros((10, 1, 3))
    y = np.arange(1.0, 11.0)[:, None]  # scores max(0 - y, y - 0) = 1 .. 10
    fitted = cal.fit(pred, y, np.array(["A"] * 10), QUANTILES, per_instrument=False)
    # ceil(0.8 * (10 + 1)) = 9: the 9th smallest score, not the empirical 80% quantile (8)
    assert fitted.offsets[cal.POOLED].tolist() == [[9.0]]


def test_instruments_with_enough_windows_get_their_own_offsets():
    rng = np.random.default_rng(0)
    calm, *_ = panel(rng, 1, 1, 1.0)
    pred = np.zeros((700, 1, 3)) + [-1.0, 0.0, 1.0]
    y = np.concatenate([0.5 * rng.standard_normal(400), 4 * rng.standard_normal(300)])[:, None]
    names = np.array(["calm"] * 400 + ["wild"] * 300)
    fitted = cal.fit(pred, y, names, QUANTILES, min_windows=350)
    assert set(fitted.offsets) == {cal.POOLED, "calm"}  # wild has 300 < 350
    assert fitted.offsets["calm"][0, 0] < 0 < fitted.offsets[cal.POOLED][0, 0]
    assert fitted.key("wild") == fitted.key("unknown") == cal.POOLED


def shifted_panel(gamma: float, seed: int = 0):
    """One instrument: calibrated in the validation period, then volatility 2.5x halfway
    through the test windows."""
    rng = np.random.default_rng(seed)
    n = 4000
    sigma = np.ones((n, H))
    sigma[n // 2 :] = 2.5
    pred = np.zeros((n, H, 3)) + [-Z, 0.0, Z]
    y = sigma * rng.standard_normal((n, H))
    pred_c = np.zeros((2000, H, 3)) + [-Z, 0.0, Z]
    y_c = rng.standard_normal((2000, H))
    fitted = cal.fit(pred_c, y_c, np.array(["A"] * 2000), QUANTILES, gamma=gamma)
    origin = np.arange(n) * STEP
    target = origin[:, None] + STEP * np.arange(1, H + 1)
    return fitted, pred, y, origin, target


def test_aci_keeps_the_running_coverage_near_nominal_through_a_volatility_shift():
    fitted, pred, y, origin, target = shifted_panel(gamma=0.02)
    names = np.array(["A"] * len(y))
    static = inside(fitted.apply(pred, names), y)
    adaptive = inside(fitted.apply(pred, names, y, origin, target, method="aci"), y)
    running = {
        k: np.cumsum(v, axis=0) / np.arange(1, len(y) + 1)[:, None]
        for k, v in (("static", static), ("aci", adaptive))
    }
    burn_in = 300
    assert running["static"][-1].max() < 0.70  # the static interval drifts away
    assert np.abs(running["aci"][burn_in:] - 0.8).max() < 0.03
    # after the shift, over the last quarter alone too
    assert np.abs(adaptive[-1000:].mean(axis=0) - 0.8).max() < 0.03


def test_aci_uses_no_outcome_before_its_target_time():
    fitted, pred, y, origin, target = shifted_panel(gamma=0.05)
    names = np.array(["A"] * len(y))
    full = fitted.apply(pred, names, y, origin, target, method="aci")
    t0 = 2500
    later = y.copy()
    later[target > origin[t0]] *= 10  # every outcome not yet known at window t0's origin
    changed = fitted.apply(pred, names, later, origin, target, method="aci")
    np.testing.assert_array_equal(changed[: t0 + 1], full[: t0 + 1])
    assert not np.array_equal(changed[t0 + 1 :], full[t0 + 1 :])
    # unknown outcomes (NaN: not realized in the data) move nothing
    unknown = y.copy()
    unknown[t0:] = np.nan
    np.testing.assert_array_equal(
        fitted.apply(pred, names, unknown, origin, target, method="aci")[: t0 + 1], full[: t0 + 1]
    )


def one_at_a_time(pred, y, origin, target, c: dict, key: str) -> np.ndarray:
    """ACI along one instrument's windows, one window at a time: the definition the panel's
    lockstep recursion (`foxhunt_serve.calibration.aci`) must equal."""
    q, pairs, levels = c["quantiles"], c["pairs"], c["grid_levels"]
    alpha = np.array([1 - (q[j] - q[i]) for i, j in pairs])
    grid, n_cal = np.asarray(c["grids"][key]), max(c["windows"][key], 1)
    n, h = y.shape
    off = np.empty((n, h, len(pairs)))
    for t in range(n):
        for s in range(h):
            known = min(np.searchsorted(target[:, s], origin[t], side="right"), t)
            gained = np.zeros(len(pairs))
            for u in range(known):
                if np.isfinite(y[u, s]):
                    for k, (i, j) in enumerate(pairs):
                        inside = (
                            pred[u, s, i] - off[u, s, k] <= y[u, s] <= pred[u, s, j] + off[u, s, k]
                        )
                        gained[k] += alpha[k] - (not inside)
            level = 1 - (alpha + c["gamma"] * gained)
            x = np.clip(level * (n_cal + 1) / n_cal, 0, 1) * (levels - 1)
            i = np.minimum(x.astype(np.int64), levels - 2)
            frac = x - i
            k = np.arange(len(pairs))
            off[t, s] = grid[i, s, k] * (1 - frac) + grid[i + 1, s, k] * frac
    return off


def test_aci_on_a_panel_equals_each_instrument_one_window_at_a_time():
    """Names of different lengths, interleaved and unsorted, some with their own offsets and
    some on the pooled ones, a few outcomes unknown: every name's offsets are its own
    recursion's, window by window."""
    rng = np.random.default_rng(3)
    pred_c, y_c, names_c = panel(rng, 300, 4, 0.8)
    fitted = cal.fit(pred_c, y_c, names_c, QUANTILES, min_windows=250, gamma=0.05)
    lengths = {"I0": 90, "I1": 40, "I2": 65, "new": 25}  # "new": unseen, the pooled offsets
    names = np.concatenate([[n] * k for n, k in lengths.items()])
    origin = np.concatenate([np.arange(k) * STEP for k in lengths.values()])
    order = rng.permutation(len(names))
    names, origin = names[order], origin[order]
    target = origin[:, None] + STEP * np.arange(1, H + 1)
    pred, y, _ = panel(rng, len(names), 1, 0.8)
    y[rng.random(y.shape) < 0.05] = np.nan
    got = fitted.apply(pred, names, y, origin, target, method="aci")
    c = fitted.to_dict()
    for name in lengths:
        rows = np.flatnonzero(names == name)
        rows = rows[np.argsort(origin[rows])]
        off = one_at_a_time(pred[rows], y[rows], origin[rows], target[rows], c, fitted.key(name))
        lo_hi = pred[rows].copy()
        lo_hi[..., 0] -= off[..., 0]
        lo_hi[..., 2] += off[..., 0]
        want = cal.in_order(lo_hi, QUANTILES)
        np.testing.assert_allclose(got[rows], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.005, 0.05])
def test_aci_resumed_from_its_stored_state_is_the_run_straight_through(gamma):
    """ACI's state at a time (each name's adapted miscoverage, the outcomes it counted, the
    offsets of windows with a step after it), through JSON as model.json carries it, then the
    windows with a step after that time: every later window's quantiles are the straight run's
    (#68: predict and the consumer forecast those windows alone)."""
    rng = np.random.default_rng(4)
    pred_c, y_c, names_c = panel(rng, 300, 3, 0.8)
    fitted = cal.fit(pred_c, y_c, names_c, QUANTILES, "aci", gamma=gamma, min_windows=250)
    lengths = {"I0": 900, "I1": 600, "I2": 750}  # I2 on the pooled offsets (its own: none)
    names = np.concatenate([[n] * k for n, k in lengths.items()])
    origin = np.concatenate([np.arange(1000 - k, 1000) * STEP for k in lengths.values()])
    target = origin[:, None] + STEP * np.arange(1, H + 1)
    pred, y, _ = panel(rng, len(names), 1, 0.7)  # too narrow: ACI widens them
    straight = fitted.apply(pred, names, y, origin, target, method="aci")
    cut = 700 * STEP  # the state's time: outcomes known then
    then = origin <= cut
    fitted.state = json.loads(
        json.dumps(
            cal.adapted_state(
                pred[then], vars(fitted) | {"grid_levels": cal.GRID}, names[then],
                np.where(target[then] <= cut, y[then], np.nan), origin[then], target[then],
            )
        )
    )  # fmt: skip
    assert set(fitted.state) == {"I0", "I1", "I2", cal.POOLED}
    assert all(min(fitted.state[n]["seen_ns"]) == cut for n in lengths)
    later = target[:, -1] > cut  # the windows predict replays
    resumed = fitted.apply(
        pred[later], names[later], y[later], origin[later], target[later], "aci", resume=True
    )
    after = origin[later] > cut
    np.testing.assert_allclose(resumed[after], straight[later][after], rtol=0, atol=1e-12)
    # without the state: from the nominal level, which the straight run had long left
    fresh = fitted.apply(pred[later], names[later], y[later], origin[later], target[later], "aci")
    assert np.abs(fresh[after] - straight[later][after]).max() > 0.01


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-50, 50), min_size=5, max_size=5),
    st.lists(st.floats(-20, 20), min_size=2, max_size=2),
)
def test_calibrated_quantiles_never_cross_and_keep_the_median(values, offsets):
    quantiles = [0.05, 0.25, 0.5, 0.75, 0.95]
    pred = np.asarray(values, dtype=np.float64).reshape(1, 1, 5)
    fitted = cal.Calibration(
        "cqr",
        quantiles,
        cal.pairs_of(quantiles),
        {cal.POOLED: np.asarray(offsets).reshape(1, 2)},
        {},
        {cal.POOLED: 10},
    )
    out = fitted.apply(pred, np.array(["A"]))
    assert (np.diff(out, axis=-1) >= 0).all()
    if values == sorted(values):
        assert out[0, 0, 2] == values[2]


def test_a_calibration_survives_json():
    rng = np.random.default_rng(1)
    pred, y, names = panel(rng, 300, 2, 0.8)
    fitted = cal.fit(pred, y, names, QUANTILES, method="aci", gamma=0.01, min_windows=100)
    back = cal.Calibration.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert back.method == "aci" and back.gamma == 0.01 and set(back.offsets) == set(fitted.offsets)
    np.testing.assert_allclose(back.apply(pred, names), fitted.apply(pred, names), atol=1e-8)
    assert cal.Calibration.from_dict(None) is None


def test_the_comparison_says_whether_calibration_helped():
    rng = np.random.default_rng(2)
    pred_c, y_c, names_c = panel(rng, 2000, 2, 1.6)
    pred, y, names = panel(rng, 3000, 2, 1.6)
    fitted = cal.fit(pred_c, y_c, names_c, QUANTILES)
    found = cal.compare(pred, {"cqr": fitted.apply(pred, names)}, y, QUANTILES, names)
    before, after = found["before"]["intervals"][0], found["methods"]["cqr"]["intervals"][0]
    assert before["coverage"] > 0.9 and abs(after["coverage"] - 0.8) < 0.02
    assert after["width"] < before["width"]
    assert found["methods"]["cqr"]["verdict"] == "better"
    assert set(after["coverage_by_instrument"]) == {"I0", "I1"}
    # a calibration that makes things worse says so
    worse = pred.copy()
    worse[..., 0] -= 5
    worse[..., 2] += 5
    assert cal.compare(pred, {"x": worse}, y, QUANTILES, names)["methods"]["x"]["verdict"] == (
        "worse"
    )


@settings(max_examples=12, deadline=None)
@given(st.floats(-0.2, 0.2), st.sampled_from([0.005, 0.05]), st.integers(0, 2**32 - 1))
def test_aci_from_another_start_never_strays_further_and_forgets_it(shift, gamma, seed):
    """Two ACI walks over the same windows and outcomes from levels `shift` apart (a replay of
    the whole file, and the run's ACI that began at the test split from the nominal level,
    where predict resumes: #68). A lower miscoverage is a wider interval, which misses no more
    often, so the gap in each name's level never grows past the start's, give or take gamma
    for each outcome in flight (H a window); after 5 / gamma windows little of it is left."""
    rng = np.random.default_rng(seed)
    pred_c, y_c, names_c = panel(rng, 300, 2, 1.0)
    fitted = cal.fit(pred_c, y_c, names_c, QUANTILES, "aci", gamma=gamma, min_windows=100)
    windows = int(5 / gamma)
    names = np.repeat(["I0", "I1"], windows)
    origin = np.tile(np.arange(windows) * STEP, 2)
    target = origin[:, None] + STEP * np.arange(1, H + 1)
    pred, y, _ = panel(rng, len(names), 1, 1.0)
    c, key = vars(fitted) | {"grid_levels": cal.GRID}, {n: fitted.key(n) for n in ("I0", "I1")}
    start = np.clip(fitted.alphas + shift, 0, 1).tolist()
    seen = [int(origin.min())] * H  # no outcome counted yet
    states = {n: {"miscoverage": [start] * H, "seen_ns": seen, "pending": {}} for n in ("I0", "I1")}
    plain = aci(pred, y, names, origin, target, c, key)[1]
    shifted = aci(pred, y, names, origin, target, c, key, states)[1]
    gap = np.abs(
        np.subtract(*(np.array([s[n]["miscoverage"] for n in key]) for s in (plain, shifted)))
    )
    assert gap.max() <= max(abs(shift), gamma * H) + 1e-12
    assert gap.mean() <= 0.25 * abs(shift) + gamma * H
