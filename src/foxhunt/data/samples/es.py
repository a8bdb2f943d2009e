"""Deterministic synthetic E-mini S&P 500 futures bars (for examples and tests), the bundled
sample; `foxhunt.data.samples` exports it beside the daily stock panel.

:func:`make_es_sample` writes a Parquet file of OHLCV bars that look like CME E-mini S&P 500
(ES) futures. It is a simulation, not market data; what it imitates:

* **Calendar.** One Globex session per business day (weekends skipped, holidays ignored), on
  Chicago's clock (`ZONE`, America/Chicago, with its daylight-saving changes): the session for
  trade date ``D`` runs from 17:00 on the previous calendar day to 16:00 on ``D`` (23 hours;
  16:00-17:00 is the daily maintenance break), so Monday's session opens on Sunday evening;
  the equity cash session is 08:30-15:00 Chicago time (09:30-16:00 in New York), and
  `conf/data/es_fut_small.yaml` names the zone and that close. In UTC the session opens at
  22:00 in US summer time and at 23:00 in winter. Timestamps are bar *starts*.
* **Returns.** 1-bar log returns are ``sigma_season * daily_factor * garch * t5_noise`` plus
  rare jumps: a U-shaped intraday volatility profile (quiet Asian hours, a European bump, an
  8:30 ET data spike, high at the US cash open and close), a daily log-volatility AR(1) factor
  (multi-day clustering) and a GARCH(1,1) on the standardised 5-minute shocks (intraday
  clustering) with Student-t(5) innovations. Daily volatility is about 1 %. Sessions open with a
  gap over the break (larger after weekends). Within each bar a Brownian bridge gives the high
  and the low, so ``high >= max(open, close)`` and ``low <= min(open, close)``.
* **Contracts and rolls.** Quarterly contracts (``ESH6``, ``ESM6``, ``ESU6``, ``ESZ6``: March,
  June, September, December; expiry the third Friday). Each contract's price is the latent
  index times ``exp(carry * years_to_expiry)`` (carry about 3 %/year, slowly wandering), so the
  back month trades at a calendar-spread premium of roughly 0.75 %. Around each roll date
  (the Thursday eight days before expiry) both contracts are in the file for seven business
  days (four before the roll date to two after) at the same timestamps; volume migrates from
  the expiring contract to the next one along a logistic curve that crosses on the roll date.
  Outside that window only the front contract is present.
* **Volume.** Intraday U-shape (cash hours far busier than overnight), correlated with the
  current volatility and with jumps, log-normal noise, about 1.5 million contracts a day in
  all; always a positive ``int64``.
* **Prices** are on the 0.25 index-point tick grid and start near 5000.

Rows are sorted by ``(symbol, timestamp)``; each symbol's rows form one contiguous, strictly
increasing series. With the defaults (80 business days of 5-minute bars starting 2026-03-02)
there are three contracts (``ESH6``, ``ESM6``, ``ESU6``; volume crosses over on 2026-03-12 and
2026-06-11), about 26k rows in all.
The same arguments always give the same table.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from foxhunt.files import write_atomic

SAMPLE_PATH = "data/ES_FUT_small.parquet"
"""Where the bundled sample lives (relative to the working directory, as conf/data/es_fut_small.yaml
says): the one path data.generate_if_missing may generate it at."""

ES_TICK = 0.25
"""Minimum price increment of the E-mini S&P 500 future, in index points."""

SCHEMA = pa.schema(
    [
        pa.field("timestamp", pa.timestamp("ns", tz="UTC")),
        pa.field("symbol", pa.string()),
        pa.field("open", pa.float64()),
        pa.field("high", pa.float64()),
        pa.field("low", pa.float64()),
        pa.field("close", pa.float64()),
        pa.field("volume", pa.int64()),
    ]
)
"""Column names and types of the sample file, in order."""

_DEFAULT_START = "2026-03-02"  # a Monday; 80 business days cover the March and June 2026 rolls
_SESSION_MINUTES = 23 * 60
_SESSION_OPEN_OFFSET_MIN = -120  # 17:00 Chicago on the previous day: 22:00 UTC in summer time
ZONE = "America/Chicago"  # the sample's clock (conf/data/es_fut_small.yaml's data.calendar)
_SUMMER_OFFSET_MIN = -300  # Chicago's UTC offset in summer time, the one the shapes are drawn in
_MONTH_CODES = {3: "H", 6: "M", 9: "U", 12: "Z"}
_ROLL_BEFORE_EXPIRY_DAYS = 8  # roll Thursday: eight calendar days before the expiry Friday
_OVERLAP_BEFORE = 4  # business days both contracts trade before the roll date ...
_OVERLAP_AFTER = 2  # ... and after it

_NS_PER_MIN = 60 * 1_000_000_000
_NS_PER_DAY = 1440 * _NS_PER_MIN
_YEAR_NS = 365.25 * _NS_PER_DAY

_DAILY_VOL = 0.0095  # intraday part; session gaps bring the daily total to about 1 %
_DAILY_VOLUME = 1.5e6
_GARCH_ALPHA = 0.04
_GARCH_BETA = 0.93
_T_DOF = 5.0
_BRIDGE_STEPS = 8


# Intraday shape by minute of the UTC day in US summer time (Chicago's clock plus 5 h), as
# (base, bump, decay minutes) per session segment:
# the Globex reopen (22:00 UTC), the Asian morning, Europe (from 07:00), the 12:30 US data bump,
# the US cash session's U between the 13:30 open and the 20:00 close, and the post-close hour.
_VOL_SHAPE = {
    "other": 0.30,
    "reopen": (0.30, 0.30, 15.0),
    "asia": (0.28, 0.12, 90.0),
    "europe": (0.45, 0.35, 45.0),
    "data": (1.20, 8.0),
    "cash": (0.80, 1.80, 25.0, 1.00, 20.0),
    "post": (0.40, 0.60, 10.0),
}
# Volume has a stronger U-shape than volatility.
_VOLUME_SHAPE = {
    "other": 0.06,
    "reopen": (0.06, 0.12, 15.0),
    "asia": (0.05, 0.04, 90.0),
    "europe": (0.15, 0.15, 45.0),
    "data": (0.50, 10.0),
    "cash": (0.90, 2.50, 20.0, 2.00, 15.0),
    "post": (0.12, 0.50, 8.0),
}


def _intraday_shape(m: np.ndarray, shape: dict) -> np.ndarray:
    """Relative intensity by minute of the UTC day (bar midpoint) for one of the shapes above."""
    m = np.asarray(m, dtype=np.float64)
    out = np.full(m.shape, shape["other"])
    base, bump, decay = shape["reopen"]
    reopen = m >= 1320
    out[reopen] = base + bump * np.exp(-(m[reopen] - 1320) / decay)
    base, bump, decay = shape["asia"]
    asia = m < 420
    out[asia] = base + bump * np.exp(-np.abs(m[asia] - 60) / decay)
    base, bump, decay = shape["europe"]
    europe = (m >= 420) & (m < 810)
    out[europe] = base + bump * np.exp(-(m[europe] - 420) / decay)
    bump, decay = shape["data"]
    data = (m >= 750) & (m < 810)
    out[data] += bump * np.exp(-(m[data] - 750) / decay)
    base, bump, decay, close_bump, close_decay = shape["cash"]
    cash = (m >= 810) & (m < 1200)
    out[cash] = (
        base
        + bump * np.exp(-(m[cash] - 810) / decay)
        + close_bump * np.exp(-(1200 - m[cash]) / close_decay)
    )
    base, bump, decay = shape["post"]
    post = (m >= 1200) & (m < 1260)
    out[post] = base + bump * np.exp(-(m[post] - 1200) / decay)
    return out


def _vol_shape(m: np.ndarray) -> np.ndarray:
    """Relative volatility by minute of the UTC day (bar midpoint)."""
    return _intraday_shape(m, _VOL_SHAPE)


def _volume_shape(m: np.ndarray) -> np.ndarray:
    """Relative volume by minute of the UTC day (bar midpoint)."""
    return _intraday_shape(m, _VOLUME_SHAPE)


def _symbol(year: int, month: int) -> str:
    return f"ES{_MONTH_CODES[month]}{year % 10}"


def _expiry(year: int, month: int) -> np.datetime64:
    """Third Friday of the contract month."""
    first = np.datetime64(f"{year:04d}-{month:02d}-01", "D")
    return np.busday_offset(first, 2, roll="forward", weekmask="Fri")


def _garch(z: np.ndarray, jump_units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GARCH(1,1) with unit unconditional variance on standardised shocks.

    ``z`` are unit-variance innovations; ``jump_units`` are jumps in units of the bar's base
    volatility, which feed into the next conditional variance (volatility after a jump).
    Returns ``(h, e)``: conditional variances and diffusive shocks ``sqrt(h) * z``.
    """
    a, b = _GARCH_ALPHA, _GARCH_BETA
    w = 1.0 - a - b
    n = z.shape[0]
    h = np.empty(n)
    zl = z.tolist()
    jl = jump_units.tolist()
    ht = 1.0
    for t in range(n):
        h[t] = ht
        et = math.sqrt(ht) * zl[t] + jl[t]
        ht = w + a * min(et * et, 30.0) + b * ht
    return h, np.sqrt(h) * z


def _contracts(start: np.datetime64, days: int) -> list[tuple[str, np.datetime64, int, int]]:
    """Contracts present in the window: ``(symbol, expiry, roll_index, prev_roll_index)``.

    Roll indices count business days from ``start`` (they may lie outside ``[0, days)``).
    """
    year = int(str(start)[:4]) - 1
    quarters = []
    for y in range(year, year + days // 250 + 4):
        for mth in (3, 6, 9, 12):
            exp = _expiry(y, mth)
            roll = exp - np.timedelta64(_ROLL_BEFORE_EXPIRY_DAYS, "D")
            roll_idx = int(np.busday_count(start, roll))
            quarters.append((_symbol(y, mth), exp, roll_idx))
    out = []
    for k in range(1, len(quarters)):
        sym, exp, roll_idx = quarters[k]
        prev_roll = quarters[k - 1][2]
        first = prev_roll - _OVERLAP_BEFORE
        last = roll_idx + _OVERLAP_AFTER
        if last >= 0 and first <= days - 1:
            out.append((sym, exp, roll_idx, prev_roll))
    return out


def _outgoing_share(rel_day: np.ndarray) -> np.ndarray:
    """Volume share of the expiring contract ``rel_day`` business days from the roll date."""
    return 1.0 / (1.0 + np.exp(1.3 * (rel_day + 0.5)))


def volatility_factor(rng: np.random.Generator, days: int, phi: float, eta: float) -> np.ndarray:
    """[days] a daily volatility factor exp(X) of a log-volatility AR(1) X (persistence `phi`,
    shock sd `eta`), scaled so that its mean square is about 1: multi-day clustering."""
    log_lam = np.empty(days)
    x = rng.normal(0.0, eta / math.sqrt(1 - phi**2))
    shocks = rng.normal(0.0, eta, size=days)
    for d in range(days):
        log_lam[d] = x
        x = phi * x + shocks[d]
    return np.exp(log_lam - (eta**2 / (1 - phi**2)))  # E[exp(2X)] = exp(2 var) -> mean square 1


@dataclass(frozen=True)
class _Clock:
    """When the bars are: `days` sessions of `per_day` bars of `bar_minutes`, bar by bar."""

    days: int
    bar_minutes: int
    per_day: int
    start_day: np.datetime64  # the first trade date
    trade_dates: np.ndarray  # [days] datetime64[D]
    ts: np.ndarray  # [n] bar starts, int64 nanoseconds
    day_idx: np.ndarray  # [n] the session of each bar
    mid_min: np.ndarray  # [n] each bar's midpoint: minute of the UTC day in US summer time

    @property
    def n(self) -> int:
        return self.days * self.per_day

    @property
    def day_mid_min(self) -> np.ndarray:
        """[per_day] the bar midpoints of one session (every session's are the same)."""
        return self.mid_min[: self.per_day]


def _clock(start: str, days: int, bar_minutes: int) -> _Clock:
    start_day = np.busday_offset(np.datetime64(start, "D"), 0, roll="forward")
    trade_dates = np.busday_offset(start_day, np.arange(days), roll="forward")
    bpd = _SESSION_MINUTES // bar_minutes
    day_ns = trade_dates.astype("datetime64[ns]").astype(np.int64)
    zone = ZoneInfo(ZONE)
    for i, d in enumerate(trade_dates.astype(object)):  # an hour later in UTC in winter time
        noon = datetime(d.year, d.month, d.day, 12, tzinfo=zone)
        day_ns[i] += int(_SUMMER_OFFSET_MIN * 60 - noon.utcoffset().total_seconds()) * 10**9
    offs_min = _SESSION_OPEN_OFFSET_MIN + bar_minutes * np.arange(bpd)
    return _Clock(
        days=days,
        bar_minutes=bar_minutes,
        per_day=bpd,
        start_day=start_day,
        trade_dates=trade_dates,
        ts=(day_ns[:, None] + offs_min[None, :] * _NS_PER_MIN).ravel(),
        day_idx=np.repeat(np.arange(days), bpd),
        mid_min=((offs_min + bar_minutes / 2.0) % 1440.0)[None, :].repeat(days, axis=0).ravel(),
    )


@dataclass(frozen=True)
class _Index:
    """The latent index's bars (log prices), the carry and the volume of all contracts."""

    log_open: np.ndarray
    log_high: np.ndarray
    log_low: np.ndarray
    log_close: np.ndarray
    carry: np.ndarray  # (r - q) per year
    volume: np.ndarray  # all contracts' together


def _index_bars(rng: np.random.Generator, clock: _Clock) -> _Index:
    """The index's bars; the draws from `rng` in this order keep the sample the same."""
    lam = volatility_factor(rng, clock.days, 0.85, 0.15)
    season = _vol_shape(clock.day_mid_min)
    sigma_bar = np.tile(_DAILY_VOL * season / math.sqrt(float(np.sum(season**2))), clock.days)
    base_sd = sigma_bar * lam[clock.day_idx]
    r, h, jump_size = _returns(rng, clock, base_sd)
    log_open, log_close = _open_close(rng, clock, r, lam)
    log_high, log_low = _high_low(rng, log_open, r, base_sd * np.sqrt(h))
    # Carry (r - q) per year, wandering slowly; sets the calendar spread.
    carry = np.clip(0.03 + np.cumsum(rng.normal(0.0, 6e-5, size=clock.n)), 0.005, 0.06)
    volume = _total_volume(rng, clock, lam, h, jump_size)
    return _Index(log_open, log_high, log_low, log_close, carry, volume)


def _returns(
    rng: np.random.Generator, clock: _Clock, base_sd: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1-bar log returns open -> close, GARCH variances, jumps): Student-t shocks through the
    GARCH, plus jumps, rare, more likely when the market is busy, often at the 12:30 UTC data
    bar."""
    z = rng.standard_t(_T_DOF, size=clock.n) * math.sqrt((_T_DOF - 2.0) / _T_DOF)
    m = clock.day_mid_min
    vshape = _volume_shape(m)
    p_jump = np.tile(0.0004 * vshape / vshape.mean(), clock.days)
    data_bar = np.tile((m >= 750) & (m < 750 + clock.bar_minutes), clock.days)
    p_jump = np.where(data_bar, 0.25, p_jump)
    jump_hit = rng.random(clock.n) < p_jump
    jump_size = rng.normal(0.0, 0.0025, size=clock.n) * jump_hit
    h, e = _garch(z, jump_size / base_sd)
    return base_sd * e + jump_size, h, jump_size


def _open_close(
    rng: np.random.Generator, clock: _Clock, r: np.ndarray, lam: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Log open and close from the returns and the gaps over the maintenance break (bigger over
    weekends)."""
    gap = np.zeros(clock.n)
    first_bar = np.arange(clock.days) * clock.per_day
    weekday = ((clock.trade_dates.astype(np.int64) + 3) % 7).astype(np.int64)  # Monday = 0
    gap_sd = np.where(weekday == 0, 0.004, 0.0012) * lam
    gap[first_bar] = rng.normal(0.0, 1.0, size=clock.days) * gap_sd
    gap[0] = 0.0
    log_close = math.log(5000.0) + np.cumsum(gap + r)
    return log_close - r, log_close


def _high_low(
    rng: np.random.Generator, log_open: np.ndarray, r: np.ndarray, diff_sd: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Log high and low from a Brownian bridge from 0 to r inside each bar."""
    steps = (
        rng.normal(0.0, 1.0, size=(len(r), _BRIDGE_STEPS))
        * (diff_sd / math.sqrt(_BRIDGE_STEPS))[:, None]
    )
    w = np.cumsum(steps, axis=1)
    frac = np.arange(1, _BRIDGE_STEPS + 1) / _BRIDGE_STEPS
    bridge = w - frac[None, :] * (w[:, -1:] - r[:, None])
    log_high = log_open + np.maximum(bridge.max(axis=1), 0.0)
    log_low = log_open + np.minimum(bridge.min(axis=1), 0.0)
    return log_high, log_low


def _total_volume(
    rng: np.random.Generator, clock: _Clock, lam: np.ndarray, h: np.ndarray, jumps: np.ndarray
) -> np.ndarray:
    """All contracts' volume per bar: the intraday U-shape, busier when volatile and at jumps."""
    vshape = _volume_shape(clock.day_mid_min)
    vol_scale = _DAILY_VOLUME / float(np.sum(vshape))
    return (
        vol_scale
        * np.tile(vshape, clock.days)
        * lam[clock.day_idx] ** 0.8
        * np.sqrt(h) ** 0.6
        * (1.0 + 2.0 * np.abs(jumps) / 0.0025)
        * np.exp(rng.normal(-0.045, 0.3, size=clock.n))
    )


def _contract_bars(
    rng: np.random.Generator,
    clock: _Clock,
    index: _Index,
    contract: tuple[str, np.datetime64, int, int],
) -> dict[str, np.ndarray]:
    """One contract's rows: the index's bars at its carry, on the tick grid, and its share of
    the volume (all of it, less what the expiring or the next contract trades around a roll)."""
    sym, expiry, roll_idx, prev_roll = contract
    d0 = max(prev_roll - _OVERLAP_BEFORE, 0)
    d1 = min(roll_idx + _OVERLAP_AFTER, clock.days - 1)
    sl = slice(d0 * clock.per_day, (d1 + 1) * clock.per_day)
    dd = clock.day_idx[sl]
    share = np.ones(dd.shape[0])
    outgoing = dd >= roll_idx - _OVERLAP_BEFORE
    share[outgoing] = _outgoing_share(dd[outgoing] - roll_idx)
    incoming = dd <= prev_roll + _OVERLAP_AFTER
    share[incoming] = 1.0 - _outgoing_share(dd[incoming] - prev_roll)

    expiry_ns = int(expiry.astype("datetime64[ns]").astype(np.int64)) + 810 * _NS_PER_MIN
    tau = (expiry_ns - clock.ts[sl]) / _YEAR_NS
    adj = index.carry[sl] * tau
    o = _to_tick(np.exp(index.log_open[sl] + adj))
    c = _to_tick(np.exp(index.log_close[sl] + adj))
    hi = np.maximum(_to_tick(np.exp(index.log_high[sl] + adj)), np.maximum(o, c))
    lo = np.minimum(_to_tick(np.exp(index.log_low[sl] + adj)), np.minimum(o, c))
    noise = np.exp(rng.normal(-0.02, 0.2, size=dd.shape[0]))
    vol = np.maximum(np.rint(index.volume[sl] * share * noise), 1.0).astype(np.int64)
    return {
        "timestamp": clock.ts[sl],
        "symbol": np.full(dd.shape[0], sym, dtype=object),
        "open": o,
        "high": hi,
        "low": lo,
        "close": c,
        "volume": vol,
    }


def es_sample_table(
    *, days: int = 80, bar_minutes: int = 5, seed: int = 0, start: str = _DEFAULT_START
) -> pa.Table:
    """Build the synthetic ES bar table in memory (see the module docstring)."""
    if int(days) < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    if int(bar_minutes) < 1 or _SESSION_MINUTES % int(bar_minutes) != 0:
        raise ValueError(f"bar_minutes must divide the 1380-minute session, got {bar_minutes}")
    days, bar_minutes = int(days), int(bar_minutes)
    rng = np.random.default_rng(seed)
    clock = _clock(start, days, bar_minutes)
    index = _index_bars(rng, clock)
    pieces = [_contract_bars(rng, clock, index, c) for c in _contracts(clock.start_day, days)]
    pieces.sort(key=lambda p: str(p["symbol"][0]))
    cols = {k: np.concatenate([p[k] for p in pieces]) for k in SCHEMA.names}
    arrays = [
        pa.array(cols["timestamp"], type=pa.int64()).cast(SCHEMA.field("timestamp").type),
        pa.array(cols["symbol"].tolist(), type=pa.string()),
        *(pa.array(cols[k], type=pa.float64()) for k in ("open", "high", "low", "close")),
        pa.array(cols["volume"], type=pa.int64()),
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _to_tick(price: np.ndarray) -> np.ndarray:
    return np.rint(price / ES_TICK) * ES_TICK


def make_es_sample(
    path: str | pathlib.Path,
    *,
    days: int = 80,
    bar_minutes: int = 5,
    seed: int = 0,
    start: str = _DEFAULT_START,
) -> pathlib.Path:
    """Write synthetic E-mini S&P 500 futures bars to a Parquet file and return its path.

    Columns: ``timestamp`` (``timestamp[ns, tz=UTC]``, bar start), ``symbol`` (contract, e.g.
    ``"ESH6"``), ``open``/``high``/``low``/``close`` (float64 on the 0.25 tick grid) and
    ``volume`` (int64 > 0). ``days`` business days of ``bar_minutes`` bars (which must divide
    the 23-hour session) starting at ``start`` (rolled forward to a business day); the same
    arguments always give the same data. Parent directories are created, and the file appears
    whole or not at all (a generation killed midway leaves no half file to be read).
    """
    table = es_sample_table(days=days, bar_minutes=bar_minutes, seed=seed, start=start)
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda f: pq.write_table(table, f, compression="zstd"))
    return out
