"""The encoder windows and the forecast steps' known inputs, normalized."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_serve.errors import InputError
from foxhunt_serve.features import calendar
from foxhunt_serve.read import Future, as_text, split_future
from foxhunt_serve.series import Series, load_series


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
