"""One instrument's rows checked, the NaN policy applied and its features made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt_serve.clock import Clock
from foxhunt_serve.cross_section import CONTEXT, panel
from foxhunt_serve.errors import DataError
from foxhunt_serve.features import Ohlcv, calendar
from foxhunt_serve.futures import continuous
from foxhunt_serve.read import as_float, group_codes, iso_time, time_ns, zone_of
from foxhunt_serve.scaling import SCALE_INPUT, scale_static

# every value ends up in float32 tensors: a larger one is inf there (or its square in a std)
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Series:
    name: str
    time_ns: np.ndarray
    features: dict[str, np.ndarray]  # the model's observed and known inputs, float64
    static: dict[str, float]
    target: np.ndarray  # the model's target (after data.target_transform: `across`)
    raw_target: np.ndarray | None = None  # the target before the transform (None: no transform)


def non_finite(
    columns: dict[str, np.ndarray],
    policy: str,
    name: str,
    locate: Callable[[int], str] = lambda row: "",
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The NaN policy (error, ffill, drop) on one instrument's columns: the columns of the rows
    kept, and the mask of those rows. `locate`: where a row is, for the error."""
    bad = {c: int((~np.isfinite(v)).sum()) for c, v in columns.items()}
    bad = {c: n for c, n in bad.items() if n}
    keep = np.ones(len(next(iter(columns.values()))), dtype=bool)
    if not bad:
        return columns, keep
    if policy == "error":
        listed = ", ".join(f"'{c}' ({n})" for c, n in bad.items())
        first = min(int(np.argmax(~np.isfinite(columns[c]))) for c in bad)
        raise DataError(
            f"NaN/inf values in instrument {name}{locate(first)}: {listed}; "
            "set data.nan_policy=ffill or data.nan_policy=drop to handle them"
        )
    if policy == "ffill":
        filled = {}
        for c, v in columns.items():
            # the index of the last finite value at or before each row (-1 before the first)
            last = np.maximum.accumulate(np.where(np.isfinite(v), np.arange(len(v)), -1))
            filled[c] = np.where(last >= 0, v[np.maximum(last, 0)], np.nan)
            keep &= last >= 0  # leading values with nothing to carry forward are dropped
        columns = filled
    else:
        for v in columns.values():
            keep &= np.isfinite(v)
    return {c: v[keep] for c, v in columns.items()}, keep


def out_of_order(time_column: str, name: str, t: np.ndarray, i: int, where: str = "") -> str:
    """What is wrong where instrument `name`'s times `t` first fail to increase, at row `i`
    (`where`: the file, or empty): a time given twice (named, with the contract or instrument),
    or rows out of order."""
    if t[i] == t[i - 1]:
        return (
            f"instrument {name} has two rows at {iso_time(t[i])} (its rows {i - 1} and {i} of "
            f"{len(t)}){where}: one bar per time, drop the duplicate"
        )
    return (
        f"time column '{time_column}' is not strictly increasing in instrument {name} at its "
        f"row {i} (of {len(t)}){where}: {iso_time(t[i])} after {iso_time(t[i - 1])}; sort the "
        "file by instrument and time"
    )


def checked_rows(
    name: str,
    t: np.ndarray,
    cols: dict[str, np.ndarray],
    data: dict[str, Any],
    locate: Callable[[int], str] = lambda row: "",
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One instrument's times and columns, checked (every value within float32's range, the
    times strictly increasing) and with data.nan_policy applied: the rows kept. An DataError
    names the column, row and time at fault (`locate(row)`: the file of a row, or empty).
    foxhunt's readers and the consumer both check here."""
    for c, v in cols.items():
        beyond = np.isfinite(v) & (np.abs(v) > FLOAT32_MAX)
        if beyond.any():
            i = int(np.argmax(beyond))
            raise DataError(
                f"column '{c}' of instrument {name} holds {v[i]:.3g} at its row {i}{locate(i)}, "
                f"beyond float32's range of +-{FLOAT32_MAX:.3g}: rescale the column"
            )
    steps = np.diff(t)
    if (steps <= 0).any():
        i = int(np.argmax(steps <= 0)) + 1
        if data["group_column"] is None and len(np.unique(t)) < len(t):  # a time twice: a panel
            raise DataError(
                f"time column '{data['time_column']}' repeats {iso_time(t[i])} at row {i} "
                f"(of {len(t)}){locate(i)}: a file of several instruments needs "
                "data.group_column=NAME (their column)"
            )
        raise DataError(out_of_order(data["time_column"], name, t, i, locate(i)))
    cols, keep = non_finite(cols, data["nan_policy"], name, locate)
    if not keep.any():  # as short as can be: an error, as a short one is, not left out unsaid
        raise DataError(
            f"instrument {name} has no rows left after data.nan_policy={data['nan_policy']}"
        )
    return t[keep], cols


def make_series(
    meta: dict[str, Any],
    name: str,
    t: np.ndarray,
    cols: dict,
    locate: Callable[[int], str] = lambda row: "",
) -> Series:
    """One instrument's rows checked, NaN handled and its features made, for training (foxhunt's
    column plan as a `meta`), predict and the consumer (model.json) alike: `meta["data"]`'s
    columns, NaN policy, OHLCV columns and calendar, `meta["features"]`' roles and sources, and
    `meta["target"]["name"]`. `locate(row)` names the file of a row (" in <path>"), or is empty."""
    data, features = meta["data"], meta["features"]
    t, cols = checked_rows(name, t, cols, data, locate)
    warmup = 0 if data["ohlcv"] is None else min(data["ohlcv"]["warmup_rows"], len(t))
    made = _inputs(meta, name, t, cols, warmup)
    static = {}
    for feature, spec in features.items():
        if spec["role"] == "static" and spec["source"] == SCALE_INPUT:
            static[feature] = float(scale_static(meta["target"], meta["instruments"], [name])[0])
        elif spec["role"] == "static":
            v = cols[spec["column"]]
            if np.ptp(v) > 0:
                raise DataError(f"static feature '{feature}' varies within instrument {name}")
            static[feature] = float(v[0])
    target = made.pop(meta["target"]["name"])
    kept = {k: v[warmup:] for k, v in made.items()}
    return Series(name, t[warmup:], kept, static, target[warmup:])


def _inputs(
    meta: dict[str, Any], name: str, t: np.ndarray, cols: dict, warmup: int
) -> dict[str, np.ndarray]:
    """The target and every observed and known input, by name (float64), from the columns:
    a column itself, a derived OHLCV feature, or the calendar of the time."""
    ohlcv, bars = meta["data"]["ohlcv"], None
    clock = Clock.of(meta["data"].get("calendar"))
    if ohlcv is not None:
        bars = Ohlcv(
            *(cols[ohlcv[p]] for p in ("high", "low", "close", "volume")),
            cols.get(ohlcv.get("open")),
        )
    made = {}
    for feature, spec in meta["features"].items():
        if spec["role"] == "static" or spec["source"] in ("cross_section", "context"):  # `across`
            continue
        if spec["source"] == "column":
            made[feature] = cols[spec["column"]]
        elif spec["source"] == "derived":
            made[feature] = bars.feature(spec["family"], spec.get("window", 1)).astype(float)
        else:
            made[feature] = calendar(t, feature, clock).astype(float)
        if not np.isfinite(made[feature][warmup:]).all():
            raise DataError(f"feature {feature} is not finite in {name}")
    return made


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
        raise DataError(
            f"missing column(s) {', '.join(missing)} in {path}; "
            f"the file has: {', '.join(table.column_names)}"
        )
    if table.num_rows == 0:
        raise DataError(f"{path} has no rows")
    if futures is not None:
        table, _ = continuous(table, data)
    t = time_ns(table, data["time_column"], data["time_unit"], zone_of(data))
    codes, names = group_codes(table, data["group_column"])
    values = {c: as_float(table, c) for c in data["columns_read"]}
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    series = []
    for g, name in enumerate(names):
        rows = order[bounds[g] : bounds[g + 1]]
        series.append(make_series(meta, name, t[rows], {c: v[rows] for c, v in values.items()}))
    return series


def across(series: list[Series], meta: dict[str, Any]) -> list[Series]:
    """`series` with the model's cross-sectional inputs, market context and target transform
    (model.json's data.cross_section, data.market_context and data.target_transform;
    `foxhunt_serve.cross_section`), computed across every instrument in the data at each time,
    as foxhunt computed them in training; under a transform the target it replaces kept as
    `raw_target`."""
    data = meta["data"]
    how = data.get("cross_section", "none")
    transform = data.get("target_transform", "none")
    context = bool(data.get("market_context", False))  # (model.json before it: none)
    if how == "none" and transform == "none" and not context:
        return series
    made = [f for f, spec in meta["features"].items() if spec["source"] == "cross_section"]
    bases = [meta["features"][f]["of"] for f in made]
    inputs = [  # [rows, bases] each; no columns for a target transform alone
        np.stack([s.features[b] for b in bases], axis=1) if bases else np.zeros((len(s.target), 0))
        for s in series
    ]
    targets, added = panel(
        [s.time_ns for s in series], [s.target for s in series], inputs, how, transform, context
    )
    made += list(CONTEXT) if context else []
    kept = transform != "none"  # the raw target beside the transformed one, for the output
    return [
        replace(
            s,
            target=t,
            raw_target=s.target if kept else None,
            features=s.features | dict(zip(made, a.T, strict=True)),
        )
        for s, t, a in zip(series, targets, added, strict=True)
    ]
