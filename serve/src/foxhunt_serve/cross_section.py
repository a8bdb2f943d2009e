"""Each date's cross-section of a panel, the way qlib's CSRankNorm and CSZScoreNorm processors
normalise one: a value against the other names' values at the same time. foxhunt computes a
model's cross-sectional inputs and target with this module in training and predict, and the
consumer here, so the three agree (model.json's data section: `cross_section`,
`target_transform`).

- inputs `rank`: every observed input's rank among the names with a row at that time, scaled to
  unit variance ((rank share - 1/2) * sqrt 12, qlib's); `zscore`: its z-score there. A name
  alone at its time, or one among equal values, gets 0. Named `<input>_xs_<how>`.
- target `xs_demean`: the target less the mean of the names' targets at its time (a
  market-neutral return, in each name's units); `xs_rank`: its rank there, scaled as above.
- `market_context` (CONTEXT): three inputs every name at a time shares, of the names' targets
  there before any transform: their mean (the market's move), their standard deviation (the
  dispersion) and the share above 0 (the breadth). A name alone at its time: its own target,
  0 and 0 or 1.

At serve time (`complete_rows`: foxhunt's predict and the consumer; training reads a finished
panel) two rules hold, for a model trained with either (model.json's data section); a model
without them serves any subset of names as given:

- **The last complete time.** The names that *stop* at a time are those whose last bar (a row
  with a target; a row after a name's last target value is a bar to forecast) is at that time.
  The file's last complete time is the earliest of the `horizon` (the prediction length) times
  before its last time at which more than a tenth (STOP_SHARE) of the names with a bar there
  stop; the file's last time when there is none. Its later times hold only the bars of the
  names that arrived first: their bars there become the first steps to forecast (known inputs
  read from them), each name is forecast from its bars up to the last complete time, and one
  warning says so. So a name listed later has no say (it stops nowhere before), a halted name
  does not stop (it has a bar after the halt), and a name that delisted is one of the few
  names that stop at a time (at most a tenth; in a panel of fewer than ten names, none: a
  delisting there is taken as a late bar, for `horizon` times). Names stopping more than
  `horizon` times before the last time have delisted: a forecast from there would not reach
  the file's last time, so no feed is that late. A futures panel cannot be forecast from an
  earlier time (its roots' contracts would each hold bars to forecast): an error says so.
- **The trained universe.** At each time up to the last complete one, the names of the model's
  vocabulary with a bar are counted against those that could have one: the vocabulary's names
  the file lacks altogether, and those in it listed then (between their first and last bar). A
  time with fewer than half (MIN_SHARE) warns, once, naming the latest such time and how many
  names it holds: its mean and ranks are the subset's, not the panel's the model was trained
  on.

Written with numpy (a sort and bincounts over the dates): pandas' group ranks would do it, but
neither foxhunt's data path nor this package takes pandas."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_serve.errors import DataError
from foxhunt_serve.read import (
    Future,
    group_codes,
    iso_time,
    root_of,
    split_future,
    time_ns,
    zone_of,
)

log = logging.getLogger(__name__)

# of the names with a bar at a time, the share that may stop there (delisted, or late) with the
# times after it still complete: a delisting or two in a panel of tens, not a feed that has
# delivered the next bar of some names only. Fewer than ten names: none (one is a tenth of the mean)
STOP_SHARE = 0.1
# The names at a time that make a panel: data.target_transform=auto takes out their mean on one
# (fewer, and a date's mean is mostly one name's own move), eval.book=auto books one, and a
# book's date holds nothing with fewer (eval.book_min_names' default): one threshold for all
PANEL_NAMES = 10
# of the trained names that could have a bar at a time, the share that must, or predict warns:
# the mean of n of N names misses theirs by about sigma * sqrt(1/n - 1/N), which at n = N/2
# equals the N names' own sampling error (sigma / sqrt N); below it the subset's mean and
# ranks, not the panel's the model was trained on, set the target history and the inputs
MIN_SHARE = 0.5


# data.market_context's inputs, by the statistic of the names' targets at a time each is
CONTEXT = {
    "xs_market_mean": "mean",
    "xs_market_dispersion": "dispersion",
    "xs_market_breadth": "breadth",
}


def name_of(feature: str, how: str) -> str:
    """The cross-sectional input of `feature` (data.cross_section=`how`)."""
    return f"{feature}_xs_{how}"


def by_date(values: np.ndarray, at: np.ndarray, how: str) -> np.ndarray:
    """`values` [n] against the others at the same date `at` [n] (dense date indices): "rank"
    (average ranks of ties, so equal values get equal ranks), "zscore" or "demean"."""
    count = np.bincount(at)
    n = count[at]
    if how == "rank":
        order = np.lexsort((values, at))
        v, a = values[order], at[order]
        new_run = np.r_[True, (v[1:] != v[:-1]) | (a[1:] != a[:-1])]
        run = np.cumsum(new_run) - 1
        first = np.r_[0, np.cumsum(count)[:-1]]  # each date's first position in the order
        position = np.arange(len(v)) - first[a]
        mean_position = np.bincount(run, position) / np.bincount(run)
        ranked = np.empty_like(values, dtype=np.float64)
        ranked[order] = mean_position[run]
        return np.where(n > 1, ((ranked + 0.5) / n - 0.5) * math.sqrt(12), 0.0)
    mean = (np.bincount(at, values) / count)[at]
    if how == "demean":
        return values - mean
    var = (np.bincount(at, values**2) / count)[at] - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    spread = std > 1e-12 * np.maximum(np.abs(mean), 1.0)
    return np.where(spread, (values - mean) / np.where(spread, std, 1.0), 0.0)


def summary(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """[n, 3] CONTEXT's statistics of `values` [n] across the rows at each date `at` [n] (dense
    date indices), the finite values counted (a date with none: 0)."""
    ok = np.isfinite(values)
    v = np.where(ok, values, 0.0)
    count = np.bincount(at, ok)
    per = np.maximum(count, 1)
    mean = np.bincount(at, v) / per
    var = np.maximum(np.bincount(at, v**2) / per - mean**2, 0.0)
    breadth = np.bincount(at, ok & (v > 0)) / per
    return np.column_stack([mean[at], np.sqrt(var)[at], breadth[at]])


def panel(
    times: list[np.ndarray],
    targets: list[np.ndarray],
    inputs: list[np.ndarray],
    how: str,
    transform: str,
    context: bool = False,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each series' (its `times`, `targets`, observed `inputs` [rows, k]) target after
    `transform` (none, xs_demean, xs_rank) and its added inputs [rows, k (+ 3)]: the inputs'
    cross-sectional values (`how`: none, rank, zscore; none for none), then with `context`
    CONTEXT's of the targets before the transform, across every series at each time."""
    at = np.unique(np.concatenate(times), return_inverse=True)[1].ravel()
    bounds = np.cumsum([0, *(len(t) for t in times)])
    raw = target = np.concatenate(targets).astype(np.float64)
    if transform != "none":
        target = by_date(target, at, transform.removeprefix("xs_"))
    stacked = np.concatenate(inputs).astype(np.float64)
    added = stacked[:, :0]
    if how != "none" and stacked.shape[1]:
        added = np.column_stack([by_date(stacked[:, j], at, how) for j in range(stacked.shape[1])])
    if context:
        added = np.column_stack([added, summary(raw, at)])
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return [target[p] for p in parts], [added[p] for p in parts]


def across_names(data: dict[str, Any]) -> bool:
    """Whether a model compares each name with the others at each time (model.json's data
    section: data.cross_section, data.target_transform or data.market_context)."""
    compared = any(data.get(k, "none") != "none" for k in ("cross_section", "target_transform"))
    return compared or bool(data.get("market_context", False))


def last_complete(at: np.ndarray, name: np.ndarray, horizon: int) -> int:
    """The last complete time (the module's rules) of rows at the times `at` (dense indices:
    the largest is the file's last time) of the names `name` (dense indices), as an index."""
    n_times = int(at.max()) + 1
    pairs = np.unique(name.astype(np.int64) * n_times + at)  # a name's contracts: one bar
    who, when = np.divmod(pairs, n_times)
    last = np.full(int(who.max()) + 1, -1, np.int64)
    np.maximum.at(last, who, when)
    held = np.bincount(when, minlength=n_times)
    stop = np.bincount(last, minlength=n_times)
    before = np.arange(n_times)
    tail = (before >= n_times - 1 - horizon) & (before < n_times - 1)  # every name stops last
    late = np.flatnonzero((stop > held * STOP_SHARE) & tail)
    return int(late[0]) if len(late) else n_times - 1


def trained_counts(
    at: np.ndarray, name: np.ndarray, trained: np.ndarray, lacking: int
) -> tuple[np.ndarray, np.ndarray]:
    """Of the trained names, how many have a bar at each time of `at` (rows of the names
    `name`; `trained`: by name, whether the model was trained among it) and how many could:
    `lacking` (those the file lacks) and the file's listed then, between its first and last
    bar. Two arrays, one count per time."""
    n_times = int(at.max()) + 1
    mine = trained[name]
    pairs = np.unique(name[mine].astype(np.int64) * n_times + at[mine])
    who, when = np.divmod(pairs, n_times)
    first = np.full(len(trained), n_times, np.int64)
    last = np.full(len(trained), -1, np.int64)
    np.minimum.at(first, who, when)
    np.maximum.at(last, who, when)
    seen = np.unique(who)
    starts = np.bincount(first[seen], minlength=n_times + 1)
    ends = np.bincount(last[seen] + 1, minlength=n_times + 1)
    listed = np.cumsum(starts - ends)[:n_times]
    return np.bincount(when, minlength=n_times), listed + lacking


def complete_rows(
    table: pa.Table,
    data: dict[str, Any],
    vocabulary: list[str],
    horizon: int,
) -> tuple[pa.Table, dict[str, Future]]:
    """The rows of `table` to read and, by instrument, the rows to forecast (`split_future`);
    for a model that compares names at each time (`across_names`), read up to the last
    complete time and checked against the trained names `vocabulary`, with one warning each
    (the module's rules; `horizon`: the prediction length)."""
    observed, future = split_future(table, data)
    if not across_names(data) or not data["group_column"] or observed.num_rows == 0:
        return observed, future
    source = data["target_column"] or data["ohlcv"]["close"]
    if any(
        c not in observed.column_names for c in (data["time_column"], data["group_column"], source)
    ):
        return observed, future  # reading the series names what is missing
    t = time_ns(observed, data["time_column"], data["time_unit"], zone_of(data))
    times, at = np.unique(t, return_inverse=True)
    at = at.ravel()
    name, names = _instruments(observed, data)
    end = last_complete(at, name, horizon)
    if end < len(times) - 1:
        late, since = _late(at, name, names, times, end), iso_time(times[end])
        if data["futures"] is not None:  # each root's contracts would hold bars to forecast
            raise DataError(
                f"{late}; a futures panel cannot be forecast from {since}, the last complete "
                f"time: drop the rows after it"
            )
        log.warning(
            "%s; the model compares each name with the others at each time, so it forecasts "
            "from %s, the last complete time (the later bars are its first steps)",
            late,
            since,
        )
        observed, future = _forecast_after(observed, future, data, at > end)
        keep = at <= end
        at, name, times = at[keep], name[keep], times[: end + 1]
    if vocabulary:
        _warn_thin(times, at, name, names, vocabulary)
    return observed, future


def _instruments(table: pa.Table, data: dict[str, Any]) -> tuple[np.ndarray, list[str]]:
    """Each row's instrument as an index into their names: a futures contract's root."""
    codes, names = group_codes(table, data["group_column"])
    if data["futures"] is None:
        return codes, names
    roots = [root_of(table, codes == g, n, data["futures"]) for g, n in enumerate(names)]
    unique, of_contract = np.unique(roots, return_inverse=True)
    return of_contract.ravel()[codes], [str(r) for r in unique]


def _late(at: np.ndarray, name: np.ndarray, names: list[str], times: np.ndarray, end: int) -> str:
    """What the times after the last complete time `end` lack."""
    stopped = np.setdiff1d(name[at == end], name[at > end])
    shown = ", ".join(names[i] for i in stopped[:5]) + (", ..." if len(stopped) > 5 else "")
    held = len(np.unique(name[at == end]))
    return (
        f"the file's last {len(times) - 1 - end} time(s), to {iso_time(times[-1])}, hold the "
        f"bars of some names only: {len(stopped)} of the {held} names with a bar at "
        f"{iso_time(times[end])} have none after it ({shown})"
    )


def _forecast_after(
    observed: pa.Table, future: dict[str, Future], data: dict[str, Any], later: np.ndarray
) -> tuple[pa.Table, dict[str, Future]]:
    """`observed` without its `later` rows, which join the rows to forecast `future` (before
    any given there: they are earlier), their known inputs read from them."""
    source = data["target_column"] or data["ohlcv"]["close"]
    column = observed.column(source)
    empty = pc.if_else(pa.array(later), pa.scalar(None, column.type), column)
    at = observed.column_names.index(source)
    observed, moved = split_future(observed.set_column(at, source, empty), data)
    for name, rows in moved.items():
        given = future.get(name)
        if given is not None:
            known = {k: np.concatenate([v, given.known[k]]) for k, v in rows.known.items()}
            rows = Future(np.concatenate([rows.time_ns, given.time_ns]), known)
        future[name] = rows
    return observed, future


def _warn_thin(
    times: np.ndarray, at: np.ndarray, name: np.ndarray, names: list[str], vocabulary: list[str]
) -> None:
    """One warning when a time holds fewer than MIN_SHARE of the trained names that could."""
    trained = np.isin(names, vocabulary)
    lacking = len(set(vocabulary) - set(names))
    held, could = trained_counts(at, name, trained, lacking)
    thin = np.flatnonzero(held < MIN_SHARE * could)
    if len(thin) == 0:
        return
    i = thin[-1]
    log.warning(
        "%d of the %d names the model was trained among at %s (fewer than %d%%; %d earlier "
        "time(s) of the file too): the model compares each name with the others at each time, "
        "so its target history and cross-sectional inputs there are measured among these "
        "names only; give it the panel it was trained on",
        held[i],
        could[i],
        iso_time(times[i]),
        round(MIN_SHARE * 100),
        len(thin) - 1,
    )
