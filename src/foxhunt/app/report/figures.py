"""The run report's figures: each split's range per instrument, the learning curves, the
memory log's highlights and the order in which a panel's instruments are listed."""

from __future__ import annotations

import csv
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.source import open_dataset
from foxhunt.data.splits import SPLITS

log = logging.getLogger(__name__)
MEMORY_LINES = 8  # of the [MEMORY] log in the report
# A listing per instrument (a table, the printed skill) shows up to PANEL_LISTED instruments in
# full; a panel's shows its SHOWN best and SHOWN worst by skill and the spread over all of them:
# 250 rows are read by no one. summary.json keeps every instrument.
PANEL_LISTED = 20
SHOWN = 10


def ranked(
    by_instrument: dict[str, dict] | None, key: str = "skill", low: bool = False
) -> list[str]:
    """The instruments that have a `key` figure, best first: the highest (the lowest with
    `low`), ties in their given order."""
    found = [(n, m.get(key)) for n, m in (by_instrument or {}).items() if m.get(key) is not None]
    return [n for n, _ in sorted(found, key=lambda nv: nv[1] if low else -nv[1])]


def ranking(
    by_instrument: dict[str, dict] | None,
    own: dict[str, dict],
    key: str,
    name: str,
    low: bool = False,
) -> tuple[list[str], str]:
    """The order a listing takes, and its `name`: by skill where the instruments have one (the
    same instruments in every listing), else by the listing's own `key`."""
    skill = ranked(by_instrument)
    return (skill, "skill") if skill else (ranked(own, key, low), name)


def listed(names: list[str], order: list[str]) -> list[tuple[str, list[str]]]:
    """What a listing of `names` shows, as (title, instruments) parts: all of them untitled,
    up to PANEL_LISTED; else the SHOWN best and the SHOWN worst of those ranked in `order`
    (best first), the worst listed worst first."""
    if len(names) <= PANEL_LISTED:
        return [("", names)]
    mine = set(names)
    order = [n for n in order if n in mine]
    best, worst = order[:SHOWN], order[::-1][:SHOWN]
    return [(f"best {len(best)}", best), (f"worst {len(worst)}", worst)]


def cross_sectional(m: dict[str, Any]) -> bool:
    """Whether the metrics' IC is a panel's: the correlation across instruments at each date
    (`foxhunt.evaluation.stats.ic`), the headline a panel leads with."""
    return m.get("ic_mode") == "cross_section" and m.get("ic") is not None


def split_ranges(datamodule: ParquetDataModule) -> list[dict[str, Any]]:
    """Per instrument and split: windows, rows and (where they can be read) the first and last
    bar's time of the split's rows."""
    schema = datamodule.schema
    e, h = schema.encoder_length, schema.prediction_length
    group = datamodule.datasets["train"].group.numpy()  # instrument of every row
    out = []
    for split in SPLITS:
        starts = datamodule.datasets[split].starts.numpy()
        g_of_start = group[starts]
        for g in np.unique(group):
            s = starts[g_of_start == g]
            if len(s) == 0:
                continue
            first = int(s.min()) + (0 if split == "train" else e)  # val/test: their first target
            last = int(s.max()) + e + h - 1
            name = datamodule.datasets["train"].series.names[g] if schema.groups else "(one series)"
            out.append(
                {
                    "instrument": name,
                    "group": int(g),
                    "split": split,
                    "windows": len(s),
                    "rows": last - first + 1,
                    "first_row": first,
                    "last_row": last,
                }
            )
    try:
        _add_dates(datamodule, group, out)
    except Exception as exc:  # the report goes on without dates
        log.warning("report: split dates not shown (%s: %s)", type(exc).__name__, exc)
    return sorted(out, key=lambda r: (r["group"], SPLITS.index(r["split"])))


def _add_dates(datamodule: ParquetDataModule, group: np.ndarray, ranges: list[dict]) -> None:
    """Times of the split bounds from the data's time column. The datamodule keeps no times,
    so they are read again (time and group columns only) and matched to the rows the model saw:
    an instrument's last rows, since feature warm-up and forward-fill drop only leading rows."""
    cfg = datamodule.cfg
    if cfg.nan_policy == "drop" or not ranges:
        return
    columns = [cfg.time_column] + ([cfg.group_column] if cfg.group_column else [])
    table = open_dataset(cfg.path).to_table(columns=columns)
    times = table.column(cfg.time_column)
    names = pc.cast(table.column(cfg.group_column), "string") if cfg.group_column else None
    offsets = {g: int(np.argmax(group == g)) for g in np.unique(group)}
    counts = {g: int((group == g).sum()) for g in offsets}
    for g in offsets:
        if names is not None:
            name = datamodule.datasets["train"].series.names[g]
            t = times.filter(pc.equal(names, name)).to_numpy()
        else:
            t = times.to_numpy()
        skipped = len(t) - counts[g]  # leading rows the model did not see
        if skipped < 0:
            return
        for r in ranges:
            if r["group"] == g:
                r["start"] = bar_time(t[skipped + r["first_row"] - offsets[g]])
                r["end"] = bar_time(t[skipped + r["last_row"] - offsets[g]])


def bar_time(t: Any) -> str:
    """A bar's time as the report shows it: to the minute, or as it was (a plain number)."""
    if isinstance(t, np.datetime64):
        return np.datetime_as_string(t, unit="m").replace("T", " ")
    return str(t)


def panel_splits(ranges: list[dict[str, Any]]) -> list[list[Any]]:
    """A panel's splits, one row each (not one per instrument and split): the split, the
    instruments in it, their windows in all and per instrument (min / median / max), the
    earliest first bar and the latest last one."""

    def when(r: dict[str, Any], key: str) -> Any:  # ISO times in order; plain numbers as numbers
        v = r.get(key)
        return (0, float(v), v) if v is not None and v.lstrip("-").isdigit() else (1, 0.0, v)

    rows = []
    for split in SPLITS:
        mine = [r for r in ranges if r["split"] == split]
        if not mine:
            continue
        windows = np.array([r["windows"] for r in mine])
        each = f"{windows.min()} / {np.median(windows):g} / {windows.max()}"
        dated = [r for r in mine if r.get("start") is not None]
        first = min((when(r, "start") for r in dated), default=(0, 0, None))[2]
        last = max((when(r, "end") for r in dated), default=(0, 0, None))[2]
        rows.append([split, len(mine), int(windows.sum()), each, first, last])
    return rows


def memory_highlights(lines: list[str]) -> list[str]:
    """The memory log's first and last lines and the ones with the highest figures."""
    if len(lines) <= MEMORY_LINES:
        return list(lines)

    def figure(line: str) -> float:  # the phase's peak, else what was in use
        found = re.search(r"peak ([\d.]+) MB", line) or re.search(r": (?:rss )?([\d.]+) MB", line)
        return float(found.group(1)) if found else 0.0

    top = sorted(range(1, len(lines) - 1), key=lambda i: figure(lines[i]))[-(MEMORY_LINES - 2) :]
    return [lines[i] for i in sorted({0, len(lines) - 1, *top})]


def learning_curves(run_dir: Path) -> dict[int, dict[str, float]]:
    """Train and validation loss per epoch from the CSV logger, across resumes into the same
    run directory (csv/metrics.csv, then csv/resume-N/metrics.csv; a later file wins)."""
    files = [run_dir / "csv" / "metrics.csv"]
    resumes = sorted(
        (run_dir / "csv").glob("resume-*/metrics.csv"), key=lambda p: int(p.parent.name[7:])
    )
    epochs: dict[int, dict[str, float]] = {}
    for path in [*files, *resumes]:
        if not path.is_file():
            continue
        with open(path) as f:
            for row in csv.DictReader(f):
                if not row.get("epoch"):
                    continue
                epoch = int(float(row["epoch"]))
                for key in ("train_loss_epoch", "val_loss"):
                    if row.get(key):
                        epochs.setdefault(epoch, {})[key] = float(row[key])
    return dict(sorted(epochs.items()))
