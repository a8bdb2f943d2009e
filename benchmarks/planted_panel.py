"""A daily stock panel with a planted weak alpha: the synthetic panel of
`foxhunt.data.samples.stock_panel_table` (staggered listings, delistings, halts, a sector static,
idiosyncratic volatility 0.8-3% a day) with an observed column ``signal`` whose correlation with
each name's next bar's log return of the close is `corr` (0.1 by default, the size of a real
signal), the same in every name: signal[t] = corr * z[t + 1] + sqrt(1 - corr**2) * noise, z a
name's next return over its own standard deviation. A name's last row has noise alone.

    python benchmarks/planted_panel.py OUT.parquet [--names 250] [--days 1500] [--seed 0]
        [--corr 0.1]

Writes the file and prints the overrides that train on it (`OVERRIDES` + data.path).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from scipy.signal import lfilter

from foxhunt.data.samples import stock_panel_table
from foxhunt.files import write_atomic

OVERRIDES = (
    "data=parquet",
    "data.group_column=symbol",
    "data.features=ohlcv",
    "data.static_features=[sector]",
    "data.extra_features=[signal]",
)


def planted_panel_table(
    names: int = 250, days: int = 1500, seed: int = 0, corr: float = 0.1
) -> pa.Table:
    """The panel with its ``signal`` column (see the module)."""
    table = stock_panel_table(names, days=days, seed=seed)
    return plant_signal(table, corr, np.random.default_rng(seed + 1_000_003))


def plant_signal(table: pa.Table, corr: float, rng: np.random.Generator) -> pa.Table:
    """`table` (rows by symbol, then time) with a ``signal`` column correlated `corr` with each
    symbol's next bar's log return of the close (see the module)."""
    symbol = table["symbol"].to_numpy(zero_copy_only=False)
    log_close = np.log(table["close"].to_numpy())
    signal = rng.normal(size=len(symbol))
    starts = np.flatnonzero(np.r_[True, symbol[1:] != symbol[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(symbol)], strict=True):
        nxt = np.diff(log_close[a:b])  # nxt[t] = the return of the bar after row a + t
        z = (nxt - nxt.mean()) / (nxt.std() or 1.0)
        signal[a : b - 1] = corr * z + math.sqrt(1 - corr**2) * signal[a : b - 1]
    return table.append_column("signal", pa.array(signal))


def plant_drift(
    table: pa.Table, ic: float, persistence: float, observed: float, rng: np.random.Generator
) -> pa.Table:
    """`table` (rows by symbol, then time) with a slow alpha planted in its prices: each symbol
    gets a latent drift mu, a unit AR(1) with coefficient `persistence`, which moves its next
    bar's log return by k * sigma * mu (sigma: the symbol's own return deviation; k such that
    mu's correlation with that return is `ic`), all four prices of a row scaled alike. Added
    columns: ``signal``, a noisy view of mu (correlation `observed` with it, so the history of
    the signal says more than its last value, as a real slow signal's does), and ``oracle``,
    mu itself (the oracle's forecast; not an input)."""
    symbol = table["symbol"].to_numpy(zero_copy_only=False)
    log_close = np.log(table["close"].to_numpy())
    k = ic / math.sqrt(1 - ic**2)
    mu, factor = np.zeros(len(symbol)), np.ones(len(symbol))
    starts = np.flatnonzero(np.r_[True, symbol[1:] != symbol[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(symbol)], strict=True):
        shocks = rng.normal(size=b - a) * math.sqrt(1 - persistence**2)
        shocks[0] = rng.normal()  # stationary from the first bar
        mu[a:b] = lfilter([1.0], [1.0, -persistence], shocks)  # mu[t] = p mu[t-1] + shock
        sigma = np.diff(log_close[a:b]).std() or 1.0
        path = np.r_[0.0, np.cumsum(k * sigma * mu[a : b - 1])]
        factor[a:b] = np.exp(path - np.median(path))  # the name's usual price level kept
    noise = rng.normal(size=len(symbol))
    columns = {"signal": observed * mu + math.sqrt(1 - observed**2) * noise, "oracle": mu}
    for name in ("open", "high", "low", "close"):
        price = table[name].to_numpy() * factor  # unrounded: no tick noise in a cheap name
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(price))
    for name, values in columns.items():
        table = table.append_column(name, pa.array(values))
    return table


def drift_panel_table(
    names: int = 250, days: int = 1500, seed: int = 0, ic: float = 0.3, persistence: float = 0.97
) -> pa.Table:
    """The synthetic panel with a slow alpha (`plant_drift`; observed with correlation 0.5)."""
    table = stock_panel_table(names, days=days, seed=seed)
    return plant_drift(table, ic, persistence, 0.5, np.random.default_rng(seed + 1_000_003))


def write_planted_panel(path: Path, table: pa.Table | None = None, **kw) -> list[str]:
    """Write the panel (`table`, or `planted_panel_table(**kw)`) to `path` (whole or not at
    all); the overrides that train on it."""
    table = planted_panel_table(**kw) if table is None else table
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: pq.write_table(table, f, compression="zstd"))
    return [*OVERRIDES, f"data.path={path.resolve()}"]


def pooled_corr(table: pa.Table) -> float:
    """The pooled correlation of ``signal`` with the next bar's log return (a check)."""
    same = pc.equal(table["symbol"][1:], table["symbol"][:-1]).to_numpy(zero_copy_only=False)
    r = np.diff(np.log(table["close"].to_numpy()))[same]
    return float(np.corrcoef(table["signal"].to_numpy()[:-1][same], r)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--names", type=int, default=250)
    ap.add_argument("--days", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corr", type=float, default=0.1)
    a = ap.parse_args()
    print(
        " ".join(write_planted_panel(a.out, names=a.names, days=a.days, seed=a.seed, corr=a.corr))
    )


if __name__ == "__main__":
    main()
