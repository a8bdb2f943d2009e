"""Futures contracts to one continuous series per root: the roll schedule of
`foxhunt.data.futures`."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_serve.errors import InputError
from foxhunt_serve.read import DAY_NS, as_float, as_text, time_ns

EXPIRED_NS = 4 * DAY_NS  # a front whose bars end this long before the data's has expired
MONTH_CODES = "FGHJKMNQUVXZ"  # January .. December
PRICES = ("open", "high", "low", "close")


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
