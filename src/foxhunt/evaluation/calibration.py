"""Calibrated quantile forecasts: conformalized quantile regression, adaptive conformal
inference for drift, and quantiles that never cross. Pure: arrays in, arrays out; the training
run fits a `Calibration` on its validation forecasts and every consumer (the test evaluation,
`foxhunt.load`, the backtest's folds, the ONNX example) applies it.

- **Pairs.** Each quantile level q < 0.5 whose partner 1 - q is also forecast makes a central
  interval of nominal coverage 1 - alpha = (1 - q) - q. The median and unpaired levels are left
  as the model gives them.
- **CQR** (Romano, Patterson and Candes 2019). On the n calibration windows of a pair and a
  horizon step, the conformity score of a window is E = max(lo - y, y - hi): how far the outcome
  fell outside the interval (negative inside). The calibrated interval is [lo - Q, hi + Q], Q the
  ceil((1 - alpha)(n + 1))-th smallest score (the finite-sample correction): it covers a new
  exchangeable outcome with probability at least 1 - alpha, and shrinks (Q < 0) an interval that
  was too wide. Per instrument where it has `min_windows` calibration windows, pooled otherwise.
- **ACI** (Gibbs and Candes 2021). Walking an instrument's windows in time order, the level of
  each pair and step moves after every realized outcome: alpha_t+1 = alpha_t + gamma (alpha -
  err_t), err_t = 1 when the outcome fell outside the interval issued at alpha_t, and the offset
  is the scores' quantile at 1 - alpha_t (with the same finite-sample factor, so the walk starts
  at CQR's offset). An outcome counts from the first forecast whose origin is at or after its
  target time: never before it is known. Levels beyond [0, 1] use the smallest or largest score.
- **No crossing.** After the offsets, the lower quantiles are capped at the median and the upper
  ones floored at it, then every step's quantiles are sorted: the rearrangement of Chernozhukov,
  Fernandez-Val and Galichon (2010). Sorting never raises the pinball loss: swapping a crossed
  pair a > b at levels t1 < t2 lowers the summed loss by (t2 - t1)(a - b) for every outcome.
  The model's own quantiles are in order by construction (`foxhunt.models.blocks.
  MonotoneQuantiles`); models trained before it are sorted here.

Offsets are in the normalized units the model forecasts in (times the target's scale in its
own units)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from foxhunt_serve import POOLED, adapted_state, calibrate, in_order

from foxhunt.evaluation import stats
from foxhunt.evaluation.forecasts import RAW_PREFIX, quantile_column, target_column, window_facts

GRID = 101  # levels at which a fit keeps the scores' quantile function, for ACI
METHODS = ("none", "cqr", "aci")


def pairs_of(quantiles: list[float]) -> list[tuple[int, int]]:
    """(lower, upper) indices of the symmetric levels (q, 1 - q), q < 0.5, outermost first."""
    q = [float(x) for x in quantiles]
    found = []
    for i, lo in enumerate(q):
        if lo >= 0.5:
            break
        j = next((j for j, hi in enumerate(q) if abs(hi - (1 - lo)) < 1e-6), None)
        if j is not None:
            found.append((i, j))
    return found


def crossing_rate(pred: np.ndarray) -> float:
    """The share of forecast steps [..., Q] whose quantiles are not in order."""
    pred = np.asarray(pred)
    if pred.size == 0:
        return 0.0
    return float((np.diff(pred, axis=-1) < 0).any(axis=-1).mean())


def scores(pred: np.ndarray, y: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """[n, H, P] CQR's conformity scores max(lo - y, y - hi) of pred [n, H, Q], y [n, H]."""
    lo = pred[..., [i for i, _ in pairs]]
    hi = pred[..., [j for _, j in pairs]]
    return np.maximum(lo - y[..., None], y[..., None] - hi)


@dataclass
class Calibration:
    """Offsets per instrument (or POOLED), horizon step and pair, and how to apply them."""

    method: str
    quantiles: list[float]
    pairs: list[tuple[int, int]]
    offsets: dict[str, np.ndarray]  # key -> [H, P]: CQR's static offsets
    grids: dict[str, np.ndarray]  # key -> [GRID, H, P]: the scores' quantiles at linspace(0, 1)
    windows: dict[str, int]  # key -> calibration windows it was fitted on
    gamma: float = 0.005
    fitted_on: str = "validation"
    # ACI's state at the test period's end, by name (`foxhunt_serve.calibration.adapted`):
    # where predict and the consumer resume for the latest windows (#68)
    state: dict[str, Any] | None = None

    @property
    def alphas(self) -> np.ndarray:
        """[P] each pair's nominal miscoverage."""
        q = self.quantiles
        return np.array([1 - (q[j] - q[i]) for i, j in self.pairs])

    def key(self, name: Any) -> str:
        return str(name) if str(name) in self.offsets and name is not None else POOLED

    def apply(
        self,
        pred: np.ndarray,
        instrument: np.ndarray,
        actual: np.ndarray | None = None,
        origin_ns: np.ndarray | None = None,
        target_ns: np.ndarray | None = None,
        method: str | None = None,
        resume: bool = False,
    ) -> np.ndarray:
        """pred [n, H, Q] (normalized) calibrated by `method` (default the fit's): none (only
        put in order), cqr (the static offsets) or aci (adapted to each realized outcome in
        `actual` [n, H], NaN where unknown, by `origin_ns` [n] and `target_ns` [n, H];
        `resume`: from the stored state); the serving core's `apply`, which predict and the
        ONNX consumer share."""
        cal = {**vars(self), "grid_levels": GRID}
        return calibrate(
            pred, cal, self.quantiles, instrument, actual, origin_ns, target_ns, method, resume
        )

    # --- storing -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able containers (a checkpoint's `calibration`, model.json's)."""
        return {
            "method": self.method,
            "quantiles": list(self.quantiles),
            "pairs": [list(p) for p in self.pairs],
            "gamma": self.gamma,
            "fitted_on": self.fitted_on,
            "units": "normalized (times target.std in the target's units)",
            "windows": dict(self.windows),
            "offsets": {k: _listed(v) for k, v in self.offsets.items()},
            "grid_levels": GRID,
            "grids": {k: _listed(v) for k, v in self.grids.items()},
            **({"state": self.state} if self.state else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Calibration | None:
        if not d:
            return None
        return cls(
            method=d["method"],
            quantiles=[float(q) for q in d["quantiles"]],
            pairs=[(int(i), int(j)) for i, j in d["pairs"]],
            offsets={k: np.asarray(v, np.float64) for k, v in d["offsets"].items()},
            grids={k: np.asarray(v, np.float64) for k, v in d["grids"].items()},
            windows={k: int(v) for k, v in d["windows"].items()},
            gamma=float(d["gamma"]),
            fitted_on=d.get("fitted_on", "validation"),
            state=d.get("state"),
        )


def _listed(a: np.ndarray) -> list:
    return np.asarray(a, np.float64).tolist()


def fit(
    pred: np.ndarray,
    y: np.ndarray,
    instrument: np.ndarray,
    quantiles: list[float],
    method: str = "cqr",
    gamma: float = 0.005,
    per_instrument: bool = True,
    min_windows: int = 200,
) -> Calibration:
    """CQR's offsets from calibration forecasts pred [n, H, Q] (the model's, put in order) of
    y [n, H] (normalized), pooled and, with `per_instrument`, for each instrument with at
    least `min_windows` windows."""
    if method not in METHODS:
        raise ValueError(f"calibration method {method!r} is none, cqr or aci")
    pairs = pairs_of(quantiles)
    cal = Calibration(method, [float(q) for q in quantiles], pairs, {}, {}, {}, gamma)
    if not pairs or len(pred) == 0:
        return cal
    e = scores(in_order(pred, quantiles), y, pairs)
    names = np.asarray([str(x) for x in instrument], dtype=object)
    groups = {POOLED: np.arange(len(e))}
    if per_instrument:
        for name in dict.fromkeys(names):
            rows = np.flatnonzero(names == name)
            if len(rows) >= min_windows and len(rows) < len(e):
                groups[name] = rows
    for key, rows in groups.items():
        part = np.sort(e[rows], axis=0)  # [n, H, P]
        n = len(rows)
        k = np.array([min(math.ceil((1 - a) * (n + 1)), n) for a in cal.alphas])  # [P]
        cal.offsets[key] = part[k - 1, :, np.arange(len(pairs))].T  # [H, P]
        cal.grids[key] = np.quantile(part, np.linspace(0, 1, GRID), axis=0, method="inverted_cdf")
        cal.windows[key] = n
    return cal


# --- what calibration changed ----------------------------------------------------------------


def figures(
    pred: np.ndarray, y: np.ndarray, quantiles: list[float], instrument: np.ndarray
) -> dict[str, Any]:
    """Coverage of each central interval per horizon step and per instrument, its mean width,
    and the pinball loss, CRPS and Winkler score of the outer interval; pred [n, H, Q] and
    y [n, H] in the same (normalized) units."""
    q = np.asarray(quantiles, dtype=np.float64)
    pairs = pairs_of(quantiles)
    names = np.asarray([str(x) for x in instrument], dtype=object)
    out: dict[str, Any] = {
        "pinball": float(stats.pinball_per_quantile(pred, y, q).mean()) if len(y) else None,
        "crps": stats.crps_from_quantiles(pred, y, q) if len(y) else None,
        # the calibration curve: the observed share at or below each quantile forecast
        "share_below": stats.coverage(pred.reshape(-1, len(q)), y.ravel()).tolist(),
    }
    intervals = []
    for i, j in pairs:
        inside = (pred[..., i] <= y) & (y <= pred[..., j])
        width = pred[..., j] - pred[..., i]
        alpha = 1 - (q[j] - q[i])
        intervals.append(
            {
                "levels": [float(q[i]), float(q[j])],
                "nominal": round(1 - alpha, 9),
                "coverage": float(inside.mean()),
                "coverage_by_horizon": inside.mean(axis=0).tolist(),
                "coverage_by_instrument": {
                    n: float(inside[names == n].mean()) for n in dict.fromkeys(names)
                },
                "width": float(width.mean()),
                "winkler": stats.winkler_score(pred[..., i], pred[..., j], y, alpha),
            }
        )
    out["intervals"] = intervals
    out["crossing_rate"] = crossing_rate(pred)
    return out


def compare(
    raw: np.ndarray,
    calibrated: dict[str, np.ndarray],
    y: np.ndarray,
    quantiles: list[float],
    instrument: np.ndarray,
) -> dict[str, Any]:
    """`figures` of the model's own forecasts (`before`: put in order, uncalibrated) and of
    each method's (`methods`), and for each method whether it brought the outer interval's
    coverage nearer its nominal level without a worse pinball loss (`verdict`)."""
    before = figures(in_order(raw, quantiles), y, quantiles, instrument)
    out: dict[str, Any] = {"before": before, "methods": {}}
    for name, pred in calibrated.items():
        after = figures(pred, y, quantiles, instrument)
        out["methods"][name] = after | {"verdict": verdict(before, after)}
    return out


def verdict(before: dict[str, Any], after: dict[str, Any]) -> str:
    """`better`, `worse` or `mixed`: the outer interval's coverage error and the pinball loss."""
    if not before["intervals"] or before["pinball"] is None:
        return "mixed"
    b, a = before["intervals"][0], after["intervals"][0]
    nearer = abs(a["coverage"] - a["nominal"]) <= abs(b["coverage"] - b["nominal"])
    sharper = after["pinball"] <= before["pinball"] * (1 + 1e-9)
    if nearer and sharper:
        return "better"
    if not nearer and not sharper:
        return "worse"
    return "mixed"


def calibration_set(datasets: dict[str, Any]) -> str:
    """The dataset a calibration is fit on: data.calibration_share's windows, held out of
    validation (not chosen on), else the validation windows themselves."""
    return "calibration" if "calibration" in datasets else "val"


def calibrate_run(
    settings: Any,
    datasets: dict[str, Any],
    schema: Any,
    val_pred: np.ndarray,
    test_pred: np.ndarray,
    quantiles: list[float],
) -> tuple[Calibration, np.ndarray, dict[str, Any]]:
    """A training run's calibration: fitted on the forecasts `val_pred` of the calibration
    windows (data.calibration_share's, held out of validation; else the validation windows),
    applied to the test windows' `test_pred` (ACI walking them in time order). Returns the
    calibration, the test forecasts it delivers and summary.json's `calibration` (each method's
    figures beside the model's own, whichever `settings.method` chose)."""
    held_out = calibration_set(datasets)
    fitted_on = "calibration" if held_out == "calibration" else "validation"
    val = window_facts(datasets[held_out], schema)
    test = window_facts(datasets["test"], schema)
    cal = fit(
        val_pred,
        val.actual,
        val.instrument,
        quantiles,
        str(settings.method),
        float(settings.gamma),
        bool(settings.per_instrument),
        int(settings.min_windows),
    )
    cal.fitted_on = fitted_on
    every = {
        m: cal.apply(test_pred, test.instrument, test.actual, test.origin_ns, test.target_ns, m)
        for m in ("cqr", "aci")
        if cal.offsets
    }
    if cal.method == "aci" and cal.offsets:  # where predict and the consumer resume
        cal.state = adapted_state(
            test_pred, {**vars(cal), "grid_levels": GRID}, test.instrument, test.actual,
            test.origin_ns, test.target_ns,
        )  # fmt: skip
    found = compare(test_pred, every, test.actual, quantiles, test.instrument)
    pred = every.get(cal.method, in_order(test_pred, quantiles))
    chosen = found["methods"].get(cal.method)
    summary = {
        "method": cal.method if cal.offsets else "none",
        "gamma": cal.gamma,
        "fitted_on": fitted_on,
        "calibration_windows": cal.windows.get(POOLED, 0),
        "own_offsets": sorted(k for k in cal.offsets if k != POOLED),
        "offsets_by_horizon": cal.offsets[POOLED].tolist() if cal.offsets else None,
        "crossing_rate": crossing_rate(pred),
        "before": found["before"],
        "after": chosen or found["before"],
        "verdict": chosen["verdict"] if chosen else None,
        "methods": found["methods"],
    }
    if not cal.offsets:
        cal.method = "none"
        summary["skipped"] = "no validation windows with a pair of quantiles to calibrate on"
    return cal, pred, summary


def table_calibration(table: pa.Table, quantiles: list[float], method: str) -> dict | None:
    """summary.json's `calibration` (before, after, verdict) of a forecast table with the
    model's own quantiles beside the delivered ones (`raw_q<level>`, a backtest's pooled
    folds); None for a table without them (folds run before calibration)."""
    raw_columns = [RAW_PREFIX + quantile_column(q) for q in quantiles]
    if table.num_rows == 0 or not set(raw_columns) <= set(table.column_names):
        return None
    h = int(pc.max(table["horizon"]).as_py())

    def column(name: str) -> np.ndarray:
        return table[name].to_numpy(zero_copy_only=False).reshape(-1, h)

    scale = column("target_scale")
    raw = np.stack([column(c) for c in raw_columns], axis=-1) / scale[..., None]
    delivered = np.stack([column(quantile_column(q)) for q in quantiles], -1) / scale[..., None]
    names = column("instrument")[:, 0]
    actual = column(target_column(table)) / scale  # the model's target, as the quantiles
    found = compare(raw, {method: delivered}, actual, quantiles, names)
    after = found["methods"][method]
    return {
        "method": method,
        "before": found["before"],
        "after": after,
        "verdict": after["verdict"],
    }
