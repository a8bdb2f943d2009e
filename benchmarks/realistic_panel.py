"""A daily stock panel whose edges are the size of real ones (#69): the synthetic panel of
`foxhunt.data.samples.stock_panel_table` (a market factor with volatility clustering, a factor
per sector, idiosyncratic Student-t(4) noise of 0.8-3% a day, staggered listings, delistings and
halts) with three anomalies planted in its prices, each name's expected next return moved by
its own return deviation sigma times

    - REVERSAL x (minus) its last 5 bars' return, short-term reversal;
    - MOMENTUM x its return from 252 to 21 bars back, medium-term momentum;
    - LOW_VOL x (minus) its volatility over the last 60 bars, the low-volatility effect;

each signal ranked among the names listed at that date and mapped to a standard normal score
(names without the history a signal needs score 0). The signals are computed from the planted
prices themselves, bar by bar, so momentum feeds on the reversal's moves as it would in a
market. The coefficients are set so that each signal alone has a rank IC by date of 0.02-0.05
with the next bar's return (`anomaly_ics`; measured in docs/panels.md and
tests/test_realistic_panel.py), the size of real daily stock signals, where drift250's planted
IC of 0.3 gives book Sharpes near 58. No observed column is added: the model sees OHLCV and the
sector, as a quant's plain panel.

    python benchmarks/realistic_panel.py OUT.parquet [--names 250] [--days 1500] [--seed 0]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy.special import ndtri

from benchmarks.planted_panel import write_planted_panel
from foxhunt.data.samples import stock_panel_table

REVERSAL, MOMENTUM, LOW_VOL = 0.03, 0.0175, 0.02  # in units of each name's return deviation
SHORT, LONG, SKIP, VOL = 5, 252, 21, 60  # the signals' bars
OVERRIDES = (
    "data=parquet",
    "data.group_column=symbol",
    "data.features=ohlcv",
    "data.static_features=[sector]",
)


def realistic_panel_table(names: int = 250, days: int = 1500, seed: int = 0) -> pa.Table:
    """The panel with its anomalies planted (see the module)."""
    return plant_anomalies(stock_panel_table(names, days=days, seed=seed))


def _grid(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's name index and date index, and [names, dates] each name's log return of the
    close on the dates it has a row (NaN elsewhere; its first row's: NaN)."""
    symbol = table["symbol"].to_numpy(zero_copy_only=False)
    t = table["timestamp"].cast(pa.int64()).to_numpy()
    names, name = np.unique(symbol, return_inverse=True)
    dates, date = np.unique(t, return_inverse=True)
    log_close = np.log(table["close"].to_numpy())
    same = np.r_[False, symbol[1:] == symbol[:-1]]  # rows by symbol, then time
    r = np.full((len(names), len(dates)), np.nan)
    r[name[same], date[same]] = np.diff(log_close)[same[1:]]
    return name, date, r


def _scores(x: np.ndarray) -> np.ndarray:
    """Each finite value's rank among them, as a standard normal score; 0 where not finite."""
    out, ok = np.zeros(len(x)), np.isfinite(x)
    if ok.sum() > 1:
        ranks = np.argsort(np.argsort(x[ok]))
        out[ok] = ndtri((ranks + 0.5) / ok.sum())
    return out


def signals(r: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[names] the three signals at date t, signed as planted, from the returns up to it (NaN
    without the history a signal needs): minus the last SHORT bars' return, the return from
    LONG to SKIP bars back, minus the last VOL bars' deviation."""

    def last(a: int, b: int) -> np.ndarray:  # the bars from a to b back, t's own 1 back
        return r[:, max(t - a + 1, 0) : max(t - b + 1, 0)]

    short, long_, vol = last(SHORT, 0), last(LONG, SKIP), last(VOL, 0)
    seen = [np.isfinite(w).sum(axis=1) for w in (short, long_, vol)]
    rev = np.where(seen[0] >= SHORT - 1, -np.nansum(short, axis=1), np.nan)
    mom = np.where(seen[1] >= (LONG - SKIP) * 2 // 3, np.nansum(long_, axis=1), np.nan)
    with warnings.catch_warnings():  # a name with no return in the window: NaN, as wanted
        warnings.simplefilter("ignore", RuntimeWarning)
        sd = np.where(seen[2] >= VOL * 2 // 3, -np.nanstd(vol, axis=1), np.nan)
    return rev, mom, sd


def plant_anomalies(table: pa.Table) -> pa.Table:
    """`table` (rows by symbol, then time) with the anomalies planted: each row's four prices
    scaled by exp(the name's planted moves so far) (see the module), and a column ``oracle``,
    the planted move of the name's next bar (the oracle's forecast; not an input)."""
    name, date, r = _grid(table)
    sigma = np.nanstd(r, axis=1)
    moved, oracle = np.zeros_like(r), np.zeros_like(r)
    for t in range(1, r.shape[1]):
        rev, mom, sd = signals(r, t - 1)  # r holds the planted returns up to t - 1
        mu = sigma * (REVERSAL * _scores(rev) + MOMENTUM * _scores(mom) + LOW_VOL * _scores(sd))
        oracle[:, t - 1] = mu
        listed = np.isfinite(r[:, t])
        moved[listed, t] = mu[listed]
        r[listed, t] += mu[listed]
    path = np.cumsum(moved, axis=1)[name, date]
    factor = np.exp(path - np.median(path))
    for column in ("open", "high", "low", "close"):
        price = table[column].to_numpy() * factor
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(price))
    ahead = oracle[name, date]  # a name's last row: the move its next date would have had
    same = np.flatnonzero(name[1:] == name[:-1])
    ahead[same] = moved[name[same + 1], date[same + 1]]  # after a halt: that of the bar after
    return table.append_column("oracle", pa.array(ahead))


def anomaly_ics(table: pa.Table, start: int = LONG) -> dict[str, float]:
    """Each signal's mean rank IC by date with the next bar's return (signed as planted), over
    the dates from `start` on that hold more than 10 names with both."""
    _, _, r = _grid(table)
    ics: dict[str, list[float]] = {"reversal": [], "momentum": [], "low_vol": []}
    for t in range(start, r.shape[1] - 1):
        nxt = r[:, t + 1]
        for key, x in zip(ics, signals(r, t), strict=True):
            ok = np.isfinite(x) & np.isfinite(nxt)
            if ok.sum() > 10:
                ics[key].append(float(np.corrcoef(_ranks(x[ok]), _ranks(nxt[ok]))[0, 1]))
    return {k: float(np.mean(v)) for k, v in ics.items()}


def _ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(np.float64)


def write_realistic_panel(
    path: Path, names: int = 250, days: int = 1500, seed: int = 0
) -> list[str]:
    """Write the panel to `path` (whole or not at all); the overrides that train on it."""
    write_planted_panel(path, realistic_panel_table(names, days, seed))
    return [*OVERRIDES, f"data.path={path.resolve()}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--names", type=int, default=250)
    ap.add_argument("--days", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(" ".join(write_realistic_panel(a.out, a.names, a.days, a.seed)))


if __name__ == "__main__":
    main()
