"""A forecast study on panels whose progress survives a cut session: cells of (data set, seed,
overrides), each trained by `foxhunt train` in its own process and appended, once finished, as
one JSON row to benchmarks/results/panel_study.jsonl; run again, it skips the finished cells,
whichever study ran them (every study's "default" is the same cells).

    python -m benchmarks.panel_study STUDY [--seeds 0,1,2] [--table] [override ...]

Studies (`STUDIES`) name their data sets and their configurations (a label and overrides);
every cell adds `BASE` and the overrides given here. Data sets are generated, never downloaded
(`DATASETS`): `planted250`, the 250-name daily panel of `benchmarks/planted_panel.py` with a
weak planted alpha (pooled correlation about 0.1 with the next bar's return); `real250`, #69's
realistic panel (`benchmarks/realistic_panel.py`: reversal, momentum and low volatility, each a
rank IC by date of 0.02-0.04); `indices`, #25's
daily planted case (real S&P 500 and NASDAQ bars from the `arch` package's files, a signal
correlated 0.71); `control_<name>`, each positive control's panel
(`foxhunt.evaluation.controls`). A data set's seed is the cell's seed (for `indices`, of the
planted noise). Each row:

- skill (1 - loss / the baseline's, calibrated forecasts) against every baseline, and against
  the strongest at every horizon;
- the horizon-1 IC (cross-sectional where the dates hold enough names) and its t;
- the book's net Sharpe at BASE's cost, 10 bp;
- epochs, steps, wall time, the child's peak RSS, the commit (with "+dirty" for a changed
  tree) and the load average before it.

`--table` prints the table without running: one row per (data set, configuration), the mean
and the spread (min..max) over its seeds. Run it in the background and commit the results
file as cells finish: `nohup python -m benchmarks.panel_study baseline > study.log 2>&1 &`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.bench_real_daily import write_indices
from benchmarks.planted_panel import drift_panel_table, plant_signal, write_planted_panel
from benchmarks.realistic_panel import write_realistic_panel
from foxhunt.evaluation.controls import CONTROLS, make_control
from foxhunt.evaluation.forecasts import quantile_levels

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BASE = ("eval.cost_bps=10", "report=false", "trainer.enable_progress_bar=false")
ENSEMBLE = "ensemble="  # the study's own override (`run_config`), not model.ensemble
# the target of every cell that does not set its own: the recipe the studies began from (the
# cells before data.target_transform=auto ran with it), so "default" stays one recipe
UNLESS_SET = "none"


def _planted250(work: Path, seed: int) -> list[str]:
    return write_planted_panel(work / "panel.parquet", names=250, days=1500, seed=seed)


def _drift250(work: Path, seed: int) -> list[str]:
    """The same panel with a slow alpha in its prices (`plant_drift`: the oracle's correlation
    0.3 with the next bar's return, persistence 0.97, observed with correlation 0.5)."""
    return write_planted_panel(work / "panel.parquet", drift_panel_table(seed=seed))


def _real250(work: Path, seed: int) -> list[str]:
    """#69's realistic panel (`benchmarks/realistic_panel.py`): short-term reversal, momentum
    and the low-volatility effect planted, each alone a rank IC by date of 0.02-0.04; OHLCV and
    the sector, no observed column."""
    return write_realistic_panel(work / "panel.parquet", names=250, days=1500, seed=seed)


def _indices(work: Path, seed: int) -> list[str]:
    """#25's daily planted case: the S&P 500 and the NASDAQ Composite, 1999-2018 (the `arch`
    package's files: pip install --no-deps arch), with a signal correlated 0.71 (the next
    bar's return plus noise of its variance), the noise drawn from `seed`."""
    path = work / "indices.parquet"
    write_indices(path)
    table = plant_signal(pq.read_table(path), 1 / np.sqrt(2), np.random.default_rng(seed))
    pq.write_table(table, path)
    return ["data=parquet", f"data.path={path}", "data.group_column=symbol"] + [
        "data.features=ohlcv",
        "data.extra_features=[signal]",
    ]


def _control(name: str) -> Callable[[Path, int], list[str]]:
    def make(work: Path, seed: int) -> list[str]:
        return list(make_control(name, work, seed=seed).overrides)

    return make


DATASETS: dict[str, Callable[[Path, int], list[str]]] = {
    "planted250": _planted250,
    "drift250": _drift250,
    "real250": _real250,
    "indices": _indices,
    **{f"control_{name}": _control(name) for name in CONTROLS},
}
# study -> (data sets, {configuration label: overrides}); "default" is the recipe as it is
STUDIES: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "baseline": (("planted250", "indices"), {"default": ()}),
    "embedding": (
        ("planted250",),
        {"default": (), "no target scale": ("data.target_scale=global",)},
    ),
    "epochs": (
        ("planted250",),
        {"default": (), "3 epochs": ("trainer.max_epochs=3", "optim.schedule_epochs=3")},
    ),
    "calibration": (
        ("indices", "planted250"),
        {"default": (), "no calibration split": ("data.calibration_share=0",)},
    ),
    "capacity": (
        ("indices",),
        {
            "default": (),
            "hidden 128": ("model.hidden_dim=128",),
            "dropout 0.3": ("model.dropout=0.3",),
            "lr 3e-3": ("optim.lr=3e-3",),
        },
    ),
    "drift": (("drift250",), {"default": ()}),
    # #67: the recipe as a user gets it (its auto target), judged like for like on raw returns
    "verdict": (
        ("drift250", "planted250", "real250"),
        {"auto target": ("data.target_transform=auto",)},
    ),
    # #69: the levers for ranking a realistic panel's names, each beside the default recipe as
    # a user gets it (the verdict study's cells)
    "ranking": (
        ("real250",),
        {
            "auto target": ("data.target_transform=auto",),
            "market context": ("data.target_transform=auto", "data.market_context=true"),
            "xs loss 0.1": ("data.target_transform=auto", "optim.xs_weight=0.1"),
            "xs loss 1": ("data.target_transform=auto", "optim.xs_weight=1"),
            "xs rank inputs": ("data.target_transform=auto", "data.cross_section=rank"),
            # foxhunt's own ensemble (models.ensemble: one run, k members trained side by side)
            "ensemble 3": ("data.target_transform=auto", "model.ensemble=3"),
        },
    ),
    # #69: the ranking study's winning lever on the strong-signal panel
    "ranking_drift": (
        ("drift250",),
        {
            "auto target": ("data.target_transform=auto",),
            "xs loss 0.1": ("data.target_transform=auto", "optim.xs_weight=0.1"),
        },
    ),
    "cross_section": (
        ("drift250", "planted250"),
        {
            "default": (),
            "xs rank inputs": ("data.cross_section=rank",),
            "xs_demean target": ("data.target_transform=xs_demean",),
        },
    ),
    "ensemble": (
        ("indices",),
        {
            "default": (),
            "3 seeds averaged": ("ensemble=3",),
            "hidden 128, 3 seeds averaged": ("model.hidden_dim=128", "ensemble=3"),
        },
    ),
    "unseen": (  # #60: the instrument embedding with its unseen row, without hiding, or none
        ("drift250", "planted250"),
        {
            "xs_demean, embedding, unseen row (default)": (
                "data.target_transform=xs_demean",
                "model.unseen_share=0.1",
                "model.instrument_embedding=true",
            ),
            "xs_demean, embedding, no names hidden": (
                "data.target_transform=xs_demean",
                "model.unseen_share=0",
                "model.instrument_embedding=true",
            ),
            "xs_demean, no embedding": (
                "data.target_transform=xs_demean",
                "model.instrument_embedding=false",
            ),
        },
    ),
    "unseen_controls": (  # the positive controls with the embedding and without
        tuple(f"control_{name}" for name in CONTROLS),
        {
            "embedding, unseen row (default)": (
                "model.unseen_share=0.1",
                "model.instrument_embedding=true",
            ),
            "no embedding": ("model.instrument_embedding=false",),
        },
    ),
    "indices_combined": (  # the width with the whole validation period or with an ensemble
        ("indices",),
        {
            "default": (),
            "hidden 128": ("model.hidden_dim=128",),
            "hidden 128, no calibration split": (
                "model.hidden_dim=128",
                "data.calibration_share=0",
            ),
        },
    ),
    "width": (
        ("indices",),
        {
            "default": (),
            "hidden 128": ("model.hidden_dim=128",),
            "variable_dim 32": ("model.variable_dim=32",),
        },
    ),
    "xs_demean": (  # the market-neutral target alone (the cross_section study's cells)
        ("drift250", "planted250"),
        {"default": (), "xs_demean target": ("data.target_transform=xs_demean",)},
    ),
    "combined": (  # the market-neutral target with the other levers
        ("drift250",),
        {
            "default": (),
            "xs_demean target": ("data.target_transform=xs_demean",),
            "xs_demean, hidden 128": ("data.target_transform=xs_demean", "model.hidden_dim=128"),
            "xs_demean, 3 seeds averaged": ("data.target_transform=xs_demean", "ensemble=3"),
        },
    ),
    "long": (  # the market-neutral target trained three epochs
        ("drift250",),
        {
            "xs_demean target": ("data.target_transform=xs_demean",),
            "xs_demean, 3 epochs": (
                "data.target_transform=xs_demean",
                "trainer.max_epochs=3",
                "optim.schedule_epochs=3",
            ),
        },
    ),
    "recipe": (  # the training length and early stopping
        ("indices",),
        {
            "default": (),
            "no early stopping": ("callbacks.early_stopping_patience=null",),
            "patience 8": ("callbacks.early_stopping_patience=8",),
            "2400 steps, no early stopping": (
                "optim.schedule_steps=2400",
                "callbacks.early_stopping_patience=null",
            ),
        },
    ),
}


def oracle_ic(path: Path, test_start: str) -> float | None:
    """The horizon-1 IC of a panel's ``oracle`` column over the test dates, when it has one:
    each date's correlation across the names of the oracle with the next bar's log return of
    the close, averaged over the dates (the model's IC of a panel, `foxhunt.evaluation.stats.ic`,
    is the same mean over every prediction_length-th date)."""
    if not path.is_file() or "oracle" not in pq.read_schema(path).names:
        return None
    t = pq.read_table(path, columns=["timestamp", "symbol", "close", "oracle"])
    symbol = t["symbol"].to_numpy(zero_copy_only=False)
    time = t["timestamp"].cast("int64").to_numpy()
    start = np.datetime64(test_start.rstrip("Z"), "ns").astype(np.int64)
    keep = (symbol[1:] == symbol[:-1]) & (time[:-1] >= start)
    r = np.diff(np.log(t["close"].to_numpy()))[keep]
    o, at = t["oracle"].to_numpy()[:-1][keep], time[:-1][keep]
    ics = [np.corrcoef(o[at == d], r[at == d])[0, 1] for d in np.unique(at)]
    return float(np.nanmean(ics))


def commit() -> str:
    """HEAD's commit, "+dirty" when the tree has changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    dirty = subprocess.run(  # a results file growing is no change of the code
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
        cwd=ROOT,
        text=True,
        capture_output=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def row_of(summary: dict[str, Any]) -> dict[str, Any]:
    """A cell's figures from its run's summary.json (see the module)."""
    m, e = summary["metrics"], summary["evaluation"]
    mine = m.get("calibrated_test_loss") or m["test_loss"]
    skill = {
        name: 1 - mine / b["test_loss"]
        for name, b in summary["baselines"].items()
        if b.get("test_loss")
    }
    h1 = e["by_horizon"][0]
    book = (summary.get("book") or {}).get("model") or {}
    return {
        "skill": skill,
        "best_baseline": m.get("best_baseline"),
        "skill_by_horizon": [h.get("skill") for h in e["by_horizon"]],
        "ic_h1": h1.get("ic"),
        "ic_h1_t": h1.get("ic_t"),
        "ic_mode": h1.get("ic_mode"),
        "book_sharpe": book.get("sharpe"),
        **verdict_of(summary),
        "epochs": summary["epochs"],
        "steps": summary["global_step"],
    }


def verdict_of(summary: dict[str, Any]) -> dict[str, Any]:
    """#67's like-for-like figures: the skill of the model's own quantiles against the
    baselines' own, both calibrated alike, and on raw returns the rank IC by date at each
    horizon (mean, ICIR, t) and the book's net Sharpe, the model's beside the strongest
    baseline's on the same dates."""
    m, book = summary["metrics"], summary.get("book") or {}

    def ics(rows: list[dict] | None) -> dict[str, dict]:
        keep = ("rank_ic", "icir", "rank_ic_t")
        return {f"h{r['horizon']}": {k: r.get(k) for k in keep} for r in rows or []}

    return {
        "raw_test_loss": m.get("raw_test_loss"),
        "baseline_test_loss": {n: b.get("test_loss") for n, b in summary["baselines"].items()},
        "raw_skill": m.get("skill"),
        "calibrated_skill": m.get("calibrated_skill"),
        "target_transform": (summary.get("target") or {}).get("transform"),
        "book_horizon": book.get("horizon"),
        "rank_ic": ics(book.get("ic_by_horizon")),
        "baseline_rank_ic": ics(book.get("best_baseline_ic_by_horizon")),
        "baseline_book_sharpe": (book.get("best_baseline") or {}).get("sharpe"),
        "baselines_fit_s": {n: b.get("fit_s") for n, b in summary["baselines"].items()},
    }


def run_cell(
    study: str,
    data: str,
    seed: int,
    label: str,
    overrides: list[str],
    train_seed: int | None = None,
) -> dict:
    """Train one cell in a scratch directory (the data of `seed`, the training of `train_seed`,
    by default the same); its row."""
    work = Path(tempfile.mkdtemp(prefix=f"study_{study}_{data}_{seed}_"))
    args = [*DATASETS[data](work, seed), *BASE, *overrides]
    if not any(o.startswith("data.target_transform=") for o in overrides):
        args.append(f"data.target_transform={UNLESS_SET}")
    args += [f"seed={seed if train_seed is None else train_seed}"]
    args += [f"data.cache_dir={work / 'cache'}", f"hydra.run.dir={work / 'run'}"]
    load = os.getloadavg()[0]
    began = time.perf_counter()
    with open(work / "train.log", "w") as log:
        child = subprocess.Popen(
            [str(Path(sys.executable).parent / "foxhunt"), "train", *args],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS (KiB on Linux)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"cell {data}/{seed}/{label} failed: see {work / 'train.log'}")
    summary = json.loads((work / "run" / "summary.json").read_text())
    oracle = oracle_ic(work / "panel.parquet", summary["splits"]["cuts"]["test_start"])
    return {
        "study": study,
        "data": data,
        "seed": seed,
        "config": label,
        "overrides": overrides,
        **row_of(summary),
        **({"oracle_ic_h1": oracle} if oracle is not None else {}),
        "wall_s": round(time.perf_counter() - began, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "load_before": round(load, 2),
        "commit": commit(),
        "run_dir": str(work / "run"),
    }


def run_config(study: str, data: str, seed: int, label: str, overrides: list[str]) -> dict:
    """One cell's row; with the study's own override ensemble=K, K models trained on the same
    data (training seeds seed + 1000 j) and scored as one by `ensemble_row`."""
    k = sum(int(o.removeprefix(ENSEMBLE)) for o in overrides if o.startswith(ENSEMBLE))
    if not k:
        return run_cell(study, data, seed, label, overrides)
    rest = [o for o in overrides if not o.startswith(ENSEMBLE)]
    members = [run_cell(study, data, seed, label, rest, seed + 1000 * j) for j in range(k)]
    return ensemble_row(members) | {"overrides": overrides}


def _scores(table: dict[str, np.ndarray], levels: list[float]) -> dict[str, Any]:
    """A forecast table's (test_forecasts.parquet's columns) skill against its baseline's
    forecasts, overall and by horizon (the loss of the run's metrics: the mean pinball loss
    over the quantiles, in each name's scale), and the h1 IC of the median across the names
    of every date (pooled over dates and names where they hold fewer than three)."""

    # the model's target, which the quantiles forecast (`actual` is the raw return beside it)
    target = next((v for c, v in table.items() if c.startswith("actual_")), table["actual"])

    def loss(prefix: str) -> np.ndarray:
        err = [(target - table[f"{prefix}q{q:g}"]) / table["target_scale"] for q in levels]
        return np.mean(
            [np.maximum(q * e, (q - 1) * e) for q, e in zip(levels, err, strict=True)], axis=0
        )

    mine, theirs, horizon = loss(""), loss("baseline_"), table["horizon"]
    steps = np.unique(horizon)
    h1 = horizon == steps[0]
    at, f, r = table["origin_time"][h1], table["q0.5"][h1], table["actual"][h1]
    ics = [np.corrcoef(f[at == d], r[at == d])[0, 1] for d in np.unique(at) if (at == d).sum() > 2]
    return {
        "skill": 1 - mine.mean() / theirs.mean(),
        "skill_by_horizon": [
            1 - mine[horizon == h].mean() / theirs[horizon == h].mean() for h in steps
        ],
        "ic_h1": float(np.nanmean(ics)) if ics else float(np.corrcoef(f, r)[0, 1]),  # (pooled)
    }


def ensemble_row(members: list[dict]) -> dict:
    """The members' calibrated quantiles averaged, window by window, scored by `_scores`
    beside each member alone (the same figures: the IC of every date, not every
    prediction_length-th as a run's)."""
    tables = []
    for m in members:
        t = pq.read_table(Path(m["run_dir"]) / "test_forecasts.parquet")
        t = t.sort_by(
            [("instrument", "ascending"), ("origin_time", "ascending"), ("horizon", "ascending")]
        )
        tables.append({c: t[c].to_numpy() for c in t.column_names if c != "baseline"})
        baseline = t["baseline"][0].as_py()
    levels = quantile_levels(pq.read_table(Path(members[0]["run_dir"]) / "test_forecasts.parquet"))
    for t in tables[1:]:
        assert np.array_equal(t["actual"], tables[0]["actual"], equal_nan=True), "other windows"
    mean = dict(tables[0]) | {  # (averages of quantiles in order are in order)
        f"q{q:g}": np.mean([t[f"q{q:g}"] for t in tables], axis=0) for q in levels
    }
    alone = [_scores(t, levels) for t in tables]
    scores = _scores(mean, levels)
    return members[0] | {
        "skill": {baseline: scores["skill"]},
        "skill_by_horizon": scores["skill_by_horizon"],
        "ic_h1": scores["ic_h1"],
        "ic_h1_t": None,
        "ic_mode": "cross_section, every date",
        "book_sharpe": None,
        "members": [
            {"skill": a["skill"], "ic_h1": a["ic_h1"], "steps": m["steps"]}
            for a, m in zip(alone, members, strict=True)
        ],
        "epochs": sum(m["epochs"] for m in members),
        "steps": sum(m["steps"] for m in members),
        "wall_s": round(sum(m["wall_s"] for m in members), 1),
        "peak_rss_mb": max(m["peak_rss_mb"] for m in members),
        "run_dir": [m["run_dir"] for m in members],
    }


def finished(path: Path) -> list[dict]:
    """The rows already in the results file."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def key(row: dict) -> tuple:
    return (row["data"], row["seed"], row["config"], tuple(row["overrides"]))


def table(rows: list[dict]) -> None:
    """One Markdown row per (data set, configuration): the mean and the spread (min..max) over
    its seeds of the skill against LightGBM, the skill at the worst horizon (against the
    strongest baseline there), the h1 IC and its share of the oracle's (data sets with an
    oracle), the book's net Sharpe; the mean steps and wall time."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["data"], r["config"]), []).append(r)

    def spread(values: list[float | None], fmt: str) -> str:
        v = np.array([x for x in values if x is not None], dtype=float)
        if not len(v):
            return "n/a"
        return f"{fmt.format(v.mean())} ({fmt.format(v.min())}..{fmt.format(v.max())})"

    def share(r: dict) -> float | None:
        return r["ic_h1"] / r["oracle_ic_h1"] if r.get("oracle_ic_h1") else None

    print(
        "| data | config | seeds | skill vs LightGBM | worst horizon | h1 IC | IC / oracle's "
        "| book net SR | steps | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (data, config), rs in sorted(groups.items()):
        worst = [min(x for x in r["skill_by_horizon"] if x is not None) for r in rs]
        cells = [
            spread([r["skill"].get("lightgbm") for r in rs], "{:+.2%}"),
            spread(worst, "{:+.2%}"),
            spread([r["ic_h1"] for r in rs], "{:.3f}"),
            spread([share(r) for r in rs], "{:.0%}"),
            spread([r["book_sharpe"] for r in rs], "{:.2f}"),
            f"{np.mean([r['steps'] for r in rs]):,.0f}",
            f"{np.mean([r['wall_s'] for r in rs]):.0f}",
        ]
        print(f"| {data} | {config} | {len(rs)} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", choices=sorted(STUDIES))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--table", action="store_true", help="print the table, run nothing")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    path = RESULTS / "panel_study.jsonl"
    datasets, configs = STUDIES[args.study]
    if not args.table:
        done = {key(r) for r in finished(path)}
        for seed in (int(s) for s in args.seeds.split(",")):
            for data in datasets:
                for label, overrides in configs.items():
                    wanted = [*overrides, *args.overrides]
                    if (data, seed, label, tuple(wanted)) in done:
                        continue
                    row = run_config(args.study, data, seed, label, wanted)
                    with path.open("a") as f:  # one line a cell: a cut loses one cell at most
                        f.write(json.dumps(row) + "\n")
                    print(f"done: {data} seed {seed} {label}: {row['wall_s']} s", flush=True)
    rows = [
        r
        for r in finished(path)
        if (r["data"], r["config"]) in {(d, c) for d in datasets for c in configs}
    ]
    table(rows)
    print(json.dumps({"bench": "panel_study", "study": args.study, "rows": len(rows)}))


if __name__ == "__main__":
    main()
