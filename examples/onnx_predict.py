"""Forecast with a foxhunt TFT exported to ONNX, using no foxhunt and no torch.

    python examples/onnx_predict.py EXPORT_DIR DATA.parquet OUT.parquet [--all-windows]
                                    [--batch-size 256] [--threads 0] [--overwrite]

EXPORT_DIR holds model.onnx and model.json (`python scripts/export.py ckpt_path=...`). The
output is the table `python scripts/predict.py` writes for the same data: one row per
instrument, origin and horizon step, with `instrument`, `origin_time`, `horizon`,
`target_time`, one column per quantile in the target's own units, `actual`. Each instrument's
latest window, or with --all-windows every window with a full encoder history.

A reference for a runtime in another language: it needs numpy, pyarrow and onnxruntime, and
takes everything else from model.json (column names, features and their derivation, the
normalization, the futures roll). The steps, one function each:

1. `split_future`: each instrument's rows after its last target value are the bars to forecast;
2. `continuous` (futures only): each root's held contracts over time (the roll schedule of
   `foxhunt.data.futures`) as one back-adjusted series;
3. `make_series`: per instrument, the NaN policy, the features (columns, or derived from the
   OHLCV bars), the warm-up rows dropped;
4. `build_windows`: the encoder rows and the forecast steps' known inputs (given in the rows to
   forecast, or the calendar of times continued at the bar interval), normalized;
5. `forecast`: ONNX Runtime over batches; `calibrate`: model.json's conformal offsets (CQR,
   or ACI adapting them to the realized targets in the data), the quantiles put in order;
   then scaled back.

Bad input is one line, `error: ...`, and exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FORMAT, FORMAT_VERSION = "foxhunt-onnx", 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
DAY_NS = 86_400 * 10**9
EXPIRED_NS = 4 * DAY_NS  # a front whose bars end this long before the data's has expired
MONTH_CODES = "FGHJKMNQUVXZ"  # January .. December
PRICES = ("open", "high", "low", "close")


class InputError(Exception):
    """A problem with the export or the data: one line, exit code 2."""


# --- the export ------------------------------------------------------------------------------


def read_export(export_dir: Path) -> tuple[dict[str, Any], bytes]:
    """model.json and the model.onnx it describes (checked by its SHA-256)."""
    try:
        meta = json.loads((export_dir / "model.json").read_text())
        model = (export_dir / meta["model_file"]).read_bytes()
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{export_dir} holds no foxhunt ONNX export: {exc}") from None
    if meta.get("format") != FORMAT or meta.get("format_version", 0) > FORMAT_VERSION:
        raise InputError(
            f"{export_dir}/model.json is not a {FORMAT} export of version {FORMAT_VERSION} or "
            f"earlier (format {meta.get('format')!r}, version {meta.get('format_version')!r})"
        )
    if hashlib.sha256(model).hexdigest() != meta.get("sha256"):
        raise InputError(f"{export_dir}/{meta['model_file']} is not the one model.json describes")
    return meta, model


# --- reading ---------------------------------------------------------------------------------


def time_ns(table: pa.Table, column: str, unit: str | None) -> np.ndarray:
    """A time column as int64 nanoseconds since 1970 UTC (an integer column in `unit`)."""
    col = table.column(column)
    if col.null_count:
        raise InputError(f"time column '{column}' has {col.null_count} null values")
    if pa.types.is_integer(col.type):
        if unit is None:
            raise InputError(f"time column '{column}' holds integers, and model.json no unit")
        col = pc.cast(pc.cast(col, pa.int64()), pa.timestamp(unit))
    elif pa.types.is_date(col.type):
        col = pc.cast(col, pa.timestamp("ms"))
    elif not pa.types.is_timestamp(col.type):
        raise InputError(f"time column '{column}' is {col.type}, expected a timestamp or integer")
    col = pc.cast(col, pa.timestamp("ns", tz=col.type.tz))
    return pc.cast(col, pa.int64()).to_numpy()


def as_float(table: pa.Table, column: str) -> np.ndarray:
    """A numeric column as float64 (nulls as NaN)."""
    col = table.column(column)
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise InputError(f"column '{column}' is {t}, expected a numeric column")
    return pc.cast(col, pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def as_text(table: pa.Table, column: str) -> pa.ChunkedArray:
    return pc.cast(table.column(column), pa.string())


def group_codes(table: pa.Table, column: str | None) -> tuple[np.ndarray, list[str]]:
    """Each row's instrument as an index into the sorted instrument names, and those names."""
    if column is None:
        return np.zeros(table.num_rows, dtype=np.int64), ["series"]
    if table.column(column).null_count:
        raise InputError(f"group column '{column}' has null values")
    text = as_text(table, column)
    names = sorted(pc.unique(text).to_pylist())
    codes = pc.index_in(text, value_set=pa.array(names, pa.string())).to_numpy()
    return codes.astype(np.int64), names


@dataclass
class Future:
    """One instrument's rows after its last target value: their times and known inputs."""

    time_ns: np.ndarray
    known: dict[str, np.ndarray]


def split_future(table: pa.Table, data: dict[str, Any]) -> tuple[pa.Table, dict[str, Future]]:
    """The table without each instrument's rows after its last target value (the target, or
    the close when the target is derived, empty), and those rows by instrument."""
    source = data["target_column"] or data["ohlcv"]["close"]
    empty = pc.is_null(table.column(source), nan_is_null=True).to_numpy(zero_copy_only=False)
    if not empty.any():
        return table, {}
    codes, names = group_codes(table, data["group_column"])
    future = np.zeros(table.num_rows, dtype=bool)
    for g in np.unique(codes[empty]):
        rows = np.flatnonzero(codes == g)
        filled = np.flatnonzero(~empty[rows])
        future[rows[filled[-1] + 1 if len(filled) else 0 :]] = True
    if not future.any():
        return table, {}
    after = table.filter(pa.array(future))
    t = time_ns(after, data["time_column"], data["time_unit"])
    known = {k: as_float(after, k) for k in data["known_columns"] if k in after.column_names}
    after_codes = codes[future]
    by_name = {}
    for g in np.unique(after_codes):
        rows = after_codes == g
        by_name[names[g]] = Future(t[rows], {k: v[rows] for k, v in known.items()})
    if data["futures"] is not None:  # under the root of their contract, from one contract
        by_name = by_root(by_name, after, after_codes, names, data["futures"])
    return table.filter(pa.array(~future)), by_name


def by_root(
    by_contract: dict[str, Future], after: pa.Table, codes: np.ndarray, names: list, futures: dict
) -> dict[str, Future]:
    roots: dict[str, list[str]] = {}
    for g in np.unique(codes):
        contract = names[g]
        if futures["root_column"]:
            root = str(after[futures["root_column"]].filter(pa.array(codes == g))[0].as_py())
        else:
            found = re.match(futures["root_pattern"], str(contract))
            root = found["root"] if found else str(contract)
        roots.setdefault(root, []).append(contract)
    for root, contracts in roots.items():
        if len(contracts) > 1:
            raise InputError(
                f"rows to forecast (an empty close) follow the bars of {len(contracts)} "
                f"contracts of {root}: {', '.join(map(str, contracts))}; give them for one "
                "contract of a root"
            )
    return {root: by_contract[contracts[0]] for root, contracts in roots.items()}


# --- futures: contracts to one continuous series per root ------------------------------------


@dataclass
class Contract:
    id: str
    root: str
    month: int | None
    year: int | None
    time_ns: np.ndarray
    prices: dict[str, np.ndarray]
    volume: np.ndarray
    open_interest: np.ndarray | None
    expiry_ns: int | None
    rows: np.ndarray

    @property
    def expiry(self) -> int:
        if self.expiry_ns is not None:
            return self.expiry_ns
        if self.month is None:
            raise InputError(f"contract {self.id} has no expiry (no month code, no column)")
        return third_friday(self.year, self.month)

    @property
    def order(self) -> int:
        known = self.expiry_ns is not None or self.month is not None
        return self.expiry if known else int(self.time_ns[-1])


def parse_contract(contract_id: str, first_ns: int, pattern: str) -> tuple[str, int, int]:
    """(root, month, year) of a contract id; a one- or two-digit year is the nearest such year
    at or after the year of the contract's first bar, less one."""
    found = re.match(pattern, contract_id)
    if found is None or not {"root", "month", "year"} <= set(found.groupdict()):
        raise InputError(f"contract '{contract_id}' does not parse as root + month + year")
    root, code, digits = found["root"], found["month"], found["year"]
    if code not in MONTH_CODES:
        raise InputError(f"contract '{contract_id}': '{code}' is no month code")
    start = int(np.datetime64(int(first_ns), "ns").astype("datetime64[Y]").astype(int)) + 1970
    if len(digits) >= 3:
        year = int(digits)
    else:
        base = 10 ** len(digits)
        year = start - 1 + (int(digits) - (start - 1)) % base
    return root, MONTH_CODES.index(code) + 1, year


def third_friday(year: int, month: int) -> int:
    first = np.datetime64(f"{year:04d}-{month:02d}-01", "D")
    weekday = (first.astype(int) + 3) % 7  # Monday = 0
    friday = first + (4 - weekday) % 7 + 14
    return int(friday.astype("datetime64[ns]").astype(np.int64))


def roll_schedule(contracts: list[Contract], roll: dict[str, Any]) -> list[tuple[int, Contract]]:
    """(first bar held, contract) of each roll of a root's held contract over time, as
    foxhunt.data.futures.roll_schedule: the front is held until the rule moves it to a later
    contract, decided from the bars before (no look-ahead), never back; a front still trading
    at the end of the data stays held; an expired one with no signal rolls at its last bar."""
    if roll["rule"] == "open_interest" and any(c.open_interest is None for c in contracts):
        raise InputError("the open interest roll needs the open interest column")
    ordered = sorted(contracts, key=lambda c: c.order)
    end = max(int(c.time_ns[-1]) for c in ordered)
    rolls, k, held_from = [], 0, int(ordered[0].time_ns[0])
    while found := next_roll(ordered, k, held_from, end, roll):
        held_from, k = found
        rolls.append((held_from, ordered[k]))
    return rolls


def next_roll(
    ordered: list[Contract], k: int, held_from: int, end: int, roll: dict[str, Any]
) -> tuple[int, int] | None:
    """(first bar held, index in `ordered`) of the roll from `ordered[k]`, or None: held to the
    end. The earliest signal of a later contract trading while the front does, the nearest
    month on a tie; else, if the front expired, the next contract trading after it."""
    front = ordered[k]
    last = int(front.time_ns[-1])
    later = [j for j in range(k + 1, len(ordered)) if ordered[j].time_ns[-1] >= held_from]
    signals = [
        (at, j)
        for j in later
        if ordered[j].time_ns[0] <= last
        and (at := signal(front, ordered[j], held_from, roll)) is not None
    ]
    if signals:
        return min(signals)
    after = [j for j in later if ordered[j].time_ns[-1] > last]
    if end - last <= EXPIRED_NS or not after:
        return None
    nxt = ordered[after[0]]
    at = int(nxt.time_ns[np.searchsorted(nxt.time_ns, last, "right")])
    if len(np.intersect1d(front.time_ns[front.time_ns >= held_from], nxt.time_ns)):
        if roll.get("strict", False):
            raise InputError(f"contracts {front.id} and {nxt.id}: no roll signal ({roll['rule']})")
        print(
            f"warning: {front.id} expired with no roll signal: rolled to {nxt.id} at its last bar",
            file=sys.stderr,
        )
    return at, after[0]


def signal(front: Contract, nxt: Contract, held_from: int, roll: dict[str, Any]) -> int | None:
    """The first bar of `nxt` held if the rule moves the front to it, else None."""
    rule, last = roll["rule"], int(front.time_ns[-1])
    if rule in ("volume", "open_interest"):
        common, fi, ni = np.intersect1d(front.time_ns, nxt.time_ns, return_indices=True)
        mine = common >= held_from
        a, b = getattr(front, rule), getattr(nxt, rule)
        ahead = b[ni[mine]] > a[fi[mine]]
        confirm = roll["confirm_bars"]
        run = np.convolve(ahead, np.ones(confirm, int), "full")[: len(ahead)]
        confirmed = np.flatnonzero(run >= confirm)
        if len(confirmed) == 0:
            return None
        i = np.searchsorted(nxt.time_ns, common[mine][confirmed[0]], "right")  # the next bar
        return int(nxt.time_ns[i]) if i < len(nxt.time_ns) else None
    if rule == "days_before_expiry":
        due = max(front.expiry - roll["days"] * DAY_NS, held_from)
    else:  # fixed: the first date after the front became held
        due = next((d for d in sorted(roll["dates_ns"]) if d > held_from), None)
    if due is None or due > last:
        return None
    i = np.searchsorted(nxt.time_ns, due)
    return int(nxt.time_ns[i]) if i < len(nxt.time_ns) else None


def stitch(
    first: Contract, rolls: list[tuple[int, Contract]], adjust: str
) -> tuple[np.ndarray, dict]:
    """The held bars' rows (table row numbers) and their prices adjusted backwards: ratio
    multiplies earlier prices by the next contract's close over the front's at the last common
    bar before each roll, difference adds the difference of those closes, none leaves them."""
    ordered = [first, *(c for _, c in rolls)]
    bounds = [ordered[0].time_ns[0], *(t for t, _ in rolls), np.iinfo(np.int64).max]
    held, factors = [], []
    for k, c in enumerate(ordered):
        held.append((c.time_ns >= bounds[k]) & (c.time_ns < bounds[k + 1]))
        if k == 0:
            continue
        front = ordered[k - 1]
        before = np.intersect1d(front.time_ns, c.time_ns[c.time_ns < bounds[k]])
        if len(before) == 0:
            factors.append(1.0 if adjust == "ratio" else 0.0)
            continue
        old = front.prices["close"][np.searchsorted(front.time_ns, before[-1])]
        new = c.prices["close"][np.searchsorted(c.time_ns, before[-1])]
        factors.append(new / old if adjust == "ratio" else new - old)
    n = len(ordered)
    scale = [float(np.prod(factors[k:])) if adjust == "ratio" else 1.0 for k in range(n)]
    shift = [float(np.sum(factors[k:])) if adjust == "difference" else 0.0 for k in range(n)]
    pieces = list(zip(ordered, held, scale, shift, strict=True))
    prices = {p: np.concatenate([c.prices[p][h] * a + b for c, h, a, b in pieces]) for p in PRICES}
    return np.concatenate([c.rows[h] for c, h in zip(ordered, held, strict=True)]), prices


def continuous(table: pa.Table, data: dict[str, Any]) -> pa.Table:
    """The rows of each root's held contracts, prices adjusted, the group column the root."""
    f, roll, ohlcv = data["futures"], data["futures"]["roll"], data["ohlcv"]
    group = data["group_column"]
    t = time_ns(table, data["time_column"], data["time_unit"])
    ids = np.asarray(as_text(table, group).to_pylist(), dtype=object)
    values = {p: as_float(table, ohlcv[p]) for p in (*PRICES, "volume")}
    interest = (
        as_float(table, roll["open_interest_column"]) if roll["open_interest_column"] else None
    )
    expiries = None
    if roll["expiry_column"]:
        col = table.column(roll["expiry_column"])
        if pa.types.is_date(col.type):
            col = pc.cast(col, pa.timestamp("ms"))
        col = pc.cast(pc.cast(col, pa.timestamp("ns")), pa.int64())
        expiries = pc.fill_null(col, -1).to_numpy()
    roots = as_text(table, f["root_column"]).to_pylist() if f["root_column"] else None
    by_root: dict[str, list[Contract]] = {}
    for contract_id in sorted(set(ids)):
        rows = np.flatnonzero(ids == contract_id)
        rows = rows[np.argsort(t[rows], kind="stable")]
        if roots is None:
            root, month, year = parse_contract(contract_id, t[rows[0]], f["root_pattern"])
        else:
            found = sorted({roots[r] for r in rows})
            if len(found) != 1:
                raise InputError(f"contract {contract_id} has {len(found)} roots")
            try:
                _, month, year = parse_contract(contract_id, t[rows[0]], f["root_pattern"])
            except InputError:
                month = year = None
            root = found[0]
        expiry = None
        if expiries is not None:
            if (expiries[rows] == -1).any():
                raise InputError(f"the expiry column is empty in rows of contract {contract_id}")
            expiry = int(expiries[rows].max())
        by_root.setdefault(root, []).append(
            Contract(
                contract_id,
                root,
                month,
                year,
                t[rows],
                {p: values[p][rows] for p in PRICES},
                values["volume"][rows],
                None if interest is None else interest[rows],
                expiry,
                rows,
            )
        )
    parts, adjusted, names = [], {p: [] for p in PRICES}, []
    for root, contracts in sorted(by_root.items()):
        first = min(contracts, key=lambda c: c.order)
        rows, prices = stitch(first, roll_schedule(contracts, roll), roll["adjust"])
        parts.append(rows)
        names.append(np.full(len(rows), root, dtype=object))
        for p in PRICES:
            adjusted[p].append(prices[p])
    out = table.take(pa.array(np.concatenate(parts)))
    for p in PRICES:
        i = out.schema.get_field_index(ohlcv[p])
        out = out.set_column(i, ohlcv[p], pa.array(np.concatenate(adjusted[p])))
    i = out.schema.get_field_index(group)
    return out.set_column(i, group, pa.array(np.concatenate(names), pa.string()))


# --- features --------------------------------------------------------------------------------


def _prefix(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x) + 1)
    out[0] = 0.0
    np.cumsum(x, out=out[1:])
    return out


def _window_sum(prefix: np.ndarray, w: int) -> np.ndarray:
    """Sum of rows t-w+1..t from a prefix sum; NaN for t < w - 1."""
    n = len(prefix) - 1
    out = np.full(n, np.nan)
    if w <= n:
        out[w - 1 :] = prefix[w:] - prefix[: n - w + 1]
    return out


def _rolling(x: np.ndarray, w: int, op: Any) -> np.ndarray:
    """`op` (np.max, np.min) of rows t-w+1..t; NaN for t < w - 1."""
    out = np.full(len(x), np.nan)
    if w <= len(x):
        out[w - 1 :] = op(np.lib.stride_tricks.sliding_window_view(x, w), axis=1)
    return out


class Ohlcv:
    """The features of one instrument's bars, by family and window (model.json's
    `derivations`), each rounded to float32 as foxhunt computes them."""

    def __init__(self, t: np.ndarray, cols: dict[str, np.ndarray], ohlcv: dict[str, Any]):
        self.t = t
        self.high, self.low, self.close = (cols[ohlcv[p]] for p in ("high", "low", "close"))
        if len(t) and not all(np.isfinite(a).all() and (a > 0).all() for a in self.prices()):
            raise InputError("high, low and close prices must be finite and positive")
        self.volume = cols[ohlcv["volume"]]
        self.logc = np.log(self.close)
        ret = np.full(len(t), np.nan)
        ret[1:] = np.diff(self.logc)
        self.ret = ret
        ret0 = np.nan_to_num(ret, nan=0.0)
        self.p_ret, self.p_ret2 = _prefix(ret0), _prefix(ret0 * ret0)

    def prices(self) -> tuple[np.ndarray, ...]:
        return self.high, self.low, self.close

    def rvol(self, w: int) -> np.ndarray:
        s2 = _window_sum(self.p_ret2, w)
        if w <= len(self.t):
            s2[w - 1] = np.nan  # its window would hold r_0, which does not exist
        return np.sqrt(np.maximum(s2, 0.0) / w)

    def feature(self, family: str, w: int) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            if family == "log_return":
                val = self.ret
            elif family == "logret":
                val = np.full(len(self.t), np.nan)
                if w < len(self.t):
                    val[w:] = self.logc[w:] - self.logc[:-w]
            elif family == "rvol":
                val = self.rvol(w)
            elif family == "mom":
                s, vol = _window_sum(self.p_ret, w), self.rvol(w)
                den = math.sqrt(w) * vol
                val = np.where(den > 1e-12, s / np.where(den > 1e-12, den, 1.0), 0.0)
                val[np.isnan(vol)] = np.nan
            elif family == "volz":
                x = np.log1p(np.maximum(self.volume, 0.0))
                mean = _window_sum(_prefix(x), w) / w
                var = _window_sum(_prefix(x * x), w) / w - mean * mean
                ok = var > 1e-10 * np.maximum(1.0, mean * mean)
                val = np.where(ok, (x - mean) / np.sqrt(np.where(ok, var, 1.0)), 0.0)
                val[np.isnan(mean)] = np.nan
            elif family in ("range", "clv"):
                mx, mn = _rolling(self.high, w, np.max), _rolling(self.low, w, np.min)
                if family == "range":
                    val = np.log(mx / mn)
                else:
                    rng = mx - mn
                    val = np.where(rng > 0, (self.close - mn) / np.where(rng > 0, rng, 1.0), 0.5)
                    val = np.clip(val, 0.0, 1.0)
                    val[np.isnan(mx)] = np.nan
            else:
                raise InputError(f"model.json names a feature family this script lacks: {family}")
        return val.astype(np.float32).astype(np.float64)


def calendar(t: np.ndarray, name: str) -> np.ndarray:
    """A calendar encoding of int64 ns UTC times (model.json's `derivations`), float32."""
    day = np.floor_divide(t, DAY_NS)
    sec = (t - day * DAY_NS) / 1e9
    if name in ("tod_sin", "tod_cos"):
        tod = 2.0 * np.pi * sec / 86_400.0
        val = np.sin(tod) if name == "tod_sin" else np.cos(tod)
    elif name in ("dow_sin", "dow_cos"):
        dow = 2.0 * np.pi * ((day + 3) % 7) / 7.0  # 1970-01-01 was a Thursday
        val = np.sin(dow) if name == "dow_sin" else np.cos(dow)
    elif name == "to_cash_close":
        val = (np.mod(20 * 60 - sec / 60.0 + 720.0, 1440.0) - 720.0) / 720.0
    else:
        raise InputError(f"model.json names a calendar feature this script lacks: {name}")
    return val.astype(np.float32).astype(np.float64)


# --- one instrument's series -----------------------------------------------------------------


@dataclass
class Series:
    name: str
    time_ns: np.ndarray
    features: dict[str, np.ndarray]  # the model's observed and known inputs, float64
    static: dict[str, float]
    target: np.ndarray


def non_finite(cols: dict[str, np.ndarray], policy: str, name: str) -> np.ndarray:
    """The rows kept under the NaN policy (error, ffill, drop); fills `cols` in place."""
    bad = {c: int((~np.isfinite(v)).sum()) for c, v in cols.items()}
    bad = {c: n for c, n in bad.items() if n}
    keep = np.ones(len(next(iter(cols.values()))), dtype=bool)
    if not bad:
        return keep
    if policy == "error":
        listed = ", ".join(f"'{c}' ({n})" for c, n in bad.items())
        raise InputError(f"NaN/inf values in instrument {name}: {listed} (the model's NaN policy)")
    for c, v in cols.items():
        if policy == "ffill":
            last = np.maximum.accumulate(np.where(np.isfinite(v), np.arange(len(v)), -1))
            cols[c] = np.where(last >= 0, v[np.maximum(last, 0)], np.nan)
            keep &= last >= 0  # leading values with nothing to carry forward are dropped
        else:
            keep &= np.isfinite(v)
    return keep


def make_series(meta: dict[str, Any], name: str, t: np.ndarray, cols: dict) -> Series:
    """One instrument's rows checked, NaN handled and its features made."""
    data, features = meta["data"], meta["features"]
    for c, v in cols.items():
        if (np.isfinite(v) & (np.abs(v) > FLOAT32_MAX)).any():
            raise InputError(f"column '{c}' of instrument {name} holds values beyond float32")
    if (np.diff(t) <= 0).any():
        raise InputError(
            f"time column '{data['time_column']}' is not strictly increasing in instrument "
            f"{name}; sort the file by instrument and time"
        )
    keep = non_finite(cols, data["nan_policy"], name)
    t, cols = t[keep], {c: v[keep] for c, v in cols.items()}
    if len(t) == 0:
        raise InputError(f"instrument {name} has no rows left after the NaN policy")
    warmup, bars = 0, None
    if data["ohlcv"] is not None:
        bars = Ohlcv(t, cols, data["ohlcv"])
        warmup = min(data["ohlcv"]["warmup_rows"], len(t))
    made = {}
    for feature, spec in features.items():
        if spec["role"] == "static":
            continue
        if spec["source"] == "column":
            made[feature] = cols[spec["column"]]
        elif spec["source"] == "derived":
            made[feature] = bars.feature(spec["family"], spec.get("window", 1))
        else:
            made[feature] = calendar(t, feature)
        if not np.isfinite(made[feature][warmup:]).all():
            raise InputError(f"feature {feature} is not finite in {name}")
    static = {}
    for feature, spec in features.items():
        if spec["role"] == "static":
            v = cols[spec["column"]]
            if np.ptp(v) > 0:
                raise InputError(f"static feature '{feature}' varies within instrument {name}")
            static[feature] = float(v[0])
    target = made.pop(meta["target"]["name"])
    kept = {k: v[warmup:] for k, v in made.items()}
    return Series(name, t[warmup:], kept, static, target[warmup:])


def load_series(table: pa.Table, meta: dict[str, Any], path: str) -> list[Series]:
    """Every instrument's series, in the order of their names."""
    data = meta["data"]
    wanted = [data["time_column"], *([data["group_column"]] if data["group_column"] else [])]
    wanted += data["columns_read"]
    futures = data["futures"]
    if futures is not None:
        wanted += [c for c in (futures["roll"]["expiry_column"], futures["root_column"]) if c]
    missing = [c for c in dict.fromkeys(wanted) if c not in table.column_names]
    if missing:
        raise InputError(
            f"missing column(s) {', '.join(missing)} in {path}; "
            f"the file has: {', '.join(table.column_names)}"
        )
    if table.num_rows == 0:
        raise InputError(f"{path} has no rows")
    if futures is not None:
        table = continuous(table, data)
    t = time_ns(table, data["time_column"], data["time_unit"])
    codes, names = group_codes(table, data["group_column"])
    values = {c: as_float(table, c) for c in data["columns_read"]}
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    series = []
    for g, name in enumerate(names):
        rows = order[bounds[g] : bounds[g + 1]]
        series.append(make_series(meta, name, t[rows], {c: v[rows] for c, v in values.items()}))
    return series


# --- windows ---------------------------------------------------------------------------------


@dataclass
class Windows:
    rows: np.ndarray  # [all rows, encoder columns] float32, normalized
    starts: np.ndarray  # [N] each window's first row
    group: np.ndarray  # [N] instrument index
    static: np.ndarray  # [instruments, static] float32, normalized
    instrument: np.ndarray  # [N] names
    origin_ns: np.ndarray  # [N] the last encoder row's time
    target_ns: np.ndarray  # [N, H] each forecast step's time
    target_time_known: np.ndarray  # [N, H] False where the time was continued
    actual: np.ndarray  # [N, H] NaN where not realised


def bar_interval(s: Series) -> int:
    """The most common step between the instrument's bars (a session gap does not count)."""
    steps, counts = np.unique(np.diff(s.time_ns), return_counts=True)
    if len(steps) == 0:
        raise InputError(f"instrument {s.name} has one row: no bar interval to continue")
    return int(steps[np.argmax(counts)])


def future_steps(
    s: Series, given: Future | None, meta: dict[str, Any], known: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The times of the (up to H) steps after the data, whether each was in the data, and
    their known inputs [steps, known] in the model's order."""
    h, user_known = meta["prediction_length"], meta["data"]["known_columns"]
    times = given.time_ns[:h] if given is not None else np.zeros(0, np.int64)
    user = {k: given.known[k][:h] if given else np.zeros(0) for k in user_known}
    if (np.diff(np.concatenate([s.time_ns[-1:], times])) <= 0).any():
        raise InputError(
            f"the rows after instrument {s.name}'s last target value are not later in time, "
            "one after the other; sort the file by instrument and time"
        )
    bad = [k for k, v in user.items() if not np.isfinite(v).all()]
    if bad:
        raise InputError(
            f"known input(s) {', '.join(bad)} empty in the rows after instrument {s.name}'s "
            "last target value: the forecast steps need them"
        )
    from_data = np.ones(len(times), dtype=bool)
    if len(times) < h and not user_known:  # every known input follows from the time
        last = times[-1] if len(times) else s.time_ns[-1]
        times = np.concatenate([times, last + bar_interval(s) * np.arange(1, h - len(times) + 1)])
        from_data = np.concatenate([from_data, np.zeros(len(times) - len(from_data), bool)])
    columns = []
    for k in known:
        spec = meta["features"][k]
        columns.append(user[spec["column"]] if spec["source"] == "column" else calendar(times, k))
    return times, from_data, np.stack(columns, axis=1) if columns else np.zeros((len(times), 0))


def build_windows(table: pa.Table, meta: dict[str, Any], all_windows: bool, path: str) -> Windows:
    """Each instrument's latest window (every one with `all_windows`), normalized."""
    data, features = meta["data"], meta["features"]
    e, h = meta["encoder_length"], meta["prediction_length"]
    observed_rows, future = split_future(table, data)
    series = load_series(observed_rows, meta, path)
    names = sorted({s.name for s in series} | set(future))
    vocab = meta["instruments"]
    unknown = [n for n in names if vocab and n not in vocab] if data["group_column"] else []
    if unknown:
        raise InputError(f"instruments unknown to the model: {', '.join(unknown)}")
    check_history(series, names, observed_rows, data, e)
    encoder = ("encoder_observed", "encoder_known")  # their features: the encoder's columns
    columns = [f for spec in meta["inputs"] if spec["name"] in encoder for f in spec["features"]]
    known = [f for f, spec in features.items() if spec["role"] == "known"]
    statics = [f for f, spec in features.items() if spec["role"] == "static"]
    mean = np.array([features[c]["mean"] for c in columns])
    std = np.array([features[c]["std"] for c in columns])
    static = np.zeros((max(len(vocab), 1), len(statics)))
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("inst", "origin", "target", "given")}
    parts |= {"actual": [], "starts": [], "group": []}
    blocks, lacking, offset = [], [], 0
    for s in series:
        g = vocab.index(s.name) if vocab and s.name in vocab else 0
        static[g] = [s.static[f] for f in statics]
        times, given, future_known = future_steps(s, future.get(s.name), meta, known)
        if len(times) < h and not all_windows:
            lacking.append(f"{s.name} has {len(times)}")
        n, f = len(s.target), len(times)
        block = np.full((n + f, len(columns)), np.nan)
        block[:n] = np.column_stack([s.target, *(s.features[c] for c in columns[1:])])
        block[n:, len(columns) - len(known) :] = future_known
        first = e - 1 if all_windows else n - 1
        origins = np.arange(first, min(n - 1, n + f - 1 - h) + 1)
        if len(origins) == 0:
            if all_windows:
                lacking.append(f"{s.name} has {len(times)}")
            continue
        steps = origins[:, None] + np.arange(1, h + 1)
        time_all = np.concatenate([s.time_ns, times])
        parts["inst"].append(np.full(len(origins), s.name, dtype=object))
        parts["origin"].append(time_all[origins])
        parts["target"].append(time_all[steps])
        parts["given"].append(np.concatenate([np.ones(n, bool), given])[steps])
        parts["actual"].append(np.concatenate([s.target, np.full(f, np.nan)])[steps])
        parts["starts"].append(offset + origins - e + 1)
        parts["group"].append(np.full(len(origins), g, np.int64))
        blocks.append(block)
        offset += n + f
    if lacking:
        raise InputError(
            f"the forecast needs the known input(s) {', '.join(data['known_columns'])} for the "
            f"{h} bars after an instrument's last target value: add those rows with the "
            f"target empty ({'; '.join(lacking)})"
            + ("" if all_windows else ", or use --all-windows for past windows")
        )
    static_mean = np.array([features[f]["mean"] for f in statics])
    static_std = np.array([features[f]["std"] for f in statics])
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return Windows(
        rows=normalized(np.concatenate(blocks), mean, std, columns),
        starts=cat["starts"],
        group=cat["group"],
        static=normalized(static, static_mean, static_std, statics),
        instrument=cat["inst"],
        origin_ns=cat["origin"],
        target_ns=cat["target"],
        target_time_known=cat["given"],
        actual=cat["actual"],
    )


def normalized(x: np.ndarray, mean: np.ndarray, std: np.ndarray, names: list[str]) -> np.ndarray:
    """float32((x - mean) / std), in float64; an error naming a column that overflows."""
    with np.errstate(over="ignore"):
        out = ((x - mean) / std).astype(np.float32)
    beyond = np.isinf(out).any(axis=0)
    if beyond.any():
        raise InputError(f"column {names[int(np.argmax(beyond))]} is beyond float32 normalized")
    return out


def check_history(
    series: list[Series], names: list[str], rows: pa.Table, data: dict[str, Any], needed: int
) -> None:
    """Every instrument has an encoder's worth of rows left after NaN handling and warm-up."""
    usable = {s.name: len(s.target) for s in series}
    short = [n for n in names if usable.get(n, 0) < needed]
    if not short:
        return
    if data["group_column"]:
        counts = pc.value_counts(as_text(rows, data["group_column"]))
        raw = {c["values"].as_py(): c["counts"].as_py() for c in counts}
    else:
        raw = {"series": rows.num_rows}
    listed = "; ".join(
        f"{n} has {usable.get(n, 0)} (of {raw.get(n, 0)} in the data)" for n in short
    )
    raise InputError(
        f"too short a history for the model's encoder of {needed} rows: {listed}; the rows "
        "left after NaN handling and the feature warm-up count"
    )


# --- the forecast ----------------------------------------------------------------------------


def forecast(
    session: ort.InferenceSession, meta: dict[str, Any], w: Windows, batch_size: int
) -> np.ndarray:
    """The quantiles [windows, H, Q] in the target's units, calibrated."""
    e, h = meta["encoder_length"], meta["prediction_length"]
    n_observed = len(meta["inputs"][0]["features"])
    names = {spec["name"] for spec in meta["inputs"]}
    out = np.empty((len(w.starts), h, len(meta["quantiles"])), np.float32)
    for start in range(0, len(w.starts), batch_size):
        s = w.starts[start : start + batch_size]
        enc = w.rows[s[:, None] + np.arange(e)]
        feed = {"encoder_observed": enc[..., :n_observed]}
        if "encoder_known" in names:
            feed["encoder_known"] = enc[..., n_observed:]
            feed["decoder_known"] = w.rows[s[:, None] + np.arange(e, e + h)][..., n_observed:]
        g = w.group[start : start + batch_size]
        if "static_real" in names:
            feed["static_real"] = w.static[g]
        if "instrument" in names:
            feed["instrument"] = g
        feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
        out[start : start + len(s)] = session.run([meta["output"]["name"]], feed)[0]
    values = calibrate(out.astype(np.float64), w, meta) * meta["target"]["std"]
    return values + meta["target"]["mean"]


# --- calibration (foxhunt.evaluation.calibration) --------------------------------------------


def in_order(pred: np.ndarray, quantiles: list[float]) -> np.ndarray:
    """Lower levels capped at the median, upper ones floored at it, then each step sorted."""
    out = pred.copy()
    m = next((i for i, q in enumerate(quantiles) if abs(q - 0.5) < 1e-6), None)
    if m is not None:
        out[..., :m] = np.minimum(out[..., :m], out[..., m : m + 1])
        out[..., m + 1 :] = np.maximum(out[..., m + 1 :], out[..., m : m + 1])
    return np.sort(out, axis=-1)


def calibrate(pred: np.ndarray, w: Windows, meta: dict[str, Any]) -> np.ndarray:
    """pred [n, H, Q] (normalized) with model.json's calibration: cqr's offsets (the
    instrument's, or the pooled "*"), or aci's, walking each instrument's windows in time
    order and moving each interval's level after every realized target (known at or before
    the forecast's origin); the interval [lo - offset, hi + offset]."""
    cal, quantiles = meta.get("calibration"), meta["quantiles"]
    if not cal or not cal["offsets"]:
        return in_order(pred, quantiles)
    lo, hi = [p[0] for p in cal["pairs"]], [p[1] for p in cal["pairs"]]
    names = np.array([str(x) for x in w.instrument], dtype=object)
    key = {n: n if n in cal["offsets"] else "*" for n in set(names)}
    off = np.stack([np.asarray(cal["offsets"][key[n]]) for n in names]) if len(names) else 0.0
    if cal["method"] == "aci":
        actual = (w.actual - meta["target"]["mean"]) / meta["target"]["std"]
        off = np.zeros((*pred.shape[:2], len(lo)))
        for name in set(names):
            rows = np.flatnonzero(names == name)
            rows = rows[np.argsort(w.origin_ns[rows], kind="stable")]
            off[rows] = aci_offsets(pred[rows], actual[rows], w, rows, cal, key[name])
    out = pred.copy()
    out[..., lo] -= off
    out[..., hi] += off
    return in_order(out, quantiles)


def aci_offsets(
    pred: np.ndarray, y: np.ndarray, w: Windows, rows: np.ndarray, cal: dict, key: str
) -> np.ndarray:
    """[n, H, P] adaptive conformal inference's offsets (Gibbs and Candes 2021) along one
    instrument's windows: alpha_t+1 = alpha_t + gamma (alpha - miss_t), the offset the score
    quantile at (1 - alpha_t)(n + 1) / n."""
    q, lo, hi = cal["quantiles"], [p[0] for p in cal["pairs"]], [p[1] for p in cal["pairs"]]
    alpha = np.array([1 - (q[j] - q[i]) for i, j in cal["pairs"]])
    grid, n_cal = np.asarray(cal["grids"][key]), max(cal["windows"][key], 1)
    levels = cal["grid_levels"]
    origin, target = w.origin_ns[rows], w.target_ns[rows]
    n, h = y.shape
    known = np.stack([np.searchsorted(target[:, k], origin, side="right") for k in range(h)], 1)
    known = np.minimum(known, np.arange(n)[:, None])
    steps, pairs = np.arange(h)[:, None], np.arange(len(lo))[None, :]
    gained = np.zeros((n + 1, h, len(lo)))
    off = np.empty((n, h, len(lo)))
    for t in range(n):
        level = 1 - (alpha + cal["gamma"] * gained[known[t], np.arange(h)])
        x = np.clip(level * (n_cal + 1) / n_cal, 0, 1) * (levels - 1)
        i = np.minimum(x.astype(np.int64), levels - 2)
        off[t] = grid[i, steps, pairs] * (1 - (x - i)) + grid[i + 1, steps, pairs] * (x - i)
        miss = (y[t, :, None] < pred[t][:, lo] - off[t]) | (y[t, :, None] > pred[t][:, hi] + off[t])
        gained[t + 1] = gained[t] + np.where(np.isfinite(y[t])[:, None], alpha - miss, 0)
    return off


def times(ns: np.ndarray, time_type: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """Int64 nanoseconds as the input's time type (timestamps keep their time zone)."""
    mask = None if valid is None else ~valid
    if pa.types.is_timestamp(time_type):
        return pa.array(ns, pa.timestamp("ns", tz=time_type.tz), mask=mask)
    if pa.types.is_date(time_type):
        return pa.array(ns, pa.timestamp("ns"), mask=mask)
    return pa.array(ns, pa.int64(), mask=mask)


def output(w: Windows, values: np.ndarray, columns: list[str], time_type: pa.DataType) -> pa.Table:
    n, h, _ = values.shape
    actual = w.actual.ravel()
    return pa.table(
        {
            "instrument": pa.array(np.repeat(w.instrument, h), pa.string()),
            "origin_time": times(np.repeat(w.origin_ns, h), time_type),
            "horizon": pa.array(np.tile(np.arange(1, h + 1, dtype=np.int32), n)),
            "target_time": times(w.target_ns.ravel(), time_type, w.target_time_known.ravel()),
            **{c: pa.array(values[:, :, j].ravel()) for j, c in enumerate(columns)},
            "actual": pa.array(actual, pa.float64(), mask=np.isnan(actual)),
        }
    )


def predict(
    export_dir: Path, data: Path, all_windows: bool = False, batch_size: int = 256, threads: int = 0
) -> pa.Table:
    """The forecasts of the exported model for the bars in `data`, as predict.py's table."""
    meta, model = read_export(export_dir)
    try:
        table = pq.read_table(data)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read {data}: {' '.join(str(exc).split())}") from None
    # aci adapts to the realized targets of the instrument's past windows: forecast them too
    adapts = (meta.get("calibration") or {}).get("method") == "aci"
    windows = build_windows(table, meta, all_windows or adapts, str(data))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    values = forecast(session, meta, windows, batch_size)
    if adapts and not all_windows:  # then only each instrument's latest
        latest = build_windows(table, meta, False, str(data))
        every = zip(windows.instrument, windows.origin_ns, strict=True)
        at = {(str(n), int(o)): i for i, (n, o) in enumerate(every)}
        wanted = zip(latest.instrument, latest.origin_ns, strict=True)
        keep = [at[(str(n), int(o))] for n, o in wanted]
        windows, values = latest, values[keep]
    time_type = table.schema.field(meta["data"]["time_column"]).type
    return output(windows, values, meta["output"]["columns"], time_type)


def write_atomic(table: pa.Table, out: Path) -> None:
    """A temp file beside `out`, fsynced, then renamed over it: whole or not there."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("export_dir", type=Path, help="holds model.onnx and model.json")
    p.add_argument("data", type=Path, help="a Parquet file of bars")
    p.add_argument("out", type=Path, help="the predictions Parquet file to write")
    p.add_argument("--all-windows", action="store_true", help="every window, not the latest")
    p.add_argument("--batch-size", type=int, default=256, help="windows per ONNX Runtime run")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: its own)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    args = p.parse_args(argv)
    try:
        out = args.out.resolve()
        if out == args.data.resolve():
            raise InputError(f"{out} is the input data; give another path")
        if out.exists() and not args.overwrite:
            raise InputError(f"{out} exists; give another path, or --overwrite to replace it")
        if args.batch_size < 1:
            raise InputError(f"--batch-size must be positive, got {args.batch_size}")
        table = predict(args.export_dir, args.data, args.all_windows, args.batch_size, args.threads)
        write_atomic(table, out)
    except (InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    windows = table.num_rows // max(1, len(set(table.column("horizon").to_pylist())))
    print(f"wrote {table.num_rows} rows ({windows} windows) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
