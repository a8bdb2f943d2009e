"""Futures as futures: contract ids parsed into a root and an expiry month, a roll schedule per
root, and one back-adjusted continuous series per root (the one implementation, which
foxhunt's training and predict and the ONNX consumer share).

- A contract id is `ROOT + month code + year` by default (`ESH6`, `ESM26`, `CLZ2025`), the
  month codes F G H J K M N Q U V X Z for January to December; `root_pattern` is a regex with
  the groups `root`, `month` and `year`. A one- or two-digit year is the nearest such year at or
  after the contract's first bar's year less one (a contract trades before its expiry year).
- The roll schedule is a state machine over time: the held contract is the front until the
  rule moves it to a later contract (never back to an earlier one), at the first bar the later
  one is held, decided from data up to the bar before it (no look-ahead), so a file cut at any
  time has the full file's rolls up to the cut:
  - `volume` (or `open_interest`): after a later contract's volume (open interest) has
    exceeded the front's on `confirm_bars` consecutive common bars (several months at once:
    the first to be held wins, the nearest month on a tie);
  - `days_before_expiry`: at the first bar at least `days` calendar days before the front's
    expiry (the third Friday of its month by the month-code calendar, or an expiry column);
  - `fixed`: at the first bar at or after the first given time after the front became held.
  A front still trading at the end of the data stays held (no roll is owed), the last roll's
  `held_at_end`. One whose bars end more than `EXPIRED_NS` before the data's has expired: with
  no signal by its last bar it rolls there, to the next listed contract trading after it, with
  a warning (`strict`: an error). Months never held are not in the series.
- The continuous series takes each contract's bars while it is held. History is adjusted
  backwards at each roll so that the newest contract's prices are its own: `ratio` multiplies
  earlier prices by the next contract's close over the front's at the last common bar before
  the roll (log returns then equal each contract's own bar-to-bar returns, also at the roll
  bar), `difference` adds the difference of those closes (price differences equal each
  contract's own), `none` leaves the jump in (`stitch`). A table's series (`continuous`)
  feeds the model's derived inputs and target, all ratios of prices, so there `none` and
  `difference` are `ratio`: a roll bar's return is never the spread, and a bar's inputs never
  depend on later rolls (a ratio is unchanged by a common scale; a difference added to prices
  changes every ratio before the roll, so a backtest fold would see rolls after its end).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_serve.clock import DAY_NS
from foxhunt_serve.errors import DataError
from foxhunt_serve.read import as_float, as_text, iso_time, time_ns, zone_of

log = logging.getLogger(__name__)
MONTH_CODES = "FGHJKMNQUVXZ"  # January .. December
ROOT_PATTERN = r"^(?P<root>[A-Z0-9]+?)(?P<month>[FGHJKMNQUVXZ])(?P<year>\d{1,4})$"
RULES = ("volume", "open_interest", "days_before_expiry", "fixed")
ADJUSTMENTS = ("ratio", "difference", "none")
PRICES = ("open", "high", "low", "close")
# a front whose last bar comes more than this before the data's end has expired: longer than a
# weekend or a holiday, so a front that only pauses is not taken for an expired one
EXPIRED_NS = 4 * DAY_NS


@dataclass(frozen=True)
class Contract:
    """One contract's identity and bars (times strictly increasing, int64 ns UTC)."""

    id: str
    root: str
    month: int | None  # 1 .. 12; None: the id names no month (data.futures.root_column)
    year: int | None
    time_ns: np.ndarray
    prices: dict[str, np.ndarray]  # open, high, low, close
    volume: np.ndarray
    open_interest: np.ndarray | None = None
    expiry_ns: int | None = None  # from an expiry column; else the month-code calendar
    rows: np.ndarray | None = None  # the bars' rows in the table they came from

    @property
    def expiry(self) -> int:
        """The expiry (int64 ns UTC): the expiry column's, or the third Friday of the month."""
        if self.expiry_ns is not None:
            return self.expiry_ns
        if self.month is None:
            raise DataError(
                f"contract {self.id} has no expiry: its id names no month code and "
                "data.futures.roll.expiry_column is not set"
            )
        return third_friday(self.year, self.month)

    @property
    def order(self) -> int:
        """Where the contract comes among its root's: by expiry, else by its last bar."""
        known = self.expiry_ns is not None or self.month is not None
        return self.expiry if known else int(self.time_ns[-1])


@dataclass(frozen=True)
class Roll:
    time_ns: int  # the first bar of the new contract
    from_id: str
    to_id: str
    factor: float  # ratio: next / front close; difference: next - front; none: nan
    held_at_end: bool = False  # `to_id` is still held at the end of the data


def parse_contract(contract_id: str, first_time_ns: int, pattern: str = ROOT_PATTERN) -> tuple:
    """(root, month, year) of a contract id; a DataError naming it when it does not parse."""
    found = re.match(pattern, contract_id)
    if found is None or not {"root", "month", "year"} <= set(found.groupdict()):
        raise DataError(
            f"contract '{contract_id}' does not parse as root + month code + year "
            f"(data.futures.root_pattern={pattern!r})"
        )
    root, code, digits = found["root"], found["month"], found["year"]
    if code not in MONTH_CODES:
        raise DataError(f"contract '{contract_id}': '{code}' is no month code ({MONTH_CODES})")
    start = int(np.datetime64(int(first_time_ns), "ns").astype("datetime64[Y]").astype(int)) + 1970
    if len(digits) >= 3:
        year = int(digits)
    else:  # the nearest year with these last digits at or after the first bar's year less one
        base = 10 ** len(digits)
        year = start - 1 + (int(digits) - (start - 1)) % base
    return root, MONTH_CODES.index(code) + 1, year


def third_friday(year: int, month: int) -> int:
    """The third Friday of a month at 00:00 UTC (int64 ns): equity index futures' expiry."""
    first = np.datetime64(f"{year:04d}-{month:02d}-01", "D")
    weekday = (first.astype(int) + 3) % 7  # Monday = 0 (1970-01-01 was a Thursday)
    friday = first + (4 - weekday) % 7 + 14
    return int(friday.astype("datetime64[ns]").astype(np.int64))


def roll_schedule(
    contracts: list[Contract],
    rule: str,
    confirm_bars: int = 1,
    days: int = 5,
    fixed: list[int] | None = None,
    strict: bool = False,
) -> list[Roll]:
    """The rolls of one root's held contract over time, factor not yet set (nan); `rule` one of
    RULES (foxhunt checks the config's)."""
    ordered = sorted(contracts, key=lambda c: c.order)
    end = max(int(c.time_ns[-1]) for c in ordered)
    rolls, k, held_from = [], 0, int(ordered[0].time_ns[0])
    # a state machine: the held contract stays the front until the rule moves it to a later one
    while found := _next_roll(ordered, k, held_from, end, rule, confirm_bars, days, fixed, strict):
        at, j = found
        rolls.append(Roll(at, ordered[k].id, ordered[j].id, float("nan")))
        k, held_from = j, at
    if rolls:
        rolls[-1] = replace(rolls[-1], held_at_end=True)
    never = sorted(set(c.id for c in ordered) - {ordered[0].id, *(r.to_id for r in rolls)})
    if never:
        log.info(
            "futures: %s: %d deferred contracts never held (%s)",
            ordered[0].root,
            len(never),
            ", ".join(never),
        )
    return rolls


def _next_roll(
    ordered: list[Contract],
    k: int,
    held_from: int,
    end: int,
    rule: str,
    confirm_bars: int,
    days: int,
    fixed: list[int] | None,
    strict: bool,
) -> tuple[int, int] | None:
    """The roll from `ordered[k]`, held from `held_from`: (the first bar held of the next, its
    index in `ordered`), or None: it is held to the end of the data."""
    front = ordered[k]
    last = int(front.time_ns[-1])
    later = [j for j in range(k + 1, len(ordered)) if ordered[j].time_ns[-1] >= held_from]
    signals = [
        (at, j)
        for j in later
        if ordered[j].time_ns[0] <= last  # it trades while the front does
        and (at := _signal(front, ordered[j], held_from, rule, confirm_bars, days, fixed))
        is not None
    ]
    if signals:  # the earliest first bar held; the nearest month on a tie
        return min(signals)
    after = [j for j in later if ordered[j].time_ns[-1] > last]
    if end - last <= EXPIRED_NS or not after:  # still the front at the end: no roll is owed
        return None
    nxt = ordered[after[0]]  # it expired: the next listed contract that trades after it
    at = int(nxt.time_ns[np.searchsorted(nxt.time_ns, last, "right")])
    overlap = np.intersect1d(front.time_ns[front.time_ns >= held_from], nxt.time_ns)
    if len(overlap) == 0:
        log.warning(
            "futures: %s ends %.1f days before %s's first bar after it: a gap in the "
            "continuous series",
            front.id,
            (at - last) / DAY_NS,
            nxt.id,
        )
        return at, after[0]
    _no_signal(front, nxt, len(overlap), rule, confirm_bars, days, strict)
    return at, after[0]


def _no_signal(
    front: Contract,
    nxt: Contract,
    overlap: int,
    rule: str,
    confirm_bars: int,
    days: int,
    strict: bool,
) -> None:
    """An expired front that overlaps the next contract with no roll signal: a warning that it
    rolls at its last bar (`strict`: an error)."""
    last = int(front.time_ns[-1])
    if rule in ("volume", "open_interest"):
        what = (
            f"{nxt.id}'s {rule.replace('_', ' ')} never exceeds {front.id}'s on {confirm_bars} "
            f"consecutive bars before {front.id} ends"
        )
    elif rule == "days_before_expiry":
        what = f"{front.id} ends before its roll date, {days} days before its expiry"
    else:
        what = f"no date of data.futures.roll.dates falls while {front.id} is held"
    if strict:
        raise DataError(
            f"contracts {front.id} and {nxt.id} overlap on {overlap} bars but {what}: no "
            "roll signal (data.futures.roll.rule)"
        )
    log.warning(
        "futures: %s expired (its last bar %s, the data runs on) with no roll signal (%s): "
        "rolled to %s at its last bar (data.futures.roll.strict=true makes this an error)",
        front.id,
        np.datetime64(last, "ns").astype("datetime64[m]"),
        what,
        nxt.id,
    )


def _signal(
    front: Contract,
    nxt: Contract,
    held_from: int,
    rule: str,
    confirm_bars: int,
    days: int,
    fixed: list[int] | None,
) -> int | None:
    """The first bar of `nxt` held if the rule moves the front to it, decided from the bars up
    to the one before (no look-ahead) while the front is held and trades; else None."""
    last = int(front.time_ns[-1])
    if rule in ("volume", "open_interest"):
        common, fi, ni = np.intersect1d(front.time_ns, nxt.time_ns, return_indices=True)
        mine = common >= held_from
        a, b = getattr(front, rule), getattr(nxt, rule)  # volume or open_interest
        ahead = b[ni[mine]] > a[fi[mine]]
        if not ahead.any():
            return None
        # the bar where `ahead` has held on confirm_bars consecutive common bars
        run = np.convolve(ahead, np.ones(confirm_bars, int), "full")[: len(ahead)]
        confirmed = np.flatnonzero(run >= confirm_bars)
        if len(confirmed) == 0:
            return None
        # decided at that bar's close: held from the next contract's next bar
        i = np.searchsorted(nxt.time_ns, common[mine][confirmed[0]], "right")
        return int(nxt.time_ns[i]) if i < len(nxt.time_ns) else None
    if rule == "days_before_expiry":
        due = max(front.expiry - days * DAY_NS, held_from)
    else:  # fixed: the first date after the front became held
        due = next((d for d in sorted(fixed) if d > held_from), None)
    if due is None or due > last:
        return None
    i = np.searchsorted(nxt.time_ns, due)
    return int(nxt.time_ns[i]) if i < len(nxt.time_ns) else None


@dataclass
class Continuous:
    """One root's continuous series: the held contract's bars, adjusted backwards."""

    root: str
    time_ns: np.ndarray
    prices: dict[str, np.ndarray]  # open, high, low, close (adjusted)
    volume: np.ndarray
    contract: np.ndarray  # [bars] index into `ids`: which contract each bar is from
    ids: list[str]  # the contracts held, in turn (the last: held at the end of the data)
    rolls: list[Roll]
    rows: np.ndarray | None  # [bars] the contracts' `rows` of each bar
    scale: np.ndarray  # [bars] ratio: the factor each bar's prices were multiplied by
    shift: np.ndarray  # [bars] difference: the amount added to each bar's prices


def stitch(contracts: list[Contract], rolls: list[Roll], adjust: str) -> Continuous:
    """The continuous series of one root from its contracts and rolls (see the module)."""
    by_id = {c.id: c for c in contracts}
    first = by_id[rolls[0].from_id] if rolls else min(contracts, key=lambda c: c.order)
    ordered = [first, *(by_id[r.to_id] for r in rolls)]  # the contracts held, in turn
    bounds = [ordered[0].time_ns[0], *(r.time_ns for r in rolls), np.iinfo(np.int64).max]
    pieces, factors = [], []
    for k, c in enumerate(ordered):
        held = (c.time_ns >= bounds[k]) & (c.time_ns < bounds[k + 1])
        pieces.append(held)
        if k == 0:
            continue
        # the last bar before the roll that both contracts have: the adjustment's prices
        front = ordered[k - 1]
        before = np.intersect1d(front.time_ns, c.time_ns[c.time_ns < bounds[k]])
        if len(before) == 0:
            factors.append(1.0 if adjust == "ratio" else 0.0)
            continue
        at = before[-1]
        old = front.prices["close"][np.searchsorted(front.time_ns, at)]
        new = c.prices["close"][np.searchsorted(c.time_ns, at)]
        factors.append(new / old if adjust == "ratio" else new - old)
    out_rolls = [
        replace(r, factor=f if adjust != "none" else float("nan"))
        for r, f in zip(rolls, factors, strict=True)
    ]
    # each earlier contract's prices adjusted by every later roll's factor
    scale = [float(np.prod(factors[k:])) if adjust == "ratio" else 1.0 for k in range(len(ordered))]
    shift = [
        float(np.sum(factors[k:])) if adjust == "difference" else 0.0 for k in range(len(ordered))
    ]
    prices = {
        p: np.concatenate(
            [
                c.prices[p][h] * a + b
                for c, h, a, b in zip(ordered, pieces, scale, shift, strict=True)
            ]
        )
        for p in PRICES
    }
    rows = None
    if all(c.rows is not None for c in ordered):
        rows = np.concatenate([c.rows[h] for c, h in zip(ordered, pieces, strict=True)])
    return Continuous(
        root=ordered[0].root,
        time_ns=np.concatenate([c.time_ns[h] for c, h in zip(ordered, pieces, strict=True)]),
        prices=prices,
        volume=np.concatenate([c.volume[h] for c, h in zip(ordered, pieces, strict=True)]),
        contract=np.concatenate([np.full(h.sum(), k) for k, h in enumerate(pieces)]),
        ids=[c.id for c in ordered],
        rolls=out_rolls,
        rows=rows,
        scale=np.concatenate([np.full(h.sum(), a) for h, a in zip(pieces, scale, strict=True)]),
        shift=np.concatenate([np.full(h.sum(), b) for h, b in zip(pieces, shift, strict=True)]),
    )


def continuous(table: pa.Table, data: dict[str, Any]) -> tuple[pa.Table, list[Roll]]:
    """The rows of a table whose group column holds contract ids as one continuous series per
    root (`data`: model.json's data section): the held contract's rows, their prices (the
    OHLCV columns' open, high, low, close) back-adjusted by ratio, the group column holding the
    root; and every root's rolls."""
    roll, group = data["futures"]["roll"], data["group_column"]
    prices = {p: data["ohlcv"][p] for p in PRICES}
    pieces, rolls = [], []
    for root, contracts in sorted(contracts_by_root(table, data).items()):
        schedule = roll_schedule(
            contracts,
            roll["rule"],
            roll["confirm_bars"],
            roll["days"],
            roll["dates_ns"] or None,
            bool(roll.get("strict", False)),
        )
        # every derived input (and the target) is a ratio of prices: ratio-adjusted, each is
        # the contract's own, whatever roll.adjust says; unadjusted (`none`), a roll bar's
        # return would be the spread; difference-adjusted, every ratio before a roll would
        # shift with the later rolls' differences (a look-ahead)
        series = stitch(contracts, schedule, "ratio")
        pieces.append((root, series))
        rolls += series.rolls
    out = table.take(pa.array(np.concatenate([s.rows for _, s in pieces])))
    for p, column in prices.items():
        adjusted = np.concatenate([s.prices[p] for _, s in pieces])
        out = out.set_column(out.schema.get_field_index(column), column, pa.array(adjusted))
    roots = np.concatenate([np.full(len(s.time_ns), root, dtype=object) for root, s in pieces])
    out = out.set_column(out.schema.get_field_index(group), group, pa.array(roots, pa.string()))
    for root, s in pieces:
        log.info(
            "futures: %s from %d contracts held in turn (%s), %d rolls, %s held at the end",
            root,
            len(s.ids),
            ", ".join(s.ids),
            len(s.rolls),
            s.ids[-1],
        )
    return out, rolls


def contracts_by_root(table: pa.Table, data: dict[str, Any]) -> dict[str, list[Contract]]:
    """Each root's contracts: the rows of each contract id, in time order."""
    f, roll, group = data["futures"], data["futures"]["roll"], data["group_column"]
    t = time_ns(table, data["time_column"], data["time_unit"], zone_of(data))
    ids = np.asarray(as_text(table.column(group), group).to_pylist(), dtype=object)
    values = {p: as_float(table, data["ohlcv"][p]) for p in (*PRICES, "volume")}
    interest = roll["open_interest_column"]
    interest = as_float(table, interest) if interest else None
    expiries = _expiries(table, roll["expiry_column"])
    root_of = f["root_column"]
    roots = (
        np.asarray(as_text(table.column(root_of), root_of).to_pylist(), dtype=object)
        if root_of
        else None
    )
    by_root: dict[str, list[Contract]] = {}
    for contract_id in sorted(set(ids)):
        rows = np.flatnonzero(ids == contract_id)
        rows = rows[np.argsort(t[rows], kind="stable")]
        twice = np.flatnonzero(np.diff(t[rows]) == 0)
        if len(twice):  # rows are sorted here: a time given twice is the file's duplicate
            raise DataError(
                f"contract {contract_id} has two rows at {iso_time(t[rows[twice[0]]])}: one "
                "bar per contract and time, drop the duplicate"
            )
        if roots is None:
            root, month, year = parse_contract(contract_id, t[rows[0]], f["root_pattern"])
        else:  # the root column names it; the id may still give the month
            found = sorted(set(map(str, roots[rows])))
            if len(found) != 1:
                raise DataError(
                    f"contract {contract_id} has {len(found)} roots in data.futures.root_column "
                    f"'{root_of}': {', '.join(found)}"
                )
            try:
                _, month, year = parse_contract(contract_id, t[rows[0]], f["root_pattern"])
            except DataError:
                month = year = None
            root = found[0]
        by_root.setdefault(root, []).append(
            Contract(
                id=contract_id,
                root=root,
                month=month,
                year=year,
                time_ns=t[rows],
                prices={p: values[p][rows] for p in PRICES},
                volume=values["volume"][rows],
                open_interest=None if interest is None else interest[rows],
                expiry_ns=_expiry_of(contract_id, expiries, rows, roll["expiry_column"]),
                rows=rows,
            )
        )
    return by_root


def _expiries(table: pa.Table, column: str | None) -> np.ndarray | None:
    """An expiry column as int64 ns (NaT-free: nulls are -1), or None without one."""
    if not column:
        return None
    col = table[column]
    if pa.types.is_date(col.type):
        col = pc.cast(col, pa.timestamp("ms"))
    if not pa.types.is_timestamp(col.type):
        raise DataError(
            f"data.futures.roll.expiry_column '{column}' is {col.type}, expected a date or "
            "timestamp"
        )
    return pc.fill_null(pc.cast(pc.cast(col, pa.timestamp("ns")), pa.int64()), -1).to_numpy()


def _expiry_of(
    contract_id: str, expiries: np.ndarray | None, rows: np.ndarray, column: str | None
) -> int | None:
    """A contract's expiry from the expiry column (its rows must all give it)."""
    if expiries is None:
        return None
    found = expiries[rows]
    if (found == -1).any():
        raise DataError(
            f"expiry column '{column}' is empty in {int((found == -1).sum())} rows of contract "
            f"{contract_id}: every row needs its contract's expiry"
        )
    return int(found.max())
