"""Positive controls: synthetic panels whose best possible forecast (the oracle) is known.

Each control plants one kind of signal a TFT is built to find, in a panel of daily OHLCV bars
read the way a user's file is (`data=parquet`, the derived `ohlcv` features):

* ``observed``: a column ``signal`` = the next bar's return plus noise of the returns' long-run
  variance (correlation 0.71 with the horizon-1 target), an observed input, under GARCH(1,1)
  volatility clustering (the case the default recipe missed on real daily index bars);
* ``known``: a scheduled event flag ``event`` (a known-future input) that shifts the mean and
  doubles the volatility of the bar where it is set;
* ``static``: a static covariate ``vol_scale`` (log of each instrument's volatility scale, drawn
  from 0.4 to 2.5x);
* ``ar1``: an AR(1) return with coefficient 0.3 and no extra column at all;
* ``volatility``: instruments whose volatilities differ 8x (geometrically spaced), each with
  the same unitless ``signal`` = its next bar's standardized return plus noise of unit
  variance (correlation 0.71 in every name): a panel on one pooled scale hides the quiet names'
  signal under the loud names' noise (data.target_scale).

Returns are Gaussian given what is known at the forecast's origin one bar ahead, so the
oracle's quantiles ``mean + std * z_q`` are exact at horizon 1 (beyond it under GARCH: the exact
mean and variance of a scale mixture). `score` compares a test forecast table with the oracle
and with the unconditional forecast (the training period's pooled target quantiles): the share
of the oracle's improvement in pinball loss the forecast reaches, and the horizon-1 IC of its
median beside the oracle's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from scipy.stats import norm, spearmanr

from foxhunt.data.schema import DataSchema
from foxhunt.data.windows import WindowDataset
from foxhunt.evaluation.baselines import fit_baselines, forecast_all
from foxhunt.evaluation.forecasts import forecast_table, target_column
from foxhunt.evaluation.stats import pinball_per_quantile
from foxhunt.files import write_atomic

CONTROLS = ("observed", "known", "static", "ar1", "volatility")
SIGMA = 0.01  # the long-run daily return std of a unit-scale instrument
# GARCH(1,1) volatility clustering (persistence 0.98, as daily index returns) under these
# controls: the recipe must find the planted signal beside a volatility worth forecasting
ALPHA, BETA = 0.08, 0.90
CLUSTERED = ("observed",)
AR = 0.3  # the ar1 control's coefficient
EVENT_P, EVENT_MEAN, EVENT_VOL = 0.1, 1.0 * SIGMA, 2.0  # the known control's flag
VOL_RANGE = 8.0  # the volatility control's loudest name's volatility over its quietest's
EXTRA = {"observed": "signal", "known": "event", "static": "vol_scale", "volatility": "signal"}
ROLE = {"observed": "extra_features", "known": "known_features", "static": "static_features"}
ROLE["volatility"] = "extra_features"


@dataclass(frozen=True)
class Series:
    """One instrument of a control: its returns, the GARCH variance of each next bar (known at
    the bar: a function of past returns) and the planted column."""

    returns: np.ndarray
    next_var: np.ndarray  # next_var[t] = Var(u[t + 1] | returns up to t)
    planted: np.ndarray  # signal, event flag or log volatility scale (zeros for ar1)


@dataclass(frozen=True)
class Control:
    """A written control panel: its file, the overrides that read it and the oracle."""

    name: str
    path: Path
    overrides: tuple[str, ...]
    times: np.ndarray  # every instrument's bar times (one calendar)
    series: dict[str, Series]

    def oracle(self, instrument: str, origin: np.ndarray, horizon: np.ndarray) -> tuple:
        """(mean, std) of the return `horizon` bars after row `origin` of `instrument`, given
        everything known at the origin. Exact at horizon 1; beyond it the exact mean and
        variance (the distribution is then a scale mixture, nearly Gaussian)."""
        s = self.series[instrument]
        target = origin + horizon
        var1 = s.next_var[origin]
        if self.name == "observed":  # signal[t] = r[t + 1] + noise of variance SIGMA ** 2
            signal = s.planted[origin]
            shrink = var1 / (var1 + SIGMA**2)
            mean1, cond1 = shrink * signal, var1 * SIGMA**2 / (var1 + SIGMA**2)
            # the signal also tells of r[t + 1] ** 2, and with it the next bar's variance
            var2 = SIGMA**2 * (1 - ALPHA - BETA) + ALPHA * (mean1**2 + cond1) + BETA * var1
            later = _variance_path(var2, horizon - 1)
            return np.where(horizon == 1, mean1, 0.0), np.sqrt(np.where(horizon == 1, cond1, later))
        if self.name == "volatility":  # signal[t] = z[t + 1] + unit noise: half of z's variance
            std = np.sqrt(var1)
            mean1 = 0.5 * std * s.planted[origin]
            return np.where(horizon == 1, mean1, 0.0), np.where(horizon == 1, np.sqrt(0.5), 1) * std
        var = _variance_path(var1, horizon)
        if self.name == "known":
            event = s.planted[target]
            return EVENT_MEAN * event, np.sqrt(var) * (1 + (EVENT_VOL - 1) * event)
        if self.name == "static":
            return np.zeros_like(var), np.sqrt(var) * np.exp(s.planted[origin])
        # ar1: r[t + h] = AR ** h r[t] + sum_j AR ** j sqrt(1 - AR ** 2) u[t + h - j]
        total = sum(
            np.where(j < horizon, AR ** (2 * j) * _variance_path(var1, horizon - j), 0.0)
            for j in range(int(horizon.max()))
        )
        return AR**horizon * s.returns[origin], np.sqrt((1 - AR**2) * total)


def _variance_path(next_var: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """GARCH(1,1): E[var of the bar `steps` ahead] from the next bar's variance (steps >= 1)."""
    return SIGMA**2 + (ALPHA + BETA) ** (np.maximum(steps, 1) - 1) * (next_var - SIGMA**2)


def _garch(shocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u[t] = sigma[t] * shocks[t] and next_var[t] = sigma[t + 1] ** 2."""
    omega = SIGMA**2 * (1 - ALPHA - BETA)
    u, next_var = np.empty_like(shocks), np.empty_like(shocks)
    var = SIGMA**2
    for t, z in enumerate(shocks):
        u[t] = np.sqrt(var) * z
        var = omega + ALPHA * u[t] ** 2 + BETA * var
        next_var[t] = var
    return u, next_var


def _returns(name: str, rng: np.random.Generator, bars: int, scale: float = 1.0) -> Series:
    """One instrument's returns under control `name` (`scale`: its volatility's, for the
    volatility control)."""
    z = rng.normal(size=bars)
    if name == "volatility":
        signal = np.append(z[1:], 0.0) + rng.normal(size=bars)
        return Series(scale * SIGMA * z, np.full(bars, (scale * SIGMA) ** 2), signal)
    # volatility clusters under the planted column, as on the real bars where it was missed;
    # the other controls keep a constant volatility, so their oracle's gain is what they plant
    u, next_var = _garch(z) if name in CLUSTERED else (SIGMA * z, np.full(bars, SIGMA**2))
    if name == "observed":
        signal = np.append(u[1:], 0.0) + SIGMA * rng.normal(size=bars)
        return Series(u, next_var, signal)
    if name == "known":
        event = (rng.random(bars) < EVENT_P).astype(np.float64)
        return Series(EVENT_MEAN * event + (1 + (EVENT_VOL - 1) * event) * u, next_var, event)
    if name == "static":
        log_scale = np.log(rng.uniform(0.4, 2.5))
        return Series(np.exp(log_scale) * u, next_var, np.full(bars, log_scale))
    r = np.sqrt(1 - AR**2) * u  # the AR(1) keeps the long-run std SIGMA
    for t in range(1, bars):
        r[t] += AR * r[t - 1]
    return Series(r, next_var, np.zeros(bars))


def make_control(
    name: str, directory: Path, instruments: int = 16, bars: int = 1500, seed: int = 0
) -> Control:
    """Write control `name`'s panel to `directory`/<name>.parquet (daily OHLCV bars of
    `instruments` instruments on one business-day calendar); return it with its oracle."""
    if name not in CONTROLS:
        raise ValueError(f"unknown control {name!r}: one of {', '.join(CONTROLS)}")
    rng = np.random.default_rng([seed, CONTROLS.index(name)])
    days = np.datetime64("2000-01-03", "D") + np.arange(bars * 2)
    days = days[np.is_busday(days)][:bars].astype("datetime64[ns]").astype(np.int64)
    columns: dict[str, list] = {
        k: [] for k in ("timestamp", "symbol", "open", "high", "low", "close", "volume")
    }
    extra = EXTRA.get(name)
    series = {}
    for i in range(instruments):
        symbol = f"S{i:02d}"
        scale = VOL_RANGE ** (i / max(instruments - 1, 1)) if name == "volatility" else 1.0
        s = series[symbol] = _returns(name, rng, bars, scale)
        close = 100 * np.exp(np.cumsum(s.returns))
        open_ = np.concatenate([[100.0], close[:-1]])
        wick = np.abs(rng.normal(scale=0.3 * SIGMA, size=(2, bars)))
        columns["timestamp"].append(days)
        columns["symbol"].append(np.full(bars, symbol))
        columns["open"].append(open_)
        columns["close"].append(close)
        columns["high"].append(np.maximum(open_, close) * np.exp(wick[0]))
        columns["low"].append(np.minimum(open_, close) * np.exp(-wick[1]))
        columns["volume"].append(np.exp(rng.normal(10, 0.5, size=bars)).round())
        if extra:
            columns.setdefault(extra, []).append(s.planted)
    utc = pa.timestamp("ns", tz="UTC")
    table = pa.table(
        {
            k: pa.array(np.concatenate(v), utc if k == "timestamp" else None)
            for k, v in columns.items()
        }
    )
    path = Path(directory) / f"{name}.parquet"
    write_atomic(path, lambda f: pq.write_table(table, f))
    overrides = ["data=parquet", f"data.path={path}", "data.group_column=symbol"]
    # the oracle forecasts each name's own return: the target as it is, not less the mean
    # across the names that data.target_transform=auto takes on a panel of this size
    overrides += ["data.features=ohlcv", "data.target_transform=none"]
    if extra:
        overrides.append(f"data.{ROLE[name]}=[{extra}]")
    return Control(name, path, tuple(overrides), days, series)


def baseline_forecasts(
    datasets: dict[str, WindowDataset],
    schema: DataSchema,
    quantiles: list[float],
    names: tuple[str, ...] = ("linear", "lightgbm"),
    seed: int = 0,
) -> dict[str, pa.Table]:
    """The test forecast tables (as a run's test_forecasts.parquet) of baselines `names`, fit on
    the training windows as a run fits them; a skipped one (no lightgbm) is left out."""
    predictors, _ = fit_baselines(
        datasets["train"], schema.target_kind, quantiles, seed, datasets.get("val")
    )
    test = datasets["test"]
    return {
        name: forecast_table(
            test, schema, forecast_all(predictors[name], test, schema.target_kind), quantiles
        )
        for name in names
        if name in predictors
    }


def score(control: Control, table: pa.Table, train_end_ns: int | None = None) -> dict:
    """A test forecast table (a run's test_forecasts.parquet) against the oracle's and the
    unconditional forecast's.

    `train_end_ns`: the unconditional quantiles are the pooled target's before this time
    (default: the first test origin), the forecast a model with no information would make."""
    levels = sorted(float(c[1:]) for c in table.column_names if c.startswith("q"))
    q = np.array(levels)
    pred = np.stack([table.column(f"q{lv:g}").to_numpy() for lv in levels], axis=1)
    actual = table.column(target_column(table)).to_numpy()
    horizon = table.column("horizon").to_numpy().astype(np.int64)
    origin_ns = pc.cast(table.column("origin_time"), pa.int64()).to_numpy()
    names = table.column("instrument").to_numpy(zero_copy_only=False)
    oracle_mean, oracle_std = np.empty(len(table)), np.empty(len(table))
    for name in np.unique(names):
        rows = names == name
        origin = np.searchsorted(control.times, origin_ns[rows])
        oracle_mean[rows], oracle_std[rows] = control.oracle(name, origin, horizon[rows])
    oracle = oracle_mean[:, None] + oracle_std[:, None] * norm.ppf(q)[None, :]
    cut = origin_ns.min() if train_end_ns is None else train_end_ns
    history = np.concatenate(
        [s.returns[1:][control.times[1:] < cut] for s in control.series.values()]
    )
    unconditional = np.broadcast_to(np.quantile(history, q), pred.shape)
    median = int(np.argmin(np.abs(q - 0.5)))
    h1 = horizon == 1
    forecasts = {"model": pred, "oracle": oracle, "unconditional": unconditional}
    losses = {k: float(pinball_per_quantile(v, actual, q).mean()) for k, v in forecasts.items()}
    at_h1 = {
        k: float(pinball_per_quantile(v[h1], actual[h1], q).mean()) for k, v in forecasts.items()
    }
    return {
        "control": control.name,
        "windows": int(h1.sum()),
        **{f"{k}_loss": v for k, v in losses.items()},
        # the share of the oracle's improvement over the unconditional forecast, at horizon 1
        # (where every control's information acts: pooled over the horizons, an AR(1)'s gain
        # is an eighth of it, below the noise of fitting 24 quantile outputs) and pooled
        "captured": _captured(at_h1),
        "captured_pooled": _captured(losses),
        "model_ic_h1": _ic(pred[h1, median], actual[h1]),
        "oracle_ic_h1": _ic(oracle_mean[h1], actual[h1]),
    }


def _captured(losses: dict[str, float]) -> float | None:
    """(unconditional - model) / (unconditional - oracle) of these losses."""
    gain = losses["unconditional"] - losses["oracle"]
    return (losses["unconditional"] - losses["model"]) / gain if gain > 0 else None


def _ic(forecast: np.ndarray, actual: np.ndarray) -> float:
    """Spearman's rank correlation; 0 for a constant forecast (no ranking at all)."""
    return float(spearmanr(forecast, actual).statistic) if np.ptp(forecast) > 0 else 0.0
