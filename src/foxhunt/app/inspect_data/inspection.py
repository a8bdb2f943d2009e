"""foxhunt inspect: what foxhunt will make of a data file, before a long run.

The instruments (their spans, gaps, listings and delistings), the bar size and calendars, the
futures contracts and their roll schedule, the feature plan, the windows of each split with the
calendar cuts, a training step's memory estimate and a measured time per batch; and every
problem `foxhunt train` would refuse, all at once: the config's, the columns', each instrument's.
The windows and features come from the same `ParquetDataModule` that training builds, so they
are what it will use."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from foxhunt_serve import Clock
from omegaconf import DictConfig

from foxhunt.config import validate
from foxhunt.data import daylight
from foxhunt.data.columns import check_files, column_plan, is_numeric
from foxhunt.data.datamodule import DAILY_BAR_NS, ParquetDataModule
from foxhunt.data.names import resolve_data
from foxhunt.data.read import common_types, from_table, projection, read_file
from foxhunt.data.section import futures_enabled
from foxhunt.data.source import open_dataset
from foxhunt.errors import FoxhuntError
from foxhunt.memory import MB, estimate
from foxhunt.memory.estimator import step_plan
from foxhunt.precision import precision_of
from foxhunt.training.module import build_model, make_optimizer
from foxhunt.training.step import train_step, validation_forward

DAY_NS = 86_400 * 10**9
SHOWN = 5  # instruments named in a line
OFF_SPAN_BARS = 10  # bars after the first (before the last) time of all: listed (delisted)
TIMED_BATCHES = 3  # measured after one warm-up batch


@dataclass
class Inspection:
    """What inspect_data prints: `lines` to read, `facts` (its JSON line), `problems`."""

    lines: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def inspect_data(cfg: DictConfig, time_batches: bool = True) -> Inspection:
    """Inspect the composed train config's data; `time_batches`: measure a training batch."""
    out = Inspection()
    try:
        validate(cfg)
    except FoxhuntError as exc:
        out.problems.append(str(exc))
    d = cfg.data
    try:
        resolve_data(d)
        table, plan = _read(d, out)
    except FoxhuntError as exc:  # nothing more can be read
        out.problems.append(str(exc))
        return out
    out.facts["path"] = str(d.path)
    clock = plan.section.clock  # the run's, as training reads the file
    _instruments(table, d, clock, out)
    _zone(table[d.time_column].cast(pa.int64()).to_numpy(), clock, out)
    loaded = from_table(plan, table, out.problems)  # each instrument's problem, all of them
    _futures(loaded.rolls, d, out)
    if out.problems:
        out.lines.append("features, windows, memory and time: once the problems are fixed")
        return out
    try:
        data = ParquetDataModule(d, seed=cfg.seed)
        data.setup()
    except FoxhuntError as exc:
        out.problems.append(str(exc))
        return out
    out.problems += data.target_warnings  # a return-like column as a level, a constant target
    _features(data, plan.extra, out)
    _windows(data, out)
    _memory(cfg, data, out, time_batches)
    return out


def _read(d: Any, out: Inspection) -> tuple[pa.Table, Any]:
    """The columns training reads, in its common types; a column of a type it refuses is a
    problem, read as zeros so that every other check still runs."""
    dataset = open_dataset(d.path)
    plan = column_plan(dataset, d)
    check_files(dataset, d, plan.values)
    bad = {c for c in plan.values if not is_numeric(dataset.schema.field(c).type)}
    for c in sorted(bad):
        out.problems.append(
            f"column '{c}' is {dataset.schema.field(c).type}, expected a numeric column"
        )
    tables = []
    for fragment in dataset.get_fragments():
        t = read_file(dataset, fragment, projection(plan))
        for c in bad:
            t = t.set_column(t.schema.get_field_index(c), c, pa.array(np.zeros(len(t))))
        tables.append(common_types(plan, t))
    table = pa.concat_tables(tables)
    out.lines.append(
        f"data: {d.path} ({len(tables)} file{'s' * (len(tables) > 1)}, {table.num_rows:,} rows "
        f"read of columns {', '.join(table.column_names)})"
    )
    return table, plan


def _instruments(table: pa.Table, d: Any, clock: Clock, out: Inspection) -> None:
    """Each instrument's (or contract's) span, rows, largest gap and calendar."""
    t = table[d.time_column].cast(pa.int64()).to_numpy()
    ids = table[d.group_column].to_numpy(zero_copy_only=False) if d.group_column else None
    names, codes = np.unique(ids, return_inverse=True) if ids is not None else (["series"], None)
    start, end = int(t.min()), int(t.max())
    distinct = np.unique(t)
    step = float(np.median(np.diff(distinct))) if len(distinct) > 1 else 0.0
    each, saturday = {}, _saturdays(t, clock)
    for g, name in enumerate(names):
        times = np.sort(t if codes is None else t[codes == g])
        gaps = np.diff(times)
        at = int(np.argmax(gaps)) if len(gaps) else 0
        each[str(name)] = {
            "first": _iso(times[0]),
            "last": _iso(times[-1]),
            "rows": len(times),
            "largest_gap_days": round(float(gaps[at]) / DAY_NS, 2) if len(gaps) else 0.0,
            "largest_gap_from": _iso(times[at]) if len(gaps) else None,
            "saturday_bars": int((saturday if codes is None else saturday[codes == g]).sum()),
            "listed": bool(times[0] - start > OFF_SPAN_BARS * step),
            "delisted": bool(end - times[-1] > OFF_SPAN_BARS * step),
        }
    rows = np.array([e["rows"] for e in each.values()])
    listed = [n for n, e in each.items() if e["listed"]]
    delisted = [n for n, e in each.items() if e["delisted"]]
    weekend = [n for n, e in each.items() if e["saturday_bars"]]
    what = "contracts" if futures_enabled(d) else "instruments"
    out.facts["instruments"] = {
        "count": len(each),
        "kind": what,
        "first": _iso(start),
        "last": _iso(end),
        "rows": int(rows.sum()),
        "listed_within": listed,
        "delisted_within": delisted,
        "each": each,
    }
    out.facts["bars"] = {"step_s": step / 1e9, "kind": _bar_kind(step), "weekend": weekend}
    out.lines.append(
        f"{what}: {len(each):,}, {_iso(start)} to {_iso(end)}; rows each {rows.min():,} to "
        f"{rows.max():,} (median {int(np.median(rows)):,}); listed within the period: "
        f"{_named(listed, each, 'first')}; delisted (ended before the last bar): "
        f"{_named(delisted, each, 'last')}"
    )
    widest = sorted(each, key=lambda n: -each[n]["largest_gap_days"])[:SHOWN]
    out.lines.append(
        "largest gaps: "
        + ", ".join(
            f"{n} {each[n]['largest_gap_days']:g} days from {each[n]['largest_gap_from']}"
            for n in widest
        )
    )
    calendars = f"{len(each) - len(weekend)} weekdays only"
    if weekend:
        calendars += f", {len(weekend)} with Saturday bars ({', '.join(weekend[:SHOWN])})"
    out.lines.append(
        f"bars: {_bar_kind(step)} (median step {_duration(step)}); calendars: {calendars}"
        + _sessions(t, step)
    )


def _saturdays(t: np.ndarray, clock: Clock) -> np.ndarray:
    """Whether each time is a Saturday on the configured clock (1970-01-01 was a Thursday)."""
    return (clock.local(t) // DAY_NS + 4) % 7 == 6


def _zone(t: np.ndarray, clock: Clock, out: Inspection) -> None:
    """One warning where the bars keep another zone's daylight-saving dates."""
    zone = daylight.warning(t, clock)
    out.facts["bars"]["zone_warning"] = zone
    if zone:
        out.lines.append(f"warning: {zone}")


def _futures(rolls: list, d: Any, out: Inspection) -> None:
    if not futures_enabled(d):
        out.facts["futures"] = None
        out.lines.append("futures: off (the ids are instruments, not contracts)")
        return
    schedule = [
        {"time": _iso(r.time_ns), "from": r.from_id, "to": r.to_id, "factor": r.factor}
        for r in rolls
    ]
    out.facts["futures"] = {"rule": str(d.futures.roll.rule), "rolls": schedule}
    shown = ", ".join(f"{r['from']}->{r['to']} {r['time'][:10]}" for r in schedule[-SHOWN:])
    out.lines.append(
        f"futures: {len(schedule)} rolls by {d.futures.roll.rule}"
        + (f" (the last: {shown})" if schedule else "")
    )


def _features(data: ParquetDataModule, extra: list[str], out: Inspection) -> None:
    s = data.schema
    derived = [c for c in s.observed if c not in extra]
    out.facts["features"] = {
        "count": s.num_features,
        "derived": derived,
        "extra": [c for c in s.observed if c in extra],
        "known": list(s.known),
        "static": list(s.static),
        "dropped": dict(s.dropped),
        "skipped": dict(s.skipped),
    }
    out.lines.append(
        f"features: {s.num_features} ({len(derived)} observed, {len(s.observed) - len(derived)} "
        f"extra, {len(s.known)} known: {', '.join(s.known) or '-'}; static: "
        f"{', '.join(s.static) or '-'}; dropped as constant: {', '.join(s.dropped) or '-'})"
    )


def _windows(data: ParquetDataModule, out: Inspection) -> None:
    windows = {split: len(data.datasets[split]) for split in data.datasets}
    cuts = data.splits["cuts"]
    out.facts["windows"] = windows
    out.facts["cuts"] = {k: cuts[k] for k in ("val_start", "test_start", "embargo") if k in cuts}
    out.lines.append(
        "windows: "
        + " / ".join(f"{split} {n:,}" for split, n in windows.items())
        + f"; validation from {cuts['val_start']}, test from {cuts['test_start']}, embargo "
        f"{cuts['embargo']} bars"
    )


def _memory(cfg: DictConfig, data: ParquetDataModule, out: Inspection, timed: bool) -> None:
    """The estimator's training and validation step at the configured batch sizes, then
    training and validation batches of the data itself, timed on this machine."""
    est = estimate(cfg, schema=data.schema)
    out.facts["memory"] = {
        "device": est.device,
        "batch_size": est.train.batch_size,
        "train_step_mb": round(est.train.total / MB, 1),
        "val_step_mb": round(est.val.total / MB, 1),
        "parameters": est.params,
    }
    out.lines.append(
        f"memory: a training step at batch {est.train.batch_size} needs "
        f"{est.train.total / MB:,.0f} MB on {est.device} (estimated), validation "
        f"{est.val.total / MB:,.0f} MB; {est.params:,} parameters"
    )
    if not timed:
        return
    train_ms, val_ms = _time_batches(cfg, data, est.device)
    batches = {s: -(-len(data.datasets[s]) // data.batch_size) for s in data.datasets}
    epoch_s = train_ms * batches["train"] / 1e3
    passes_s = val_ms * sum(n for s, n in batches.items() if s != "train") / 1e3
    out.facts["time"] = {
        "train_batch_ms": round(train_ms, 1),
        "val_batch_ms": round(val_ms, 1),
        "epoch_s": round(epoch_s, 1),
        "val_test_passes_s": round(passes_s, 1),
        "threads": torch.get_num_threads(),
    }
    out.lines.append(
        f"time: {train_ms:,.0f} ms a training batch, {val_ms:,.0f} ms a validation batch "
        f"(measured here, {torch.get_num_threads()} threads): an epoch of {batches['train']:,} "
        f"batches about {_duration(epoch_s * 1e9)}, the validation and test passes "
        f"{_duration(passes_s * 1e9)}"
    )


def _time_batches(cfg: DictConfig, data: ParquetDataModule, device: str) -> tuple[float, float]:
    """Median ms of a training step and of a validation forward on the data's own batches."""
    plan = step_plan(cfg, data.schema, device)
    model = build_model(plan.model, plan.schema, plan.precision).to(device)
    optimizer = make_optimizer(model.parameters(), plan.optim)
    quantiles = torch.tensor(plan.model["quantiles"], device=device)
    precision = precision_of(plan.precision)

    def timed(loader: Any, step: Any) -> float:
        took = []
        for i, batch in zip(range(TIMED_BATCHES + 1), loader, strict=False):
            batch = {k: v.to(device) for k, v in batch.items()}
            began = time.perf_counter()
            with precision.autocast(torch.device(device).type):
                step(batch)
            if device == "cuda":
                torch.cuda.synchronize()
            if i:  # the first one warms up
                took.append((time.perf_counter() - began) * 1e3)
        return float(np.median(took)) if took else float("nan")

    model.train()
    train_ms = timed(
        data.train_dataloader(),
        lambda b: train_step(model, optimizer, b, quantiles, clip=plan.clip),
    )
    model.eval()
    val_ms = timed(data.val_dataloader(), lambda b: validation_forward(model, b))
    return train_ms, val_ms


def _bar_kind(step_ns: float) -> str:
    if step_ns >= DAILY_BAR_NS:
        return "daily" if step_ns < 3 * DAY_NS else f"{step_ns / DAY_NS:.0f}-day"
    return f"{step_ns / 60e9:g}-minute" if step_ns >= 60e9 else f"{step_ns / 1e9:g}-second"


def _sessions(t: np.ndarray, step: float) -> str:
    """Intraday bars: the hours a day they cover (the median day's)."""
    if not step or step >= DAILY_BAR_NS:
        return ""
    per_day = np.unique(t // DAY_NS, return_counts=True)[1]
    return f"; about {np.median(per_day) * step / 3.6e12:.1f} hours of bars a day"


def _named(names: list[str], each: dict, key: str) -> str:
    if not names:
        return "none"
    shown = ", ".join(f"{n} {each[n][key][:10]}" for n in names[:SHOWN])
    return f"{len(names)} ({shown}{', ...' if len(names) > SHOWN else ''})"


def _iso(ns: Any) -> str:
    return str(np.datetime64(int(ns), "ns").astype("datetime64[s]")) + "Z"


def _duration(ns: float) -> str:
    s = ns / 1e9
    if s >= DAY_NS / 1e9:
        return f"{s / 86400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"
