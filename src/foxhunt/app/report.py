"""The run report: `report.md` in a training run's directory, with learning curves, test metrics
against the naive baseline and the honest ones, calibration and the interpretation plots
(`foxhunt.app.interpret`)."""

from __future__ import annotations

import csv
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
from omegaconf import DictConfig, OmegaConf

from foxhunt.app.interpret import PLOTS, have_matplotlib, interpret, new_figure
from foxhunt.app.sweep import markdown_table
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.source import open_dataset
from foxhunt.run.dir import RunDir
from foxhunt.run.progress import steps

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")
LEARNING_CURVES = "learning_curves.png"
MEMORY_LINES = 8  # of the [MEMORY] log in the report
# A listing per instrument (a table, the printed skill) shows up to PANEL_LISTED instruments in
# full; a panel's shows its SHOWN best and SHOWN worst by skill and the spread over all of them:
# 250 rows are read by no one. summary.json keeps every instrument.
PANEL_LISTED = 20
SHOWN = 10
SPREAD = {"min": 0.0, "10%": 0.1, "25%": 0.25, "median": 0.5, "75%": 0.75, "90%": 0.9, "max": 1.0}


def report_run(
    cfg: DictConfig,
    run_dir: str | Path,
    summary: dict[str, Any],
    module: Any,
    datamodule: ParquetDataModule,
) -> dict[str, Path]:
    """Interpret the tested model and write `report.md` with its plots into `run_dir`; returns
    the files written by name (report, interpretation and each plot)."""
    run_dir = Path(run_dir)
    started = time.perf_counter()
    plots = have_matplotlib()
    interpretation = interpret(module, datamodule, run_dir, plots=plots)
    report = write_report(run_dir, cfg, summary, datamodule, interpretation, plots=plots)
    log.info("report: %s written in %.1f s", report, time.perf_counter() - started)
    files = {"report": report, "interpretation": run_dir / "interpretation.json"}
    files |= {name: run_dir / f for name, f in interpretation["plots"].items()}
    if (run_dir / LEARNING_CURVES).is_file():
        files["learning_curves"] = run_dir / LEARNING_CURVES
    return files


def write_report(
    run_dir: str | Path,
    cfg: DictConfig,
    summary: dict[str, Any],
    datamodule: ParquetDataModule,
    interpretation: dict[str, Any],
    plots: bool = True,
) -> Path:
    """Write `report.md` (and `learning_curves.png` when `plots`) into `run_dir`, its sections'
    progress shown on a terminal."""
    run_dir = Path(run_dir)
    title = f"# Run report: {run_dir.parent.name}/{run_dir.name}"
    parts: list[tuple[str, Callable[[], list[str]]]] = [
        ("title", lambda: [title, "", f"Run directory: `{run_dir}`"]),
        ("headline", lambda: headline_section(summary)),
        ("configuration", lambda: _config_section(run_dir, cfg, summary)),
        ("data", lambda: _data_section(datamodule)),
        ("rolls", lambda: _rolls_section(datamodule)),
        ("memory", lambda: _memory_section(summary)),
        ("learning curves", lambda: _curves_section(run_dir, plots)),
        ("test metrics", lambda: _metrics_section(summary, interpretation)),
        ("baselines", lambda: _baselines_section(summary)),
        ("information coefficient", lambda: _quality_section(summary, run_dir, plots)),
        ("conformal calibration", lambda: conformal_section(summary)),
        ("strategy", lambda: _strategy_section(summary, run_dir)),
        ("calibration", lambda: _calibration_section(interpretation)),
        ("interpretation", lambda: _interpretation_section(interpretation)),
    ]
    sections = [make() for _, make in steps(parts, "report", label=lambda p: p[0])]
    path = run_dir / "report.md"
    path.write_text("\n\n".join("\n".join(s) for s in sections if s) + "\n")
    return path


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return markdown_table(head, rows, missing="-")


def ranked(
    by_instrument: dict[str, dict] | None, key: str = "skill", low: bool = False
) -> list[str]:
    """The instruments that have a `key` figure, best first: the highest (the lowest with
    `low`), ties in their given order."""
    found = [(n, m.get(key)) for n, m in (by_instrument or {}).items() if m.get(key) is not None]
    return [n for n, _ in sorted(found, key=lambda nv: nv[1] if low else -nv[1])]


def _ranking(
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


def spread(values: list[float], what: str, fmt: str = "{:+.1%}") -> str:
    """'249 instruments, 41% with positive skill; min -12.3%, 10% -5.1%, ..., max +8.2%': how
    `what` is spread over the instruments."""
    v = np.asarray(values, dtype=np.float64)
    at = np.quantile(v, list(SPREAD.values()))
    figures = ", ".join(f"{name} {fmt.format(x)}" for name, x in zip(SPREAD, at, strict=True))
    return f"{len(v)} instruments, {np.mean(v > 0):.0%} with positive {what}; {figures}"


def _panel_note(
    parts: list[tuple[str, list[str]]], values: list[float], what: str, fmt: str, by: str
) -> list[str]:
    """A panel's listing comes with the spread of `what` over every instrument and says which
    instruments it shows (the best and worst `by`)."""
    if len(parts) == 1:
        return []
    over = f"{what[0].upper() + what[1:]} over {spread(values, what, fmt)}. " if values else ""
    return [
        "",
        f"{over}Shown: the {SHOWN} best and the {SHOWN} worst instruments by {by} (summary.json "
        "has every one).",
    ]


def _parts_tables(parts: list[tuple[str, list[str]]], head: list[str], row: Any) -> list[str]:
    """One table per part of a listing (`listed`), each titled but a listing in full."""
    lines = []
    for title, names in parts:
        lines += ["", *([f"{title.capitalize()}:", ""] if title else [])]
        lines += _table(head, [row(n) for n in names])
    return lines


def ic_figures(m: dict[str, Any]) -> str:
    """'IC +0.021 (se 0.006, t 3.4, 480 dates), rank IC +0.018 (t 2.9)' of the metrics `m`."""
    t = "n/a" if m.get("ic_t") is None else f"{m['ic_t']:.1f}"
    se = "" if m.get("ic_se") is None else f"se {m['ic_se']:.3f}, "
    dates = f", {m['ic_n']} dates" if m.get("ic_mode") == "cross_section" and m.get("ic_n") else ""
    line = f"IC {m['ic']:+.3f} ({se}t {t}{dates})"
    if m.get("rank_ic") is not None:
        rank_t = "n/a" if m.get("rank_ic_t") is None else f"{m['rank_ic_t']:.1f}"
        line += f", rank IC {m['rank_ic']:+.3f} (t {rank_t})"
    return line


def cross_sectional(m: dict[str, Any]) -> bool:
    """Whether the metrics' IC is a panel's: the correlation across instruments at each date
    (`foxhunt.evaluation.stats.ic`), the headline a panel leads with."""
    return m.get("ic_mode") == "cross_section" and m.get("ic") is not None


def headline_section(summary: dict[str, Any]) -> list[str]:
    """A panel's report leads with its cross-sectional IC, with its standard error, and the
    skill pooled and per instrument."""
    m = summary.get("metrics") or {}
    if not cross_sectional(m):
        return []
    lines = [
        "## Headline",
        "",
        f"**Cross-sectional {ic_figures(m)}**: the correlation of the median forecast's move "
        "with the realised one across the instruments at each test date, averaged over the "
        "dates; standard error Newey-West over the dates (a t beyond 2 is unlikely by chance).",
    ]
    if m.get("skill") is not None:
        per = [m["by_instrument"][n]["skill"] for n in ranked(m.get("by_instrument"))]
        lines += [
            "",
            f"Skill against the strongest baseline ({m['best_baseline']}): {m['skill']:+.2%}"
            + (f"; per instrument: {spread(per, 'skill')}." if len(per) > 1 else "."),
        ]
    return lines


def _config_section(run_dir: Path, cfg: DictConfig, summary: dict[str, Any]) -> list[str]:
    lines = ["## Configuration", ""]
    saved = RunDir(run_dir).overrides
    if saved.is_file():
        overrides = list(OmegaConf.load(saved))
        shown = " ".join(f"`{o}`" for o in overrides) if overrides else "none (the defaults)"
        lines += [f"Overrides: {shown}", ""]
    if summary.get("resumed_from"):
        lines += [f"Resumed from `{summary['resumed_from']}`", ""]
    chosen = RunDir(run_dir).hydra / "hydra.yaml"
    if chosen.is_file():  # the option of each config group (model=tft_small, memory=default)
        choices = OmegaConf.load(chosen).hydra.runtime.choices
        groups = [f"`{g}={c}`" for g, c in choices.items() if c and not g.startswith("hydra")]
        lines += [f"Groups: {' '.join(groups)}", ""]
    keys = [
        "data.path",
        "data.target",
        "data.features",
        "data.encoder_length",
        "data.prediction_length",
        "model.hidden_dim",
        "model.num_heads",
        "model.lstm_layers",
        "model.dropout",
        "model.quantiles",
        "precision.trainer_precision",
        "precision.qat",
        "optim.lr",
        "optim.schedule",
        "trainer.max_epochs",
        "memory.budget_mb",
        "seed",
    ]
    rows = []
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if OmegaConf.is_config(value):  # model.quantiles: shown as a plain list
            value = OmegaConf.to_container(value)
        rows.append([f"`{key}`", value])
    return lines + _table(["key", "value"], rows)


def _data_section(datamodule: ParquetDataModule) -> list[str]:
    schema = datamodule.schema
    rows = len(datamodule.datasets["train"].target)
    instruments = schema.groups or ["(one series)"]
    names = ", ".join(instruments)
    if len(instruments) > PANEL_LISTED:
        names = ", ".join(instruments[:SHOWN]) + ", ... (all in summary.json's splits)"
    lines = [
        "## Data",
        "",
        f"- Instruments ({len(instruments)}): {names}",
        f"- Rows: {rows:,} (after feature warm-up and NaN handling)",
        f"- Features: {schema.num_features} ({len(schema.observed)} observed, "
        f"{len(schema.known)} known in the future, {len(schema.static)} static); "
        f"target `{schema.target}` ({schema.target_kind}), encoder {schema.encoder_length} "
        f"bars, forecast {schema.prediction_length} bars",
    ]
    if schema.skipped:
        skipped = ", ".join(f"`{c}` ({why})" for c, why in schema.skipped.items())
        lines.append(f"- Not numeric, so left out by `data.features=all`: {skipped}")
    if schema.dropped:
        dropped = ", ".join(f"`{c}`" for c in schema.dropped)
        lines.append(f"- Constant over the training split, so not given to the model: {dropped}")
    lines.append("")
    ranges = split_ranges(datamodule)
    if len(instruments) > PANEL_LISTED:
        lines += _splits_of_a_panel(ranges)
    else:
        table = [
            [r["instrument"], r["split"], r["windows"], r["rows"], r.get("start"), r.get("end")]
            for r in ranges
        ]
        lines += _table(["instrument", "split", "windows", "rows", "from", "to"], table)
    if ranges and "start" not in ranges[0]:
        lines += ["", "(Dates not shown: data.nan_policy=drop or the time column unreadable.)"]
    return lines


def _splits_of_a_panel(ranges: list[dict[str, Any]]) -> list[str]:
    """A panel's splits, one row each (not one per instrument and split): the instruments in
    it, their windows in all and per instrument, the earliest first bar and latest last one."""

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
    head = ["split", "instruments", "windows", "per instrument (min / median / max)", "from", "to"]
    return _table(head, rows)


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
            name = schema.groups[g] if schema.groups else "(one series)"
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
            t = times.filter(pc.equal(names, datamodule.schema.groups[g])).to_numpy()
        else:
            t = times.to_numpy()
        skipped = len(t) - counts[g]  # leading rows the model did not see
        if skipped < 0:
            return
        for r in ranges:
            if r["group"] == g:
                r["start"] = _when(t[skipped + r["first_row"] - offsets[g]])
                r["end"] = _when(t[skipped + r["last_row"] - offsets[g]])


def _when(t: Any) -> str:
    if isinstance(t, np.datetime64):
        return np.datetime_as_string(t, unit="m").replace("T", " ")
    return str(t)


def _rolls_section(datamodule: ParquetDataModule) -> list[str]:
    """data.futures: when each root's continuous series moved to its next contract."""
    rolls = getattr(datamodule, "rolls", [])
    if not rolls:
        return []
    rows = [
        [
            _when(np.datetime64(r.time_ns, "ns")),
            r.from_id,
            r.to_id,
            r.factor,
            "yes" if r.held_at_end else "no",
        ]
        for r in rolls
    ]
    return [
        "## Futures rolls",
        "",
        f"{len(rolls)} rolls (`rolls.csv`; `data.futures.roll`): from each roll on the next "
        "contract is held; earlier prices are multiplied by the factor (the next contract's "
        "close over the front's at the last common bar: the inputs, ratios of prices, are each "
        "contract's own whatever `roll.adjust` says). Each root's last `to` is held at the end "
        "of the data.",
        "",
        *_table(["first bar held", "from", "to", "factor", "held at the end"], rows),
    ]


def _memory_section(summary: dict[str, Any]) -> list[str]:
    memory = summary.get("memory") or {}
    rows = [
        ["training batch size (per process)", summary.get("batch_size")],
        ["validation batch size", summary.get("val_batch_size")],
        ["processes", summary.get("world_size", 1)],
        ["device", memory.get("device")],
        ["peak memory MB", memory.get("peak_mb")],
    ]
    if "searched_batch_size" in memory:
        rows += [
            ["searched batch size", memory["searched_batch_size"]],
            ["searched validation batch size", memory.get("searched_val_batch_size")],
            ["search trials", len(memory.get("search_trials") or [])],
        ]
    backoffs = memory.get("oom_backoffs") or []
    rows.append(["OOM backoffs", len(backoffs)])
    micro = {k: v for k, v in (memory.get("micro_batch_size") or {}).items() if v}
    if micro:
        rows.append(["micro-batch sizes after backoff", micro])
    if "optimizer_state_released_mb" in memory:
        rows.append(["optimizer state released MB", memory["optimizer_state_released_mb"]])
    lines = ["## Batch sizes and memory", "", *_table(["", "value"], rows)]
    for event in backoffs:
        lines.append(f"- backoff: {event}")
    log_lines = memory.get("log") or []
    if log_lines:
        shown = _memory_highlights(log_lines)
        lines += ["", f"Memory log ({len(shown)} of {len(log_lines)} lines):", "", "```"]
        lines += [*shown, "```"]
    return lines


def _memory_highlights(lines: list[str]) -> list[str]:
    """The first and last lines and the ones with the highest figures."""
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


def _plot_learning_curves(path: Path, epochs: dict[int, dict[str, float]]) -> bool:
    fig = new_figure(figsize=(7, 4))
    ax = fig.subplots()
    for key, label in (("train_loss_epoch", "train loss"), ("val_loss", "validation loss")):
        points = [(e, v[key]) for e, v in epochs.items() if key in v]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("quantile loss (normalized target)")
    ax.set_title("Learning curves")
    from matplotlib.ticker import MaxNLocator

    if len(epochs) <= 20:
        ax.set_xticks(list(epochs))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)  # one epoch: a point mid-axis, not a dot
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)
    return True


def _curves_section(run_dir: Path, plots: bool) -> list[str]:
    """The learning curves' table, and their plot (`plots`)."""
    epochs = learning_curves(run_dir)
    drew = plots and bool(epochs) and _plot_learning_curves(run_dir / LEARNING_CURVES, epochs)
    lines = ["## Learning curves", ""]
    if not epochs:
        return [*lines, "No logged epochs (the CSV logger writes csv/metrics.csv)."]
    if drew:
        lines += [f"![learning curves]({LEARNING_CURVES})", ""]
    rows = [[e, v.get("train_loss_epoch"), v.get("val_loss")] for e, v in epochs.items()]
    return lines + _table(["epoch", "train loss", "validation loss"], rows)


def _metrics_section(summary: dict[str, Any], interpretation: dict[str, Any]) -> list[str]:
    m = summary.get("metrics") or {}
    loss, baseline = m.get("test_loss"), m.get("baseline_test_loss")
    rows = [
        ["quantile loss (normalized)", loss, baseline],
        ["MAE of the median (target units)", m.get("test_mae"), interpretation.get("baseline_mae")],
        ["directional accuracy", m.get("test_directional_accuracy"), None],
        ["outer-interval coverage", m.get("test_coverage"), None],
    ]
    if "int8_test_loss" in summary:
        rows.append(["quantile loss, exported int8 model", summary["int8_test_loss"], baseline])
    val_loss = m.get("val_loss")
    val = f"{val_loss:.4g}" if val_loss is not None else "-"
    lines = ["## Test metrics", "", f"Validation loss (best checkpoint): {val}", ""]
    lines += _table(["metric", "model", "naive baseline"], rows)
    if loss is not None and baseline:
        change = loss / baseline - 1
        than = f"{abs(change):.1%} {'lower' if change < 0 else 'higher'} than"
        lines += ["", f"The model's test loss is {than} the naive baseline's."]
    kind = interpretation.get("target_kind")
    naive = "a zero return" if kind == "return" else "the last observed value"
    return [*lines, "", f"Naive baseline: {naive} for every forecast step."]


def _baselines_section(summary: dict[str, Any]) -> list[str]:
    """Each baseline's losses beside the model's, the skill against the strongest, named, and
    the directional accuracy beside the base rate it must beat."""
    m, baselines = summary.get("metrics") or {}, summary.get("baselines")
    if not baselines:
        return ["## Baselines", "", "(Not scored in this run.)"]
    loss = m.get("test_loss")
    rows = [["**model**", loss, m.get("val_loss"), None, m.get("test_directional_accuracy"), ""]]
    for name, b in baselines.items():
        if "skipped" in b:
            rows.append([name, None, None, None, None, f"skipped: {b['skipped']}"])
            continue
        against = None
        if loss is not None and b.get("test_loss"):
            against = f"{1 - loss / b['test_loss']:+.1%}"
        rows.append(
            [
                name,
                b.get("test_loss"),
                b.get("val_loss"),
                against,
                b.get("test_directional_accuracy"),
                b["about"],
            ]
        )
    head = ["forecast", "test loss", "validation loss", "model's skill", "direction", "what"]
    lines = [
        "## Baselines",
        "",
        "Fit on the training windows only, scored on the model's own validation and test windows "
        "with its quantile loss (normalized); skill = 1 - model's test loss / baseline's.",
        "",
        *_table(head, rows),
        "",
    ]
    subsampled = {n: b["subsampled"] for n, b in baselines.items() if "subsampled" in b}
    if subsampled:
        lines += [subsample_note(subsampled), ""]
    if m.get("skill") is not None:
        lines.append(
            f"**Skill against the strongest baseline ({m['best_baseline']}): {m['skill']:+.2%}**"
            f" ({'better' if m['skill'] > 0 else 'no better'} than it on the test windows)."
        )
    accuracy, up = m.get("test_directional_accuracy"), m.get("test_up_share")
    if accuracy is not None and up is not None:
        lines.append(
            f"Directional accuracy {accuracy:.1%} against a base rate of {max(up, 1 - up):.1%} "
            f"(always {'up' if up >= 0.5 else 'down'}: {up:.1%} of the test moves were up)."
        )
    return [*lines, *instrument_table(m.get("by_instrument"), baselines)]


def subsample_note(subsampled: dict[str, dict[str, int]]) -> str:
    """Which baselines were fit on a subsample of the training windows, and of how many."""
    sizes: dict[int, list[str]] = {}
    for name, s in subsampled.items():
        sizes.setdefault(s["to"], []).append(name)
    parts = "; ".join(f"{to:,} for {', '.join(names)}" for to, names in sizes.items())
    total = max(s["from"] for s in subsampled.values())
    return (
        f"Fit on evenly spaced subsamples of the {total:,} training windows: {parts} (the time "
        "a fit takes grows with its windows; `foxhunt.evaluation.baselines`' TABLE_WINDOWS and "
        "MODEL_WINDOWS)."
    )


def instrument_table(
    by_instrument: dict[str, dict] | None, baselines: dict[str, dict]
) -> list[str]:
    """Per instrument: the model's test loss, each baseline's, the skill against the
    instrument's strongest baseline (named), the directional accuracy and the up share; a
    panel's best and worst by skill (`listed`) after the spread over every instrument."""
    if not by_instrument:
        return []
    rivals = [n for n, b in baselines.items() if "skipped" not in b]
    head = ["instrument", "windows", "model", *rivals, "skill", "against", "direction", "up share"]

    def row(name: str) -> list[Any]:
        m = by_instrument[name]
        losses = [baselines[r].get("test_by_instrument", {}).get(name, {}) for r in rivals]
        skill = m.get("skill")
        return [
            name,
            m.get("windows"),
            m.get("test_loss"),
            *(b.get("test_loss") for b in losses),
            None if skill is None else f"{skill:+.1%}",
            m.get("best_baseline"),
            m.get("test_directional_accuracy"),
            m.get("up_share", m.get("test_up_share")),
        ]

    order, by = _ranking(by_instrument, by_instrument, "test_loss", "test loss", low=True)
    parts = listed(list(by_instrument), order)
    skills = [m["skill"] for m in by_instrument.values() if m.get("skill") is not None]
    return [
        "",
        "### Per instrument",
        "",
        "Test quantile loss (normalized) of the model and of each baseline on the instrument's "
        "own test windows; skill against the instrument's strongest baseline.",
        *_panel_note(parts, skills, "skill", "{:+.1%}", by),
        *_parts_tables(parts, head, row),
    ]


def _quality_section(summary: dict[str, Any], run_dir: Path, plots: bool) -> list[str]:
    """The IC and rank IC with their standard errors, per horizon and instrument, the hit
    rates against the majority sign, the probabilistic scores, and their plots."""
    m, ev = summary.get("metrics") or {}, summary.get("evaluation")
    if not ev:
        return []
    drew = plots and _plot_quality(run_dir, ev, summary.get("calibration"))
    lines = [
        "## Information coefficient and calibration",
        "",
        f"Over every {ev['stride']}th test window of each instrument ({ev['windows_scored']} of "
        f"{ev['windows']}: targets that do not overlap); standard errors Newey-West over the "
        f"target times ({m.get('ic_mode', '')}). IC: Pearson correlation of the median "
        "forecast's move with the realised one; rank IC: Spearman's.",
        "",
    ]
    head = ["horizon", "IC", "se", "t", "rank IC", "se", "t", "hit rate", "majority sign"]
    keys = ["ic", "ic_se", "ic_t", "rank_ic", "rank_ic_se", "rank_ic_t"]
    rows = [
        [h["horizon"], *(h[k] for k in keys), h["hit_rate"], h["majority_rate"]]
        for h in ev["by_horizon"]
    ]
    rows.append(["all", *(m.get(k) for k in keys), m.get("hit_rate"), m.get("majority_rate")])
    lines += _table(head, rows)
    ics = ev["by_instrument"]
    if len(ics) > 1:
        # a panel's: the instruments of the best and worst skill, as in the per-instrument table
        order, by = _ranking(m.get("by_instrument"), ics, "ic", "IC")
        parts = listed(list(ics), order)
        values = [i["ic"] for i in ics.values() if i["ic"] is not None]
        lines += _panel_note(parts, values, "IC", "{:+.3f}", by)
        lines += _parts_tables(
            parts, ["instrument", *head[1:7]], lambda n: [n, *(ics[n][k] for k in keys)]
        )
    pinball = ", ".join(
        f"{q:g}: {v:.4f}" for q, v in zip(ev["quantiles"], ev["pinball_by_quantile"], strict=True)
    )
    lines += [
        "",
        f"CRPS (from the quantiles, normalized) {m.get('crps', 0):.4f}; interval (Winkler) score "
        f"of the outer interval {m.get('winkler', 0):.4f}; pinball loss per quantile: {pinball}.",
    ]
    if drew:
        lines += ["", "![IC by horizon](ic_by_horizon.png) ![calibration](calibration.png)"]
    return lines


def _plot_quality(run_dir: Path, ev: dict[str, Any], cal: dict[str, Any] | None) -> bool:
    """ic_by_horizon.png (IC and rank IC with 2-standard-error bars) and calibration.png
    (observed against nominal level: the model's own and calibrated, pooled, and calibrated
    per horizon; the PIT histogram of the calibrated forecasts)."""
    steps = [h["horizon"] for h in ev["by_horizon"]]
    fig = new_figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    for key, shift in (("ic", -0.1), ("rank_ic", 0.1)):
        values = [h[key] if h[key] is not None else np.nan for h in ev["by_horizon"]]
        errors = [2 * h[f"{key}_se"] if h[f"{key}_se"] else 0 for h in ev["by_horizon"]]
        ax.errorbar(np.add(steps, shift), values, yerr=errors, fmt="o", capsize=3, label=key)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set(xlabel="horizon step", ylabel="correlation", title="IC by horizon (+-2 se)")
    ax.set_xticks(steps)
    ax.legend()
    fig.savefig(run_dir / "ic_by_horizon.png", dpi=110)

    fig = new_figure(figsize=(9, 3.5))
    ax, pit = fig.subplots(1, 2)
    nominal = ev["quantiles"]
    for h, observed in zip(steps, ev["coverage_by_horizon"], strict=True):
        ax.plot(nominal, observed, lw=0.5, alpha=0.5, label=f"step {h}")
    if cal and cal.get("before"):
        ax.plot(nominal, cal["before"]["share_below"], "k--", marker="o", label="model")
        ax.plot(nominal, cal["after"]["share_below"], "k-", marker="o", label=cal["method"])
    ax.plot([0, 1], [0, 1], color="grey", lw=0.6)
    ax.set(xlabel="nominal level", ylabel="observed share below", title="Calibration")
    ax.legend(fontsize=6)
    counts = np.asarray(ev["pit"])
    pit.bar(np.arange(len(counts)) / len(counts), counts, width=1 / len(counts), align="edge")
    pit.axhline(counts.sum() / len(counts), color="grey", lw=0.6)
    pit.set(xlabel="PIT", ylabel="count", title="PIT histogram (flat: calibrated)")
    fig.savefig(run_dir / "calibration.png", dpi=110)
    return True


def _strategy_section(summary: dict[str, Any], run_dir: Path) -> list[str]:
    s = summary.get("strategy")
    if not s:
        return []
    if "skipped" in s:
        return ["## Strategy", "", f"(Not run: {s['skipped']}.)"]
    keys = ["sharpe", "sharpe_se", "max_drawdown", "turnover", "net_return"]
    per = s["by_instrument"]
    order, by = _ranking(
        (summary.get("metrics") or {}).get("by_instrument"), per, "sharpe", "Sharpe ratio"
    )
    parts = listed(list(per), order)
    sharpes = [i["sharpe"] for i in per.values() if i.get("sharpe") is not None]
    rows = [["**model (equal-risk portfolio)**", *(s[k] for k in keys)]]
    for title, names in parts:  # a panel's best and worst instruments by skill, so named
        named = [f"model, {n}" + (f" ({title})" if title else "") for n in names]
        rows += [[label, *(per[n][k] for k in keys)] for label, n in zip(named, names, strict=True)]
    rows.append(["buy and hold", *(s["buy_and_hold"][k] for k in keys)])
    if "best_baseline" in s:
        b = s["best_baseline"]
        rows.append([f"best baseline ({b['name']})", *(b[k] for k in keys)])
    lines = [
        "## Strategy",
        "",
        f"Positions from the horizon-1 forecast (`eval.strategy={s['rule']}`), held one bar, "
        f"costs {s['cost_bps']:g} bp per unit of turnover; Sharpe annualised from the bars' "
        "frequency; returns summed, not compounded (foxhunt/evaluation/strategy.py).",
        "",
        *_table(["strategy", "Sharpe (net)", "se", "max drawdown", "turnover", "net return"], rows),
        *_panel_note(parts, sharpes, "Sharpe ratio", "{:+.2f}", by),
        "",
        "The standard error (Lo 2002, i.i.d. returns) says how far the Sharpe ratio of this "
        "test period can be from zero by chance: a short period of fast bars gives a large one.",
    ]
    if (run_dir / "equity.png").is_file():
        lines += ["", "![equity curves](equity.png)"]
    return lines


def conformal_section(summary: dict[str, Any]) -> list[str]:
    """The test forecasts before and after each calibration method, per interval and horizon."""
    cal = summary.get("calibration")
    if not cal or not cal.get("before", {}).get("intervals"):
        return []
    fitted = (
        f"fitted on {cal['calibration_windows']} validation windows"
        if "calibration_windows" in cal
        else "each fold's fitted on its own validation windows"
    )
    lines = [
        "## Conformal calibration",
        "",
        f"`calibration.method={cal['method']}` ({fitted}; "
        "foxhunt/evaluation/calibration.py): the test windows' intervals before (the model's "
        "own quantiles) and after; verdict `better` when the outer interval's coverage is "
        f"nearer its nominal level and the pinball loss no worse. Verdict: **{cal['verdict']}**.",
        "",
    ]
    methods = {"model": cal["before"], **(cal.get("methods") or {cal["method"]: cal["after"]})}
    head = ["forecasts", "interval", "nominal", "coverage", "width", "Winkler", "pinball", "CRPS"]
    rows = [
        [
            name,
            f"{i['levels'][0]:g}-{i['levels'][1]:g}",
            i["nominal"],
            i["coverage"],
            i["width"],
            i["winkler"],
            f["pinball"],
            f["crps"],
        ]  # fmt: skip
        for name, f in methods.items()
        for i in f["intervals"]
    ]
    lines += _table(head, rows)
    outer = [f["intervals"][0]["coverage_by_horizon"] for f in methods.values()]
    steps = range(1, len(outer[0]) + 1)
    by_step = [[h, *c] for h, *c in zip(steps, *outer, strict=True)]
    lines += ["", "Coverage of the outer interval per horizon step:", ""]
    lines += _table(["horizon", *methods], by_step)
    if cal.get("crossing_rate_model") is not None:
        lines += [
            "",
            f"Quantile crossing: {cal['crossing_rate_model']:.2%} of the model's test steps, "
            f"{cal['crossing_rate']:.2%} after calibration.",
        ]
    return lines


def _calibration_section(interpretation: dict[str, Any]) -> list[str]:
    cal = interpretation["calibration"]
    rows = [
        [q, observed, observed - q]
        for q, observed in zip(cal["quantiles"], cal["observed_coverage"], strict=True)
    ]
    return [
        "## Calibration",
        "",
        "Share of test targets at or below each predicted quantile (ideal: the quantile level).",
        "",
        *_table(["quantile", "observed", "observed - ideal"], rows),
        "",
        f"Quantile crossing (predicted quantiles out of order, sorted before scoring): "
        f"{cal['quantile_crossing_rate']:.2%} of forecast steps.",
    ]


def _interpretation_section(interpretation: dict[str, Any]) -> list[str]:
    lines = [
        "## Interpretation",
        "",
        f"Over {interpretation['windows']:,} test windows (`interpretation.json` has the numbers).",
    ]
    for net, found in interpretation["variable_importance"].items():
        if found["names"]:
            top = sorted(zip(found["weights"], found["names"], strict=True), reverse=True)[:5]
            lines.append(f"- Top {net} variables: " + ", ".join(f"`{n}` {w:.3f}" for w, n in top))
    by_lag = interpretation["attention"]["by_lag"]
    peak = int(np.argmax(by_lag)) + 1
    lines.append(f"- Attention peaks at lag {peak} (1 = the latest bar before the forecast).")
    titles = {
        "variable_importance": "variable importance",
        "attention_by_lag": "attention by lag",
        "forecast_fan": "forecast fan chart",
    }
    for name in PLOTS:
        if name in interpretation["plots"]:
            lines += ["", f"![{titles[name]}]({interpretation['plots'][name]})"]
    if not interpretation["plots"]:
        lines += ["", "(No plots: matplotlib is not installed.)"]
    return lines


def _horizon_line(h: dict[str, Any]) -> str:
    """ "horizon 1: IC +0.123 (t 4.5), skill +1.2%": one step's figures, apart from the pool."""
    t = "n/a" if h.get("ic_t") is None else f"{h['ic_t']:.1f}"
    line = f"horizon {h['horizon']}: IC " + ("n/a" if h.get("ic") is None else f"{h['ic']:+.3f}")
    line += f" (t {t})"
    return line + ("" if h.get("skill") is None else f", skill {h['skill']:+.1%}")


def _calibration_line(cal: dict[str, Any]) -> str:
    """The outer interval's test coverage and width before and after calibration, in one line."""
    b, a = cal["before"]["intervals"][0], cal["after"]["intervals"][0]
    lo, hi = b["levels"]
    return (
        f"calibration ({cal['method']}): the {lo:g}-{hi:g} interval held {b['coverage']:.1%} "
        f"-> {a['coverage']:.1%} of the test targets (nominal {b['nominal']:.0%}), width "
        f"{b['width']:.3g} -> {a['width']:.3g}, pinball {cal['before']['pinball']:.4f} -> "
        f"{cal['after']['pinball']:.4f}: {cal['verdict'] or 'not calibrated'}"
    )


def console_summary(summary: dict[str, Any], report: Path | None = None) -> list[str]:
    """What a person reads at the end of a run, before its JSON line: a panel's cross-sectional
    IC first, the test loss and the skill against the strongest baseline (per instrument too: a
    panel's spread, best and worst), direction against its base rate, calibration in one line,
    and where the report is (`report`, default the run's report.md)."""
    m = summary.get("metrics") or {}
    if m.get("test_loss") is None:
        return []
    lines = [f"test loss {m['test_loss']:.4f} (quantile loss, normalized)"]
    if m.get("calibrated_test_loss") is not None:
        lines[0] = lines[0][:-1] + f"; calibrated {m['calibrated_test_loss']:.4f})"
    if m.get("skill") is not None:
        verdict = "beats" if m["skill"] > 0 else "does not beat"
        lines[0] += (
            f"; skill {m['skill']:+.1%} against {m['best_baseline']}, the strongest baseline: "
            f"the model {verdict} it"
        )
    if cross_sectional(m):
        lines.insert(0, f"cross-sectional {ic_figures(m)}")
    per = m.get("by_instrument") or {}
    order = ranked(per)
    parts = listed(order, order)
    if len(parts) > 1:  # a panel
        lines.append(f"skill per instrument: {spread([per[n]['skill'] for n in order], 'skill')}")
        for title, names in parts:
            lines.append(f"  {title}: " + ", ".join(f"{n} {per[n]['skill']:+.1%}" for n in names))
    elif len(order) > 1:
        lines.append(
            "skill per instrument: "
            + ", ".join(
                f"{name} {p['skill']:+.1%} ({p['best_baseline']})"
                for name, p in per.items()
                if p.get("skill") is not None
            )
        )
    accuracy, up = m.get("test_directional_accuracy"), m.get("test_up_share")
    if accuracy is not None and up is not None:
        lines.append(
            f"direction: {accuracy:.1%} right, against {max(up, 1 - up):.1%} for always "
            f"{'up' if up >= 0.5 else 'down'}"
        )
    if m.get("ic") is not None and not cross_sectional(m):
        lines.append(ic_figures(m))
    horizons = [_horizon_line(h) for h in m.get("horizons") or []]
    if horizons:
        lines.append("; ".join(horizons))
    strategy = summary.get("strategy") or {}
    if strategy.get("sharpe") is not None:
        hold = strategy["buy_and_hold"].get("sharpe")
        se = strategy.get("sharpe_se")
        lines.append(
            f"strategy ({strategy['rule']}, {strategy['cost_bps']:g} bp costs): Sharpe "
            f"{strategy['sharpe']:.2f} after costs"
            + ("" if se is None else f" (standard error {se:.2f})")
            + ", buy and hold "
            + ("n/a" if hold is None else f"{hold:.2f}")
        )
    quantiles, coverage = summary.get("quantiles"), m.get("test_coverage")
    cal = summary.get("calibration") or {}
    if cal.get("before", {}).get("intervals"):
        lines.append(_calibration_line(cal))
    elif quantiles and coverage is not None:
        nominal = quantiles[-1] - quantiles[0]
        lines.append(
            f"calibration: the {quantiles[0]:g}-{quantiles[-1]:g} interval held {coverage:.1%} "
            f"of the test targets (nominal {nominal:.0%})"
        )
    if report is None and summary.get("run_dir"):
        report = Path(summary["run_dir"]) / "report.md"
    if report is not None and report.is_file():
        lines.append(f"report: {report}")
    return lines
