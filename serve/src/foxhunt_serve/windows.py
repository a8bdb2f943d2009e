"""The encoder windows and the forecast steps' known inputs, normalized."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt_serve.calibration import POOLED
from foxhunt_serve.clock import Clock, Sessions, session_steps
from foxhunt_serve.cross_section import complete_rows
from foxhunt_serve.errors import DataError
from foxhunt_serve.features import calendar
from foxhunt_serve.normalize import normalize_rows
from foxhunt_serve.read import Future, group_codes, root_of
from foxhunt_serve.recent import recent_rows
from foxhunt_serve.scaling import of_instruments
from foxhunt_serve.series import across, load_series


@dataclass
class Facts:
    """What each of N windows is, beside its forecast: the rows of the forecast table (`Cut`
    finds them; foxhunt's predict and the consumer hold them the same)."""

    instrument: np.ndarray  # [N] names
    origin_ns: np.ndarray  # [N] the last encoder row's time
    target_ns: np.ndarray  # [N, H] each forecast step's time
    target_time_known: np.ndarray  # [N, H] False where the time was continued
    actual: np.ndarray  # [N, H] the raw target realised, NaN where not realised
    # [N, H] the model's own target realised (after data.target_transform; `actual` without
    # one): what the quantiles forecast and calibration adapts to
    target_actual: np.ndarray


@dataclass
class Windows(Facts):
    """The consumer's windows: their facts and what the model takes."""

    rows: np.ndarray  # [all rows, encoder columns] float32, normalized
    starts: np.ndarray  # [N] each window's first row
    group: np.ndarray  # [N] its series: the index of its instrument in `static` and `embed`
    static: np.ndarray  # [series, static] float32, normalized
    embed: np.ndarray  # [series] int64: the instrument embedding's row


log = logging.getLogger(__name__)
FACTS = tuple(f.name for f in fields(Facts))
FEW = 5  # the short names a warning lists by name (a panel may have hundreds: the count says it)


def bar_interval(name: str, time_ns: np.ndarray) -> int:
    """The most common step between the instrument's bars (a session gap does not count)."""
    steps, counts = np.unique(np.diff(time_ns), return_counts=True)
    if len(steps) == 0:
        raise DataError(f"instrument {name} has one row: no bar interval to continue")
    return int(steps[np.argmax(counts)])


def future_steps(
    name: str,
    time_ns: np.ndarray,
    given: Future | None,
    h: int,
    user_known: list[str],
    clock: Clock | None = None,
    sessions: Sessions | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The times of the (up to `h`) steps after the instrument's bars `time_ns`, whether each
    was in the data (not continued at the bar interval in the sessions of `clock`, None:
    every interval: only without `user_known` inputs, when every known input follows from the
    time; `sessions`: those learned in training), and the user's known inputs there."""
    times = given.time_ns[:h] if given is not None else np.zeros(0, np.int64)
    user = {k: given.known[k][:h] if given else np.zeros(0) for k in user_known}
    if (np.diff(np.concatenate([time_ns[-1:], times])) <= 0).any():
        raise DataError(
            f"the rows after instrument {name}'s last target value are not later in time, "
            "one after the other; sort the file by instrument and time"
        )
    bad = [k for k, v in user.items() if not np.isfinite(v).all()]
    if bad:
        raise DataError(
            f"known input(s) {', '.join(bad)} empty in the rows after instrument {name}'s "
            "last target value: the forecast steps need them"
        )
    from_data = np.ones(len(times), dtype=bool)
    if len(times) < h and not user_known:
        step = bar_interval(name, time_ns)
        last = times[-1] if len(times) else time_ns[-1]
        carried = sessions.open(name, step) if sessions is not None else None
        more = session_steps(time_ns, int(last), step, h - len(times), clock or Clock(), carried)
        times = np.concatenate([times, more])
        from_data = np.concatenate([from_data, np.zeros(len(times) - len(from_data), bool)])
    return times, from_data, user


class Cut:
    """The windows of one instrument after another: each one's last encoder row (its origin),
    and what each output row says of it (`FACTS`)."""

    def __init__(
        self,
        encoder_length: int,
        prediction_length: int,
        all_windows: bool,
        replay: tuple[dict[str, int], int] | None = None,
    ) -> None:
        """`replay` (`calibration.replay_plan`): the latest window and the ones before it that
        ACI's stored state has not counted (each name's time, and the most windows), not only
        the latest."""
        self.e, self.h, self.all_windows = encoder_length, prediction_length, all_windows
        self.replay = None if all_windows else replay
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in FACTS}
        self.lacking: list[str] = []

    def origins(
        self,
        name: str,
        time_ns: np.ndarray,
        target: np.ndarray,
        times: np.ndarray,
        given: np.ndarray,
        raw: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The origins (row indices) of the instrument's windows: its latest, or every one with
        a full encoder history; and its rows' times, the steps after the data included. `raw`:
        the target before data.target_transform (None: `target` is raw)."""
        n, f, h = len(target), len(times), self.h
        if f < h and not self.all_windows:
            self.lacking.append(f"{name} has {f}")
        first = self.e - 1 if self.all_windows else n - 1
        time_all = np.concatenate([time_ns, times])
        if self.replay is not None:
            seen, cap = self.replay
            first = max(self.e - 1, n - 1 - cap)
            since = seen.get(name, seen.get(POOLED))  # (a name without its own: the mean's)
            if since is not None:  # from the first window with a step the state has not counted
                later = np.arange(first, n)
                after = time_all[np.minimum(later + h, len(time_all) - 1)] > since
                first = int(later[np.argmax(after)]) if after.any() else n - 1
        origins = np.arange(first, min(n - 1, n + f - 1 - h) + 1)
        if len(origins) == 0:
            if self.all_windows:
                self.lacking.append(f"{name} has {f}")
            return origins, time_all
        steps = origins[:, None] + np.arange(1, h + 1)
        self.parts["instrument"].append(np.full(len(origins), name, dtype=object))
        self.parts["origin_ns"].append(time_all[origins])
        self.parts["target_ns"].append(time_all[steps])
        self.parts["target_time_known"].append(np.concatenate([np.ones(n, bool), given])[steps])
        after = np.full(f, np.nan)
        self.parts["target_actual"].append(np.concatenate([target, after])[steps])
        raw = target if raw is None else raw
        self.parts["actual"].append(np.concatenate([raw, after])[steps])
        return origins, time_all

    def facts(self, known_columns: list[str], hint: str) -> dict[str, np.ndarray]:
        """Every window's facts; an error naming the instruments without the steps to forecast
        (`hint`: how to ask for past windows instead)."""
        if self.lacking:
            raise DataError(
                f"the forecast needs the known input(s) {', '.join(known_columns)} for the "
                f"{self.h} bars after an instrument's last target value: add those rows with "
                f"the target empty ({'; '.join(self.lacking)})"
                + ("" if self.all_windows else f", or use {hint} for past windows")
            )
        return {k: np.concatenate(v) for k, v in self.parts.items()}


def known_inputs(
    times: np.ndarray,
    user: dict[str, np.ndarray],
    known: list[str],
    given: dict[str, str],
    clock: Clock,
) -> np.ndarray:
    """The known inputs `known` [steps, known] at `times`, in the model's order: the user's
    column `given[k]` from `user` (the rows after the data), or else the calendar encoding `k`
    of the time on `clock` (the one the bars were read on). foxhunt's predict and the consumer
    both take them from here."""
    columns = [
        user[given[k]] if k in given else calendar(times, k, clock).astype(float) for k in known
    ]
    return np.stack(columns, axis=1) if columns else np.zeros((len(times), 0))


def series_rows(history: np.ndarray, known_after: np.ndarray) -> np.ndarray:
    """One series' float64 rows to cut windows from: its `history` [rows, columns] (the target
    first, the known inputs last), then the steps after it with only their known inputs
    `known_after` [steps, known] (`known_inputs`), NaN elsewhere. foxhunt's predict and the
    consumer both make them here."""
    (n, width), steps = history.shape, len(known_after)
    rows = np.full((n + steps, width), np.nan)
    rows[:n] = history
    rows[n:, width - known_after.shape[1] :] = known_after
    return rows


def build_windows(
    table: pa.Table,
    meta: dict[str, Any],
    all_windows: bool,
    path: str,
    replay: tuple[dict[str, int], int] | None = None,
) -> Windows:
    """Each instrument's latest window (every one with `all_windows`; with `replay`, those ACI
    replays: `Cut`), normalized."""
    data, features = meta["data"], meta["features"]
    e, h = meta["encoder_length"], meta["prediction_length"]
    if not all_windows:  # the rows those windows read, not the whole history
        table = recent_rows(table, data, e, h, replay)
    observed_rows, future = complete_rows(table, data, meta["instruments"], h)
    series = across(load_series(observed_rows, meta, path), meta)
    names = sorted({s.name for s in series} | set(future))
    vocab, embedding_row = embedding_rows(names, meta)
    usable = {s.name: len(s.target) for s in series}
    short = check_history(usable, names, observed_rows, data, e)
    series = [s for s in series if s.name not in short]
    columns, known, given_known, statics = inputs_of(meta)
    clock = Clock.of(data.get("calendar"))
    sessions = Sessions((data.get("calendar") or {}).get("sessions"))
    # of each series with windows: its statics, embedding row, and rows' target centre and scale
    static, embed, target = [], [], []
    cut, blocks, starts, groups, offset = Cut(e, h, all_windows, replay), [], [], [], 0
    for s in series:
        times, given, user = future_steps(
            s.name, s.time_ns, future.get(s.name), h, data["known_columns"], clock, sessions
        )
        origins, _ = cut.origins(s.name, s.time_ns, s.target, times, given, s.raw_target)
        if len(origins) == 0:
            continue
        history = np.column_stack([s.target, *(s.features[c] for c in columns[1:])])
        after = known_inputs(times, user, known, given_known, clock.dated(s.time_ns))
        block = series_rows(history, after)
        starts.append(offset + origins - e + 1)
        groups.append(np.full(len(origins), len(static), np.int64))
        static.append([s.static[f] for f in statics])
        embed.append(embedding_row[s.name])
        blocks.append(block)
        centre, scale = of_instruments(meta["target"], vocab, np.array([s.name]))
        target.append(np.repeat([[centre[0], scale[0]]], len(block), axis=0))
        offset += len(block)
    facts = cut.facts(data["known_columns"], "--all-windows")
    mean, std = ([features[c][k] for c in columns] for k in ("mean", "std"))
    static_mean, static_std = ([features[f][k] for f in statics] for k in ("mean", "std"))
    target = np.concatenate(target)
    rows = normalize_rows(np.concatenate(blocks), mean, std, columns, (target[:, 0], target[:, 1]))
    static = np.array(static, float).reshape(-1, len(statics))
    return Windows(
        rows=rows,
        starts=np.concatenate(starts),
        group=np.concatenate(groups),
        static=normalize_rows(static, static_mean, static_std, statics),
        embed=np.array(embed, np.int64),
        **facts,
    )


def inputs_of(meta: dict[str, Any]) -> tuple[list[str], list[str], dict[str, str], list[str]]:
    """model.json's encoder columns, known features (and the user's column of each one given
    in the data) and static features, in the model's order."""
    encoder = ("encoder_observed", "encoder_known")  # their features: the encoder's columns
    columns = [f for spec in meta["inputs"] if spec["name"] in encoder for f in spec["features"]]
    features = meta["features"]
    known = [f for f, spec in features.items() if spec["role"] == "known"]
    given = {f: spec["column"] for f, spec in features.items() if spec["source"] == "column"}
    statics = [f for f, spec in features.items() if spec["role"] == "static"]
    return columns, known, given, statics


def embedding_rows(names: list[str], meta: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
    """The model's vocabulary, and each name's row of its instrument embedding: its index in the
    vocabulary, the row after it for a name outside it or without a training window (one the
    model has not seen); an error for such a name when the model has no such row."""
    vocab = meta["instruments"]
    unknown = [n for n in names if vocab and n not in vocab] if meta["data"]["group_column"] else []
    if unknown and not meta.get("unseen_instruments"):  # (a model.json written before them)
        raise DataError(f"instruments unknown to the model: {', '.join(unknown)}")
    untrained = set(meta.get("untrained_instruments", []))
    at = {n: i for i, n in enumerate(vocab) if n not in untrained}
    return vocab, {n: at.get(n, len(vocab)) for n in names}


def check_history(
    usable: dict[str, int],
    names: list[str],
    rows: pa.Table,
    data: dict[str, Any],
    needed: int,
) -> set[str]:
    """The instruments without an encoder's worth of rows (`usable`: by name) left after NaN
    handling and warm-up, left out with one warning (a real panel always holds a name listed
    days ago); an error when that is every one."""
    short = [n for n in names if usable.get(n, 0) < needed]
    if not short:
        return set()
    raw = rows_in_data(rows, data)
    listed = "; ".join(
        f"{n} has {usable.get(n, 0)} (of {raw.get(n, '0 in the data')})" for n in short[:FEW]
    )
    more = f"; and {len(short) - FEW} more" if len(short) > FEW else ""
    warmup = f" of {data['ohlcv']['warmup_rows']} rows" if data.get("ohlcv") else ""
    found = (
        f"too short a history for the model's encoder of {needed} rows, {len(short)} of "
        f"{len(names)} instruments: {listed}{more}; the rows left after NaN handling and the "
        f"feature warm-up{warmup} count"
    )
    if len(short) == len(names):
        raise DataError(found)
    log.warning("left out, %s", found)
    return set(short)


def rows_in_data(rows: pa.Table, data: dict[str, Any]) -> dict[str, str]:
    """Each instrument's rows in the data, as the user counts them: a futures root's by the
    contracts its rows name ("100 in the data: 100 of ESM6")."""
    if not data["group_column"]:
        return {"series": f"{rows.num_rows} in the data"}
    codes, names = group_codes(rows, data["group_column"])
    counts = np.bincount(codes, minlength=len(names))
    if data["futures"] is None:
        return {n: f"{c} in the data" for n, c in zip(names, counts, strict=True)}
    by_root: dict[str, list[tuple[str, int]]] = {}
    for g, contract in enumerate(names):
        root = root_of(rows, codes == g, contract, data["futures"])
        by_root.setdefault(root, []).append((contract, int(counts[g])))
    return {
        root: f"{sum(c for _, c in found)} in the data: "
        + ", ".join(f"{c} of {k}" for k, c in found)
        for root, found in by_root.items()
    }
