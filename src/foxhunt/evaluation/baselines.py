"""Honest baselines: the simple forecasts a skeptic would pick, each fit on the training windows
only and scored with the model's own metrics (`foxhunt.training.metrics`: the quantile loss in
normalized target units, the directional accuracy) on exactly the model's validation and test
windows.

Every baseline forecasts the target's move from the naive reference, the move the directional
accuracy measures: the target itself for a return target (its reference is zero), the change
from the last observed value for a level target.

- `zero`: no move, at every quantile (a zero return, or the last value: the naive forecast).
- `unconditional`: the training moves' quantiles per instrument and horizon step.
- `volatility_scaled`: the EWMA volatility of the encoder's moves (its returns, or a level's
  differences) times the quantiles, per instrument and step, of the training moves divided by
  their own window's volatility.
- `seasonal`: the training moves' quantiles per instrument and season of the target's time (and
  step, for a level target): the time of day (UTC; buckets of 30 minutes, or of the bar interval
  when longer) for intraday bars (median step between bars under a day), else the weekday.
- `linear`: one linear map per quantile and step, fit by minimizing the quantile loss, on the
  inputs the TFT sees: the encoder's last row, its latest moves and volatility, the decoder's
  known inputs, the statics and the instrument.
- `lightgbm`: the LightGBM a quant writes (`foxhunt.evaluation.gbm`): every training window,
  a practitioner's features of the window and, on a panel, their ranks by date, a label
  z-scored across names by date, early-stopped on the validation windows; when `lightgbm` is
  installed (`pip install -e ".[baselines]"`).

The tables and the linear model are estimated from an evenly spaced subsample of the training
windows past a bound (TABLE_WINDOWS, MODEL_WINDOWS), which bounds the time they add to a run
and is recorded as `subsampled`; the linear and LightGBM quantiles are sorted before scoring
(never worse, Chernozhukov et al. 2010), as a skeptic would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from foxhunt.data.splits import mean_std
from foxhunt.data.windows import WindowDataset
from foxhunt.evaluation import gbm
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.evaluation.moves import (
    EWMA_DECAY,
    QuantileTable,
    Windows,
    by_instrument,
    ewma_volatility,
    gather,
)
from foxhunt.evaluation.tally import Tally
from foxhunt.run.progress import steps
from foxhunt.threads import usable_cpus

DAY_NS = 86_400 * 10**9
SEASON_NS = 30 * 60 * 10**9  # the shortest time-of-day bucket
MIN_CELL = 30  # training moves a seasonal cell needs; fewer: the instrument's unconditional ones
SIGMA_FLOOR = 0.1  # of the median training volatility: a flat encoder still forecasts a spread
LAGS = 8  # the encoder's latest moves among the linear model's inputs
# Training windows the tables and the linear model are fit on, at most (more: an evenly spaced
# subsample). What a fit costs grows with its windows; measured on 250 daily instruments x 2000
# bars (306,250 training windows, encoder 64; one thread, load average 4-5 on 2 cores): the
# quantile tables take 0.2-0.7 s on all of them, but gathered they hold ~1 kB a window (100,000:
# ~95 MB); the linear fit takes ~1.8 s per 10,000 windows (on all: 55 s), while twice the
# windows or steps scored the same on the bundled sample. LightGBM, the strongest, is fit on
# all the training windows (`gbm`: within its memory budget)
TABLE_WINDOWS = 100_000
MODEL_WINDOWS = 10_000
LINEAR_STEPS = 100  # full-batch Adam steps
CHUNK = 16_384  # windows gathered and scored at a time
MODEL = "model"  # the model's own forecasts, scored beside the baselines
INTERVAL_ROWS = 1_000_000  # rows the median bar interval is taken over

# what predicts a window's move quantiles [n, H, Q] (normalized units) from its Windows
Predict = Callable[["Windows"], np.ndarray]


class Skipped(Exception):
    """A baseline that cannot be fit here; the message says why."""


def bar_interval_ns(ds: WindowDataset) -> float:
    """The median time between consecutive bars of an instrument (its first rows)."""
    if ds.time_ns is None:
        raise Skipped("the windows carry no times")
    t, g = ds.time_ns[:INTERVAL_ROWS].numpy(), ds.group[:INTERVAL_ROWS].numpy()
    steps = np.diff(t)[np.diff(g) == 0]
    return float(np.median(steps)) if len(steps) else float(DAY_NS)


def seasons(interval_ns: float) -> tuple[Callable[[np.ndarray], np.ndarray], int, str]:
    """How target times [..] fall into seasons: the function, the number of seasons, in words."""
    if interval_ns < DAY_NS:
        width = max(SEASON_NS, int(interval_ns))
        about = f"time of day (UTC, {width / 60e9:g}-minute buckets)"
        return (lambda t: t % DAY_NS // width), -(-DAY_NS // width), about
    # 1970-01-01 was a Thursday: + 3 numbers the weekdays from Monday = 0
    return (lambda t: (t // DAY_NS + 3) % 7), 7, "weekday (UTC)"


def fit_zero(quantiles: np.ndarray) -> tuple[Predict, str]:
    def predict(w: Windows) -> np.ndarray:
        return np.zeros((*w.target.shape, len(quantiles)))

    return predict, "no move at any quantile (the naive forecast)"


def fit_unconditional(train: Windows, quantiles: np.ndarray) -> tuple[Predict, str]:
    table = by_instrument(train.group, train.move, quantiles)
    return (lambda w: table(w.group)), "training quantiles per instrument and step"


def fit_volatility_scaled(
    train: Windows, quantiles: np.ndarray, target_kind: str
) -> tuple[Predict, str]:
    sigma = ewma_volatility(train.history)
    floor = max(SIGMA_FLOOR * float(np.median(sigma)), 1e-12)
    table = by_instrument(train.group, train.move / np.maximum(sigma, floor)[:, None], quantiles)

    def predict(w: Windows) -> np.ndarray:
        return np.maximum(ewma_volatility(w.history), floor)[:, None, None] * table(w.group)

    moves = "returns" if target_kind == "return" else "differences"
    return (
        predict,
        f"EWMA (decay {EWMA_DECAY}) volatility of the encoder's {moves} x training quantiles",
    )


def fit_seasonal(
    train: Windows, quantiles: np.ndarray, interval_ns: float, target_kind: str
) -> tuple[Predict, str]:
    season, count, about = seasons(interval_ns)
    # a return's law depends on its time, not on how far ahead it is: its cells pool the steps
    # (H times the moves per cell); a level's move grows with the step
    steps = np.arange(train.target.shape[1]) if target_kind != "return" else np.zeros(1, int)

    def cell(w: Windows) -> np.ndarray:
        return (w.group[:, None] * count + season(w.time_ns)) * len(steps) + steps

    table = QuantileTable(cell(train), train.move, quantiles, min_count=MIN_CELL)
    unconditional = by_instrument(train.group, train.move, quantiles)
    return (lambda w: table(cell(w), unconditional(w.group))), f"training quantiles by {about}"


def window_inputs(w: Windows, groups: int) -> np.ndarray:
    """[n, inputs] what the linear and LightGBM models see of a window besides the decoder's
    known inputs: the encoder's last row, latest moves and volatility, statics, instrument."""
    return np.column_stack(
        [
            w.last_step,
            w.history[:, -LAGS:],
            ewma_volatility(w.history),
            w.static,
            np.eye(groups)[w.group],
        ]
    )


def fit_linear(train: Windows, quantiles: np.ndarray, groups: int) -> tuple[Predict, str]:
    n, steps = train.target.shape
    q = torch.tensor(quantiles, dtype=torch.float32)

    def inputs(w: Windows) -> np.ndarray:
        return np.column_stack([window_inputs(w, groups), w.known.reshape(len(w.group), -1)])

    x = inputs(train)
    mean, std = mean_std(x)
    x = torch.from_numpy((x - mean) / std).float()
    y = torch.from_numpy(train.move).float()
    linear = torch.nn.Linear(x.shape[1], steps * len(quantiles))
    with torch.no_grad():  # start at the pooled unconditional quantiles
        linear.weight.zero_()
        linear.bias.copy_(torch.quantile(y, q, dim=0).T.reshape(-1))
    optimizer = torch.optim.Adam(linear.parameters(), lr=0.01)
    for _ in range(LINEAR_STEPS):
        optimizer.zero_grad()
        quantile_loss(linear(x).view(n, steps, -1), y, q).backward()
        optimizer.step()
    linear.requires_grad_(False)

    def predict(w: Windows) -> np.ndarray:
        x = torch.from_numpy((inputs(w) - mean) / std).float()
        return np.sort(linear(x).view(len(w.group), steps, -1).double().numpy(), axis=-1)

    return predict, f"linear quantile regression on the model's inputs ({n} training windows)"


def _sample(n: int, at_most: int, rng: np.random.Generator) -> np.ndarray:
    """All `n` window indices, or `at_most` evenly spaced from a seeded offset: every
    instrument's share of them over its whole history (a dataset's windows run instrument by
    instrument, in time), where a random draw gives some instruments more than others."""
    if n <= at_most:
        return np.arange(n)
    step = n / at_most
    return np.minimum(rng.uniform(0, step) + step * np.arange(at_most), n - 1).astype(np.int64)


def _chunks(ds: WindowDataset, desc: str) -> Iterator[np.ndarray]:
    """The window indices of `ds`, CHUNK at a time; the progress shown on a terminal."""
    parts = np.array_split(np.arange(len(ds)), max(1, -(-len(ds) // CHUNK)))
    return steps(parts, desc, unit="chunk")


def score(
    predictors: dict[str, Predict],
    ds: WindowDataset,
    target_kind: str,
    quantiles: list[float],
    names: list[str],
    desc: str = "baselines: score",
    apart: dict[str, list[int]] | None = None,
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Each predictor's {loss, directional_accuracy} on every window of `ds`, pooled (key
    None), per instrument (its name, from the vocabulary `names`) and over each group of
    instruments in `apart` (key ("apart", its label): a list of indices in `names`):
    ({predictor: {key: scores}}, {key: {windows, up_share}}), the up share being the share of
    the target's moves that were up (moves of zero not counted, as in the directional
    accuracy: what "always up" scores). One unnamed series (`names` empty) is scored pooled
    only; `desc` names the progress shown on a terminal."""
    q = np.asarray(quantiles, dtype=np.float64)
    groups = max(len(names), 1)
    tallies = {name: Tally(groups, q) for name in predictors}
    windows, up, moved = np.zeros(groups), np.zeros(groups), np.zeros(groups)
    for chunk in _chunks(ds, desc):
        w = gather(ds, chunk, target_kind)
        move = w.move
        windows += np.bincount(w.group, minlength=groups)
        up += np.bincount(w.group, (move > 0).sum(axis=1), groups)
        moved += np.bincount(w.group, (move != 0).sum(axis=1), groups)
        for name, predict in predictors.items():
            tallies[name].update(predict(w), move, w.group)
    keys: list[tuple[str | None, Any]] = [(None, slice(None))]
    keys += [(names[g], [g]) for g in np.flatnonzero(windows)] if names else []
    keys += [(("apart", label), g) for label, g in (apart or {}).items() if windows[g].sum()]
    scored = {name: {key: t.scores(keep) for key, keep in keys} for name, t in tallies.items()}
    counts = {
        key: {
            "windows": int(windows[keep].sum()),
            "up_share": float(up[keep].sum() / moved[keep].sum()) if moved[keep].sum() else None,
        }
        for key, keep in keys
    }
    return scored, counts


def model_forecasts(pred: np.ndarray, target_kind: str) -> Predict:
    """The model's forecasts `pred` [windows, H, Q] (normalized, in the dataset's order) as a
    predictor of the moves, for `score` to score beside the baselines."""

    def predict(w: Windows) -> np.ndarray:
        return pred[w.index].astype(np.float64) - w.reference.double().numpy()[..., None]

    return predict


def fit_baselines(
    train: WindowDataset,
    target_kind: str,
    quantiles: list[float],
    seed: int = 0,
    val: WindowDataset | None = None,
) -> tuple[dict[str, Predict], dict[str, dict]]:
    """Every baseline fit on the training windows (the tables and the linear model past
    TABLE_WINDOWS or MODEL_WINDOWS on an evenly spaced subsample from a seeded offset; LightGBM
    on all of them within its memory budget, early-stopped on `val`'s, `gbm`): the fitted ones
    by name, and for every one {about, fit_s, and when subsampled: subsampled: {from, to}
    windows; LightGBM's rounds and inputs too}, or {skipped: why}."""
    q = np.asarray(quantiles, dtype=np.float64)
    rng = np.random.default_rng(seed)
    tables = gather(train, _sample(len(train), TABLE_WINDOWS, rng), target_kind)
    models = gather(train, _sample(len(train), MODEL_WINDOWS, rng), target_kind)
    groups = len(train.static_real)  # the instrument vocabulary (1 for one unnamed series)
    fits: dict[str, Callable[[], tuple[Predict, str]]] = {
        "zero": lambda: fit_zero(q),
        "unconditional": lambda: fit_unconditional(tables, q),
        "volatility_scaled": lambda: fit_volatility_scaled(tables, q, target_kind),
        "seasonal": lambda: fit_seasonal(tables, q, bar_interval_ns(train), target_kind),
        "linear": lambda: fit_linear(models, q, groups),
        "lightgbm": lambda: fit_lightgbm(train, val, q, target_kind),
    }
    fit_on = {"unconditional": tables, "volatility_scaled": tables, "seasonal": tables}
    fit_on |= {"linear": models}
    predictors: dict[str, Predict] = {}
    out: dict[str, dict] = {}
    for name, fit in steps(list(fits.items()), "baselines: fit", label=lambda f: f[0]):
        started = time.perf_counter()
        try:
            predictors[name], about, *facts = fit()
        except Skipped as why:
            out[name] = {"skipped": str(why)}
            continue
        out[name] = {"about": about, "fit_s": round(time.perf_counter() - started, 2)}
        out[name] |= facts[0] if facts else {}
        if name in fit_on and len(fit_on[name].index) < len(train):
            out[name]["subsampled"] = {"from": len(train), "to": len(fit_on[name].index)}
    return predictors, out


def fit_lightgbm(
    train: WindowDataset, val: WindowDataset | None, q: np.ndarray, target_kind: str
) -> tuple[Predict, str, dict[str, Any]]:
    if not gbm.available():
        raise Skipped('lightgbm is not installed (pip install -e ".[baselines]")')
    return gbm.fit_lightgbm(train, val, q, target_kind, usable_cpus())


def score_baselines(
    datasets: dict[str, WindowDataset],
    target_kind: str,
    quantiles: list[float],
    names: list[str],
    model: np.ndarray | None = None,
    seed: int = 0,
    apart: dict[str, list[int]] | None = None,
) -> tuple[dict[str, dict], dict[str | None, dict], np.ndarray | None, Predict | None]:
    """Fit every baseline on the training windows and score it on the validation and test
    windows, beside the model's test forecasts `model` ([windows, H, Q], normalized, in the
    test dataset's order; `foxhunt.app.train.phases.forecast_split`) when given, and on the test
    windows the groups of instruments `apart` as `score` does. Returns
    ({name: {about, fit_s, val_loss, test_loss, test_directional_accuracy, test_by_instrument:
    {instrument: {test_loss, test_directional_accuracy}}}, or {skipped: why}},
    {None (pooled) and each instrument: {windows, up_share, and with the model: test_loss,
    test_directional_accuracy, skill, best_baseline}} on the test windows,
    the strongest baseline's forecasts of the test windows like `model`'s, or None, and its
    predictor, to forecast other windows: the calibration's, `foxhunt.evaluation.judge`)."""
    predictors, out = fit_baselines(
        datasets["train"], target_kind, quantiles, seed, datasets.get("val")
    )
    if len(datasets["val"]):
        scored, _ = score(
            predictors, datasets["val"], target_kind, quantiles, names, "baselines: validation"
        )
        for name, found in scored.items():
            out[name]["val_loss"] = found[None]["loss"]
    if not len(datasets["test"]):
        return out, {}, None, None
    if model is not None:
        predictors[MODEL] = model_forecasts(model, target_kind)
    scored, test = score(
        predictors, datasets["test"], target_kind, quantiles, names, "baselines: test", apart
    )
    scored = {n: {k: _test_metrics(s) for k, s in found.items()} for n, found in scored.items()}
    own = scored.pop(MODEL, None)
    for name, found in scored.items():
        by_instrument = {k: v for k, v in found.items() if isinstance(k, str)}
        out[name] |= found[None] | {"test_by_instrument": by_instrument}
    for key in test if own is not None else ():
        against, best = skill(own[key]["test_loss"], {n: f[key] for n, f in scored.items()})
        test[key] |= own[key] | {"skill": against, "best_baseline": best}
    best = skill(0.0, out)[1]  # the strongest on the test windows, pooled
    if not best:
        return out, test, None, None
    desc = f"baselines: {best}'s test forecasts"
    forecasts = forecast_all(predictors[best], datasets["test"], target_kind, desc)
    return out, test, forecasts, predictors[best]


def forecast_all(
    predict: Predict, ds: WindowDataset, target_kind: str, desc: str = "baselines: forecast"
) -> np.ndarray:
    """[windows, H, Q] a predictor's forecasts (normalized) of every window of `ds`, in order;
    `desc` names the progress shown on a terminal."""
    out = []
    for chunk in _chunks(ds, desc):
        w = gather(ds, chunk, target_kind)
        out.append(w.reference.double().numpy()[..., None] + predict(w))
    return np.concatenate(out).astype(np.float32)


def _test_metrics(scores: dict[str, float | None]) -> dict[str, float | None]:
    return {f"test_{k}": v for k, v in scores.items()}


def skill(test_loss: float | None, baselines: dict[str, dict]) -> tuple[float | None, str | None]:
    """1 - test_loss / the lowest baseline test loss, and that baseline's name (the strongest
    on the test windows: the skeptic's choice)."""
    scored = {n: b["test_loss"] for n, b in baselines.items() if b.get("test_loss") is not None}
    if test_loss is None or not scored:
        return None, None
    best = min(scored, key=scored.__getitem__)
    return (1 - test_loss / scored[best] if scored[best] > 0 else None), best
