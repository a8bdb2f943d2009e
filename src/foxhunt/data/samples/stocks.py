"""A deterministic synthetic daily stock panel, as a data vendor delivers it (for examples,
tests and the studies): :func:`make_stock_panel` writes it, :func:`stock_panel_table` says
what it holds. The same arguments always give the same table."""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from foxhunt.data.samples.es import SCHEMA, volatility_factor
from foxhunt.files import write_atomic

PANEL_SCHEMA = pa.schema([*SCHEMA, pa.field("sector", pa.int64())])
"""Column names and types of the stock panel, in order: the futures sample's, then ``sector``."""

PANEL_DAYS = 1044
"""Default length of the stock panel: about four years of business days."""

PANEL_END = "2025-12-31"
"""Last business day of the stock panel by default: a fixed date, so the file never changes."""

PANEL_SECTORS = 11
"""Default number of sector codes in the stock panel."""

_PANEL_BAR_NS = 21 * 60 * 60_000_000_000  # daily bars stamped 21:00 UTC, after the 20:00 close
_LATE_SHARE = 0.25  # of the stocks: listed after the first day, ...
_DELISTED_SHARE = 0.06  # ... delisted before the last day, ...
_HALTED_SHARE = 0.06  # ... halted for a run of days (three groups that do not overlap)
_MARKET_VOL = 0.009  # daily, before volatility clustering
_SECTOR_VOL = 0.006
_IDIO_VOL = (0.008, 0.03)  # per stock, log-uniform between these
_MAX_TICKERS = 100_000  # of the 26**3 + 26**4 three- and four-letter tickers


def _tickers(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct three- or four-letter tickers (letters only: none parses as a futures
    contract, which ends in a year's digits)."""
    found: dict[str, None] = {}
    while len(found) < n:
        letters = rng.integers(0, 26, size=(2 * n, 4)) + ord("A")
        lengths = rng.integers(3, 5, size=2 * n)
        for row, k in zip(letters.tolist(), lengths.tolist(), strict=True):
            found.setdefault("".join(map(chr, row[:k])))
    return np.array(list(found)[:n])


@dataclass(frozen=True)
class _Stocks:
    """What stays fixed per stock: [n] each."""

    tickers: np.ndarray
    sector: np.ndarray  # its code, 0 .. min(sectors, n) - 1
    beta: np.ndarray  # to the market factor
    loading: np.ndarray  # on its sector's factor
    idio_vol: np.ndarray  # daily
    drift: np.ndarray  # daily
    log_p0: np.ndarray  # the log price on its listing day
    base_volume: np.ndarray


def _stocks(rng: np.random.Generator, n: int, sectors: int) -> _Stocks:
    tickers = _tickers(rng, n)
    return _Stocks(
        tickers=tickers,
        sector=rng.permutation(np.arange(n) % min(sectors, n)),
        beta=np.clip(rng.normal(1.0, 0.3, size=n), 0.3, 2.0),
        loading=rng.uniform(0.5, 1.5, size=n),
        idio_vol=np.exp(rng.uniform(*np.log(_IDIO_VOL), size=n)),
        drift=rng.normal(0.0002, 0.0003, size=n),
        log_p0=rng.uniform(math.log(15.0), math.log(400.0), size=n),
        base_volume=np.exp(rng.uniform(math.log(2e5), math.log(2e7), size=n)),
    )


def _lifetimes(rng: np.random.Generator, n: int, days: int) -> tuple[np.ndarray, np.ndarray]:
    """([n] each stock's listing day, [n, days] whether it trades that day): business days
    [first, stop), less one halt."""
    first = np.zeros(n, dtype=np.int64)
    stop = np.full(n, days, dtype=np.int64)
    roles = rng.permutation(n)
    n_late, n_delisted, n_halted = (
        round(share * n) for share in (_LATE_SHARE, _DELISTED_SHARE, _HALTED_SHARE)
    )
    late = roles[:n_late]
    delisted = roles[n_late : n_late + n_delisted]
    halted = roles[n_late + n_delisted : n_late + n_delisted + n_halted]
    first[late] = rng.integers(days // 20 + 1, days * 3 // 5 + 1, size=late.size)
    stop[delisted] = rng.integers(days * 2 // 5, days * 9 // 10, size=delisted.size)
    halt_days = np.minimum(rng.integers(1, 31, size=halted.size), days // 10)
    halt_start = rng.integers(days // 5, days * 4 // 5 - halt_days)
    t = np.arange(days)
    present = (t >= first[:, None]) & (t < stop[:, None])
    for i, h0, length in zip(halted, halt_start, halt_days, strict=True):
        present[i, h0 : h0 + length] = False
    return first, present


def _bars(
    rng: np.random.Generator, s: _Stocks, first: np.ndarray, days: int, sectors: int
) -> dict[str, np.ndarray]:
    """[n, days] every stock's log open, high, low, close and its volume, on every day (also
    those it does not trade): the factor model of `stock_panel_table`'s docstring."""
    n = len(s.tickers)
    lam = volatility_factor(rng, days, 0.97, 0.06)  # persistent daily log-volatility
    t4 = math.sqrt(2.0)  # Student-t(4) has variance 2
    market = lam * _MARKET_VOL * rng.standard_t(4.0, size=days) / t4
    sector_factor = lam * _SECTOR_VOL * rng.normal(0.0, 1.0, size=(min(sectors, n), days))
    idio = s.idio_vol[:, None] * rng.standard_t(4.0, size=(n, days)) / t4
    r = (
        s.drift[:, None]
        + s.beta[:, None] * market
        + s.loading[:, None] * sector_factor[s.sector]
        + idio
    )
    own_sd = np.sqrt((s.beta * _MARKET_VOL) ** 2 + (s.loading * _SECTOR_VOL) ** 2 + s.idio_vol**2)
    sd = lam * own_sd[:, None]
    gap = 0.3 * r + 0.2 * sd * rng.normal(0.0, 1.0, size=(n, days))  # previous close -> open
    log_close = np.cumsum(r, axis=1)
    log_close += (s.log_p0 - log_close[np.arange(n), first])[:, None]  # p0 on the listing day
    log_open = log_close - (r - gap)
    reach = 0.4 * sd * np.abs(rng.normal(0.0, 1.0, size=(2, n, days)))
    surprise = np.abs(r - s.drift[:, None]) / sd
    volume = (
        s.base_volume[:, None]
        * lam**0.8
        * (1.0 + 1.5 * surprise)
        * np.exp(rng.normal(-0.06, 0.35, size=(n, days)))
    )
    return {
        "open": log_open,
        "high": np.maximum(log_open, log_close) + reach[0],
        "low": np.minimum(log_open, log_close) - reach[1],
        "close": log_close,
        "volume": volume,
    }


def _panel_rows(
    day_ns: np.ndarray, s: _Stocks, present: np.ndarray, bars: dict[str, np.ndarray]
) -> pa.Table:
    """The rows of the days each stock trades, by ticker, then time."""
    order = np.argsort(s.tickers, kind="stable")
    keep = present[order]
    rows, days_of_row = np.nonzero(keep)

    def take(a: np.ndarray) -> np.ndarray:
        return a[order][keep]

    o, c = _to_cent(np.exp(take(bars["open"]))), _to_cent(np.exp(take(bars["close"])))
    hi = np.maximum(_to_cent(np.exp(take(bars["high"]))), np.maximum(o, c))
    lo = np.minimum(_to_cent(np.exp(take(bars["low"]))), np.minimum(o, c))
    arrays = [
        pa.array(day_ns[days_of_row], type=pa.int64()).cast(PANEL_SCHEMA.field("timestamp").type),
        pa.array(s.tickers[order].tolist(), type=pa.string()).take(pa.array(rows)),
        *(pa.array(p, type=pa.float64()) for p in (o, hi, lo, c)),
        pa.array(np.maximum(np.rint(take(bars["volume"])), 1.0).astype(np.int64), type=pa.int64()),
        pa.array(s.sector[order][rows], type=pa.int64()),
    ]
    return pa.Table.from_arrays(arrays, schema=PANEL_SCHEMA)


def stock_panel_table(
    n_instruments: int = 50,
    *,
    days: int = PANEL_DAYS,
    seed: int = 0,
    sectors: int = PANEL_SECTORS,
    end: str = PANEL_END,
) -> pa.Table:
    """Build a synthetic daily stock panel in memory, as a data vendor delivers one.

    ``n_instruments`` stocks with letter tickers (``"QBXT"``), daily bars stamped 21:00 UTC on
    the ``days`` business days (Mon-Fri, holidays ignored) ending at ``end`` (rolled back to a
    business day). Columns are :data:`PANEL_SCHEMA`: OHLC prices in cents (``low <= open,
    close <= high``, all at least 0.01), ``volume`` (int64 > 0) and ``sector``, an integer code
    ``0 .. min(sectors, n_instruments) - 1``, constant per stock, every code used. What it
    imitates:

    * **Returns**: a common market factor (with volatility clustering: a persistent daily
      log-volatility AR(1)) times a beta per stock, a factor per sector times a loading, and
      idiosyncratic Student-t(4) noise whose level differs by stock (0.8 % to 3 % a day), so
      same-sector stocks move together more than stocks of different sectors. Each day's
      return is an overnight gap (open against the previous close) plus the open-to-close move.
    * **Lifetimes**: most stocks trade from the first day to the last; a quarter are listed
      later (up to 60 % into the panel), a few (6 %) are delisted before the end, and a few
      others (6 %) are halted once for a run of 1 to 30 business days (no rows while halted;
      the price moves on meanwhile, so the first bar after the halt gaps).
    * **Volume**: a level per stock, higher on volatile days and in volatile markets.

    Rows are sorted by ``(symbol, timestamp)``, each stock one contiguous, strictly increasing
    block. The same arguments always give the same table.
    """
    n, days, sectors = int(n_instruments), int(days), int(sectors)
    if not 1 <= n <= _MAX_TICKERS:
        raise ValueError(f"n_instruments must be in 1..{_MAX_TICKERS}, got {n_instruments}")
    if days < 20:
        raise ValueError(f"days must be >= 20, got {days}")
    if sectors < 1:
        raise ValueError(f"sectors must be >= 1, got {sectors}")
    rng = np.random.default_rng(seed)
    last_day = np.busday_offset(np.datetime64(end, "D"), 0, roll="backward")
    dates = np.busday_offset(last_day, np.arange(1 - days, 1), roll="backward")
    day_ns = dates.astype("datetime64[ns]").astype(np.int64) + _PANEL_BAR_NS
    stocks = _stocks(rng, n, sectors)
    first, present = _lifetimes(rng, n, days)
    return _panel_rows(day_ns, stocks, present, _bars(rng, stocks, first, days, sectors))


def _to_cent(price: np.ndarray) -> np.ndarray:
    return np.maximum(np.round(price, 2), 0.01)


def make_stock_panel(
    path: str | pathlib.Path,
    n_instruments: int = 50,
    *,
    days: int = PANEL_DAYS,
    seed: int = 0,
    sectors: int = PANEL_SECTORS,
    end: str = PANEL_END,
) -> pathlib.Path:
    """Write a synthetic daily stock panel (:func:`stock_panel_table`) to a Parquet file and
    return its path; parent directories are created, and the file appears whole or not at all."""
    table = stock_panel_table(n_instruments, days=days, seed=seed, sectors=sectors, end=end)
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda f: pq.write_table(table, f, compression="zstd"))
    return out
