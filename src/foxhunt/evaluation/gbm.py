"""The LightGBM baseline, fit as a quant fits one in an afternoon (issue #67): on every training
window, early-stopped on the validation windows, with the features a practitioner derives
from a window and, on a panel, each feature's rank among the names at its date.

The recipe:

- Features of a window (`window_features`): the encoder's last row (every input the TFT
  sees), the target's moves in the data's units (each name's scale put back: a quant's raw
  returns, not returns over each name's volatility) summed over the last 1, 2, 3, 5, 10, 20 and
  60 bars (returns, or a level's differences), their standard deviation over 5, 20 and 60 bars
  and the EWMA one, the last value over its moving average at 5, 20 and 60 (from the moves'
  running sum), and the statics. Windows too short for a span leave it out. On a panel, each of
  them also as its rank among the windows of its origin date
  (`foxhunt_serve.cross_section.by_date`, scaled to unit variance); off a panel, the instrument
  as a categorical feature (on a panel it would learn each name's mean, which a quant leaves
  out). One row per window: its features and the known inputs of the step forecast.
- Label: the target's move from the naive reference in the data's units; on a panel, z-scored
  across the names of each date, as a quant's label is, so a market day's move does not drown
  the ranking.
- Fit: a model per horizon step (as a quant fits one per horizon; pooled over the steps with
  the step an input, it ranked worse on drift250, rank IC 0.294 against 0.310 by hand), L2
  boosting at learning rate LEARNING_RATE, up to MAX_ROUNDS rounds, stopped when the
  validation loss has not improved for PATIENCE rounds (the best round kept); leaves and the
  least rows a leaf holds grow with the rows (`tree_params`). No validation windows: a fixed
  NO_VALIDATION_ROUNDS.
- Forecast: the centre, the point forecast mapped onto the move (a line per step, fit by least
  squares on the validation windows: the z-scored label's units back to the data's, then over
  each name's scale: the normalized units every baseline forecasts in), plus
  each window's EWMA volatility times a LightGBM quantile model per level of the standardized
  residual (move - centre) / volatility, on the same rows (at most SPREAD_ROWS of them; the
  time of day among the known inputs moves an intraday spread), early-stopped alike, less the
  median level's: the median is the centre, which alone ranks the names. The quantiles are
  sorted.
- Memory: the rows are float32; past BUDGET_MB of them, whole dates are dropped evenly (the
  windows of one date stay together, so the ranks stay whole), and `subsampled` says so.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from foxhunt_serve import by_date

from foxhunt.config import PANEL_NAMES
from foxhunt.data.windows import WindowDataset
from foxhunt.evaluation.moves import ewma_volatility, gather

SPANS = (1, 2, 3, 5, 10, 20, 60)  # bars the moves are summed over
VOL_SPANS = (5, 20, 60)  # bars of the moves' standard deviation and the moving averages
LEARNING_RATE = 0.03
MAX_ROUNDS = 2_000
PATIENCE = 100  # rounds without a better validation loss before the fit stops
NO_VALIDATION_ROUNDS = 100
ONE_THREAD_ROWS = 100_000
SAY_ROWS = 500_000  # window steps from which the fit says, before it starts, that it takes minutes
SPREAD_ROWS = 300_000  # training rows the residual's quantile models see, at most
# the spread's models: on the ES sample, 15 leaves of at least 200 rows at 0.05 scored the
# validation windows best of five settings (31 leaves of 48 rows at 0.1 worst, 0.6% behind)
SPREAD_LEARNING_RATE = 0.05
SPREAD_ROUNDS = 1_000
SPREAD_PATIENCE = 100
BUDGET_MB = 1_536  # the float32 rows of the training windows, at most (more: dates dropped)
CHUNK = 16_384
log = logging.getLogger(__name__)


def available() -> bool:
    return importlib.util.find_spec("lightgbm") is not None


@dataclass
class Design:
    """What the boosting sees of a dataset's windows."""

    window: np.ndarray  # [n, k] float32 per-window features (their ranks too, on a panel)
    known: np.ndarray  # [n, H, known] float32
    move: np.ndarray  # [n, H] float64, the label before any z-scoring
    sigma: np.ndarray  # [n] EWMA volatility of the encoder's moves
    group: np.ndarray  # [n]
    date: np.ndarray  # [n] dense origin-date indices
    scale: np.ndarray  # [n] the instrument's target scale: a move x it is in the data's units

    def rows(self, panel: bool, step: int | np.ndarray, windows: Any = slice(None)) -> np.ndarray:
        """[windows, features]: the windows' features, the known inputs of `step` (one, or one
        per window) and, off a panel, the instrument last (a categorical input)."""
        w = np.arange(len(self.move))[windows]
        parts = [self.window[w], self.known[w, step]]
        if not panel:
            parts.append(self.group[w].astype(np.float32)[:, None])
        return np.concatenate(parts, axis=1)

    def raw(self, step: int) -> np.ndarray:
        """[n] the move at `step` in the data's units (a return, not a return over its name's
        volatility: what the book and the rank IC by date are judged on)."""
        return self.move[:, step] * self.scale

    def label(self, panel: bool, step: int) -> np.ndarray:
        """[n]: the move at `step` in the data's units, z-scored across each date's names on a
        panel."""
        return by_date(self.raw(step), self.date, "zscore") if panel else self.raw(step)


def window_features(history: np.ndarray, last_step: np.ndarray, static: np.ndarray) -> np.ndarray:
    """[n, k] a window's features from its encoder moves [n, E], last row and statics."""
    e = history.shape[1]
    level = np.cumsum(history, axis=1)  # the running sum of the moves: a log price for returns
    cols = [last_step, static, ewma_volatility(history)[:, None]]
    cols += [history[:, -k:].sum(axis=1, keepdims=True) for k in SPANS if k <= e]
    for k in (k for k in VOL_SPANS if k <= e):
        cols.append(history[:, -k:].std(axis=1, keepdims=True))
        cols.append(level[:, -1:] - level[:, -k:].mean(axis=1, keepdims=True))
    return np.concatenate(cols, axis=1).astype(np.float32)


def design(ds: WindowDataset, indices: np.ndarray, target_kind: str, panel: bool) -> Design:
    """The design of `ds`'s windows `indices` (in order), gathered CHUNK at a time."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("window", "known", "move", "s", "g")}
    origin = []
    scale = ds.series.scale
    for chunk in np.array_split(indices, max(1, -(-len(indices) // CHUNK))):
        w = gather(ds, chunk, target_kind)
        raw = w.history * scale[w.group][:, None]  # the moves in the data's units
        parts["window"].append(window_features(raw, w.last_step, w.static))
        parts["known"].append(w.known.astype(np.float32))
        parts["move"].append(w.move)
        parts["s"].append(ewma_volatility(w.history))
        parts["g"].append(w.group)
        origin.append(w.origin_ns)
    window = np.concatenate(parts["window"])
    date = np.unique(np.concatenate(origin), return_inverse=True)[1].ravel()
    if panel:
        ranks = [
            by_date(window[:, j].astype(np.float64), date, "rank") for j in range(window.shape[1])
        ]
        window = np.concatenate([window, np.column_stack(ranks).astype(np.float32)], axis=1)
    return Design(
        window,
        np.concatenate(parts["known"]),
        np.concatenate(parts["move"]),
        np.concatenate(parts["s"]),
        np.concatenate(parts["g"]),
        date,
        scale[np.concatenate(parts["g"])].astype(np.float64),
    )


def origin_dates(ds: WindowDataset, encoder_last: int) -> np.ndarray:
    """[windows] each window's origin time (int64 ns; the window index where none)."""
    if ds.time_ns is None:
        return np.arange(len(ds), dtype=np.int64)
    return ds.time_ns[ds.starts + encoder_last].numpy()


def is_panel(dates: np.ndarray) -> bool:
    """Whether the median date holds a panel's names (PANEL_NAMES windows): the ranks and the
    z-scored label need them."""
    return bool(len(dates)) and bool(
        np.median(np.unique(dates, return_counts=True)[1]) >= PANEL_NAMES
    )


def by_dates(dates: np.ndarray, at_most: int) -> np.ndarray:
    """The window indices of whole dates, evenly spaced, holding at most `at_most` windows."""
    if len(dates) <= at_most:
        return np.arange(len(dates))
    days, at = np.unique(dates, return_inverse=True)
    keep_every = int(np.ceil(len(dates) / at_most))
    kept = np.zeros(len(days), bool)
    kept[::keep_every] = True
    return np.flatnonzero(kept[at.ravel()])


def tree_params(rows: int, threads: int) -> dict[str, Any]:
    """LightGBM's settings for `rows` training rows: more leaves and larger leaves on more data
    (a quant's 63 leaves of at least 200 rows on a 250-name daily panel's ~200k), and one
    thread for a small fit (LightGBM's advice: threads cost more than they save on little data,
    and on a busy machine OpenMP's spin-waits cost far more)."""
    leaves = 15 if rows < 20_000 else 31 if rows < 100_000 else 63
    threads = 1 if rows < ONE_THREAD_ROWS else threads
    return {
        "objective": "regression",
        "learning_rate": LEARNING_RATE,
        "num_leaves": leaves,
        "min_data_in_leaf": int(np.clip(rows // 1_000, 20, 1_000)),
        "feature_fraction": 0.8,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "lambda_l2": 1.0,
        "deterministic": True,  # with force_row_wise: the same model on every run
        "force_row_wise": True,
        "num_threads": threads,
        "seed": 0,
        "verbose": -1,
    }


def _boost(
    params: dict[str, Any],
    x: np.ndarray,
    y: np.ndarray,
    valid: tuple[np.ndarray, np.ndarray] | None,
    categorical: list[int],
    max_rounds: int,
    patience: int,
) -> tuple[Any, int]:
    """A booster fit on (x, y), early-stopped on `valid` (up to `max_rounds`; without it a
    fixed NO_VALIDATION_ROUNDS), and the round it keeps."""
    import lightgbm

    data = lightgbm.Dataset(x, y, categorical_feature=categorical, free_raw_data=True)
    if valid is None:
        booster = lightgbm.train(params, data, num_boost_round=NO_VALIDATION_ROUNDS)
        return booster, booster.current_iteration()
    held = lightgbm.Dataset(*valid, reference=data)
    stop = lightgbm.early_stopping(patience, verbose=False)
    booster = lightgbm.train(params, data, max_rounds, valid_sets=[held], callbacks=[stop])
    return booster, booster.best_iteration or booster.current_iteration()


def _line(p: np.ndarray, move: np.ndarray) -> tuple[float, float]:
    """The slope and intercept of the least-squares line from `p` [n] to `move` [n]."""
    if not len(p) or p.var() == 0:
        return 1.0, 0.0
    slope = float(np.cov(p, move, bias=True)[0, 1] / p.var())
    return slope, float(move.mean() - slope * p.mean())


@dataclass
class Booster:
    """The fitted baseline: a centre per step, a spread per quantile level."""

    panel: bool
    target_kind: str
    centres: list[tuple[Any, int, tuple[float, float]]]  # (booster, rounds, label -> move line)
    spreads: list[tuple[Any, int]]  # (booster, rounds) per quantile level
    floor: float  # the least EWMA volatility a spread is scaled by
    median: int  # the quantile level nearest 0.5

    @property
    def steps(self) -> int:
        return len(self.centres)

    def centre(self, d: Design) -> np.ndarray:
        """[n, H] the point forecast of the move (normalized: the data's units over the scale)."""
        return (
            np.column_stack(
                [
                    m.predict(d.rows(self.panel, s), num_iteration=r) * a + b
                    for s, (m, r, (a, b)) in enumerate(self.centres)
                ]
            )
            / d.scale[:, None]
        )

    def standardized(self, d: Design) -> np.ndarray:
        """[n, H] the move's distance from the centre in EWMA volatilities."""
        return (d.move - self.centre(d)) / np.maximum(d.sigma, self.floor)[:, None]

    def spread_rows(self, d: Design, pick: np.ndarray) -> np.ndarray:
        """Rows of the (window, step) pairs `pick` (flat indices of [n, H]), the step last."""
        w, step = np.divmod(pick, self.steps)
        return np.column_stack([d.rows(self.panel, step, w), step.astype(np.float32)])

    def forecast(self, ds: WindowDataset) -> np.ndarray:
        """[windows, H, Q] the sorted quantiles of every window's move in `ds`."""
        d = design(ds, np.arange(len(ds)), self.target_kind, self.panel)
        rows = self.spread_rows(d, np.arange(len(d.move) * self.steps))
        z = np.stack([m.predict(rows, num_iteration=r) for m, r in self.spreads], axis=-1)
        sigma = np.maximum(d.sigma, self.floor)[:, None, None]
        z = z.reshape(len(d.move), self.steps, -1)
        if self.panel:  # the median is the centre, which alone ranks the names (the median
            # level's model would move the ranking by its own fitting noise); off a panel the
            # median level's own model places it (the sample's pinball loss 0.2030 -> 0.2024)
            z = z - z[..., [self.median]]
        return np.sort(self.centre(d)[..., None] + sigma * z, axis=-1)


def fit_centres(
    d: Design, v: Design | None, panel: bool, params: dict, categorical: list[int]
) -> list[tuple[Any, int, tuple[float, float]]]:
    """A model per step, as a quant fits one per horizon, early-stopped on its own step's
    validation windows; and the line from its label's units back to the data's (fit on the
    validation windows, out of sample)."""
    out = []
    for step in range(d.move.shape[1]):
        valid = None if v is None else (v.rows(panel, step), v.label(panel, step))
        fit_on = (d.rows(panel, step), d.label(panel, step))
        booster, rounds = _boost(params, *fit_on, valid, categorical, MAX_ROUNDS, PATIENCE)
        on = v if v is not None else d
        p = booster.predict(on.rows(panel, step), num_iteration=rounds)
        out.append((booster, rounds, _line(p, on.raw(step))))
    return out


def fit_spreads(
    model: Booster,
    d: Design,
    v: Design | None,
    quantiles: np.ndarray,
    threads: int,
    categorical: list[int],
) -> list[tuple[Any, int]]:
    """A quantile model per level of the standardized residual, the steps pooled (the step an
    input) on at most SPREAD_ROWS rows (a spread is learnt from fewer rows than a ranking),
    early-stopped alike."""
    z = model.standardized(d).ravel()
    sample = np.sort(np.random.default_rng(0).permutation(len(z))[:SPREAD_ROWS])
    valid = None
    if v is not None:
        vz = model.standardized(v).ravel()
        held = np.sort(np.random.default_rng(1).permutation(len(vz))[: SPREAD_ROWS // 4])
        valid = (model.spread_rows(v, held), vz[held])
    params = tree_params(len(sample), threads) | {
        "objective": "quantile",
        "learning_rate": SPREAD_LEARNING_RATE,
        "num_leaves": 15,
        "min_data_in_leaf": max(200, len(sample) // 2_500),
    }
    x = model.spread_rows(d, sample)
    return [
        _boost(
            params | {"alpha": float(a)},
            x,
            z[sample],
            valid,
            categorical,
            SPREAD_ROUNDS,
            SPREAD_PATIENCE,
        )
        for a in quantiles
    ]


def _stated(
    model: Booster,
    params: dict[str, Any],
    width: int,
    windows: int,
    kept: int,
    of: int,
    stopped: bool,
) -> tuple[str, dict[str, Any]]:
    """The fit in words, and what summary.json states of it (`fit_s` added by the caller)."""
    rounds = [int(r) for _, r, _ in model.centres]
    facts: dict[str, Any] = {
        "rounds": rounds,
        "spread_rounds": [int(r) for _, r in model.spreads],
        "early_stopped": stopped,
        "learning_rate": LEARNING_RATE,
        "num_leaves": params["num_leaves"],
        "min_data_in_leaf": params["min_data_in_leaf"],
        "inputs": int(width),
        "cross_sectional_ranks": model.panel,
        "label": "move z-scored across names by date" if model.panel else "move",
        "training_rows": windows * model.steps,
    }
    if kept < of:
        facts["subsampled"] = {"from": of, "to": kept, "by": "date", "budget_mb": BUDGET_MB}
    ranks = " with their ranks by date" if model.panel else ""
    how = "early-stopped at" if stopped else "fixed"
    about = (
        f"LightGBM on {width} inputs{ranks}, a model per step, {how} {min(rounds)}-"
        f"{max(rounds)} rounds ({kept} training windows), quantile models of its residual"
    )
    return about, facts


def fit_lightgbm(
    train: WindowDataset,
    val: WindowDataset | None,
    quantiles: np.ndarray,
    target_kind: str,
    threads: int,
) -> tuple[Callable[[Any], np.ndarray], str, dict[str, Any]]:
    """The fitted baseline as a predictor of the moves of any dataset's windows (`Windows`,
    forecast a whole dataset at a time so each date's ranks are whole), its description, and
    what the summary states of it: rounds, inputs, rows, fit time, the subsample."""
    started = time.perf_counter()
    last = train.enc_offsets[-1].item()
    dates = origin_dates(train, last)
    panel = is_panel(dates)
    first = design(train, np.arange(min(len(train), 64)), target_kind, panel)
    width, h = first.rows(panel, 0).shape[1], first.move.shape[1]
    categorical = [] if panel else [width - 1]
    kept = by_dates(dates, max(1, BUDGET_MB * 2**20 // (4 * width)))
    d = design(train, kept, target_kind, panel)
    v = None
    if val is not None and len(val):
        at_most = max(1, BUDGET_MB * 2**20 // (16 * width))  # a quarter of the budget
        v = design(val, by_dates(origin_dates(val, last), at_most), target_kind, panel)
    if len(d.move) * h >= SAY_ROWS:
        log.info(
            "baselines: LightGBM on %s training windows x %d inputs, a model per step of %d, "
            "early-stopped: minutes on a large panel (a quant's baseline sees all the data)",
            f"{len(d.move):,}",
            width,
            h,
        )
    params = tree_params(len(d.move), threads)
    floor = max(0.1 * float(np.median(d.sigma)), 1e-12)
    median = int(np.argmin(np.abs(quantiles - 0.5)))
    centres = fit_centres(d, v, panel, params, categorical)
    model = Booster(panel, target_kind, centres, [], floor, median)
    model.spreads = fit_spreads(model, d, v, quantiles, threads, categorical)
    cache: dict[int, np.ndarray] = {}

    def predict(w: Any) -> np.ndarray:
        key = id(w.source)
        if key not in cache:
            cache.clear()  # one dataset at a time: validation, then test
            cache[key] = model.forecast(w.source)
        return cache[key][w.index]

    about, facts = _stated(model, params, width, len(d.move), len(kept), len(train), v is not None)
    facts["fit_s"] = round(time.perf_counter() - started, 2)
    return predict, about, facts
