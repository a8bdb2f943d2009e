"""foxhunt's LightGBM baseline against the one a quant writes by hand, and against foxhunt's old
one, on the same test dates of a study panel (issue #67), without training a TFT.

    python -m benchmarks.bench_lightgbm [--data drift250,planted250] [--seeds 0,1,2] [--model]

`--model` scores the TFT instead: the forecasts of `benchmarks.panel_study`'s `verdict` cell on
the same data set and seed (`python -m benchmarks.panel_study verdict` first), its median on
the same test dates, scored by the same code.

For each data set of `benchmarks.panel_study` and seed, the panel is read as `foxhunt train`
reads it (the default recipe's data module: its splits, windows and target) and three
forecasters are fit on its training windows and scored on its test windows:

- `foxhunt`: `foxhunt.evaluation.gbm`, the baseline every run now fits;
- `old`: the baseline before #67, 50 rounds of quantile models on 10,000 windows (`old_fit`);
- `by hand`: what a quant writes in an afternoon (`quant_features`): log returns over 1, 2, 3,
  5, 10, 20 and 60 bars, volatility and the close over its moving average at 5, 20 and 60,
  the bar's range, close location and gap, volume z-score and dollar volume, the file's own
  observed columns (`signal`) and statics, and each one's rank among the names at its date;
  the label the return of the bar held, z-scored across names per date; L2 boosting at 0.03,
  63 leaves of at least 200 rows, early-stopped on the validation windows (patience 100).
  One model per horizon it is scored at (1, and the book's 2).

Every forecaster is scored on raw log returns of the file's closes (whatever the recipe's
target transform): rank IC by date at horizon 1 and at the book's horizon (mean, ICIR, t with
a Newey-West error), the lag-1 quintile book's net Sharpe at 10 bp (`foxhunt.evaluation.book`,
gross beside it), and for foxhunt's two the pinball loss of their quantiles in the target's
normalized units. Prints a table, appends each row to benchmarks/results/lightgbm_67.jsonl and
prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from foxhunt_serve import by_date
from hydra import compose, initialize_config_dir

from benchmarks.panel_study import DATASETS, commit
from foxhunt.conf import CONF_DIR
from foxhunt.config import register_configs
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.evaluation import stats
from foxhunt.evaluation.baselines import fit_baselines, forecast_all, score
from foxhunt.evaluation.book import Panel, run_book, weights
from foxhunt.evaluation.forecasts import forecast_table, quantile_column
from foxhunt.evaluation.moves import Windows, ewma_volatility, gather
from foxhunt.evaluation.strategy import held_bars
from foxhunt.threads import usable_cpus

RESULTS = Path(__file__).resolve().parent / "results" / "lightgbm_67.jsonl"
COST_BPS, TOP, LAG = 10.0, 0.2, 1
HELD = LAG + 1  # the horizon the lag-1 book holds
QUANT = {  # the hand-written model's settings, as the issue states them
    "objective": "regression",
    "learning_rate": 0.03,
    "num_leaves": 63,
    "min_data_in_leaf": 200,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "seed": 0,
    "verbose": -1,
}


def _rolling_mean(x: np.ndarray, k: int) -> np.ndarray:
    """The mean of x over its last k values (NaN before k of them)."""
    c = np.cumsum(np.r_[0.0, x])
    out = np.full(len(x), np.nan)
    out[k - 1 :] = (c[k:] - c[:-k]) / k
    return out


def _rolling_std(x: np.ndarray, k: int) -> np.ndarray:
    mean = _rolling_mean(x, k)
    return np.sqrt(np.maximum(_rolling_mean(x * x, k) - mean * mean, 0.0))


def quant_features(table: pa.Table, extra: list[str]) -> tuple[dict, list[str]]:
    """{(symbol, time ns): row} of a quant's features per bar, and their names."""
    sym = table["symbol"].to_numpy(zero_copy_only=False)
    t = table["timestamp"].cast(pa.int64()).to_numpy()
    cols = {c: table[c].to_numpy().astype(np.float64) for c in ("open", "high", "low", "close")}
    volume = table["volume"].to_numpy().astype(np.float64)
    other = {c: table[c].to_numpy().astype(np.float64) for c in extra if c in table.column_names}
    out_rows, keys = [], []
    for s in np.unique(sym):
        i = np.flatnonzero(sym == s)
        i = i[np.argsort(t[i], kind="stable")]
        o, h, lo, c, v = (
            cols["open"][i],
            cols["high"][i],
            cols["low"][i],
            cols["close"][i],
            volume[i],
        )
        logc = np.log(c)
        r1 = np.r_[np.nan, np.diff(logc)]
        f = [np.r_[np.full(k, np.nan), logc[k:] - logc[:-k]] for k in (1, 2, 3, 5, 10, 20, 60)]
        for k in (5, 20, 60):
            f += [_rolling_std(np.nan_to_num(r1), k), logc - np.log(_rolling_mean(c, k))]
        span = np.where(h > lo, h - lo, np.nan)
        f += [np.log(h / lo), (c - lo) / span - 0.5, np.r_[np.nan, np.log(o[1:] / c[:-1])]]
        lv = np.log1p(v)
        f += [
            (lv - _rolling_mean(lv, 20)) / np.maximum(_rolling_std(lv, 20), 1e-9),
            np.log1p(c * v),
        ]
        f += [other[k][i] for k in other]
        out_rows.append(np.column_stack(f))
        keys += list(zip([s] * len(i), t[i].tolist(), strict=True))
    names = [f"ret{k}" for k in (1, 2, 3, 5, 10, 20, 60)]
    names += [f"{a}{k}" for k in (5, 20, 60) for a in ("vol", "ma")]
    names += ["range", "clv", "gap", "volz", "dollar_volume", *other]
    rows = np.concatenate(out_rows)
    return {k: j for j, k in enumerate(keys)}, names, rows


def raw_returns(table: pa.Table) -> dict[tuple[str, int], float]:
    """{(symbol, time ns): the bar's log return of the close}."""
    sym = table["symbol"].to_numpy(zero_copy_only=False)
    t = table["timestamp"].cast(pa.int64()).to_numpy()
    c = np.log(table["close"].to_numpy().astype(np.float64))
    out = {}
    for s in np.unique(sym):
        i = np.flatnonzero(sym == s)
        i = i[np.argsort(t[i], kind="stable")]
        out |= dict(
            zip(zip([s] * (len(i) - 1), t[i][1:].tolist(), strict=True), np.diff(c[i]), strict=True)
        )
    return out


def window_keys(ds, schema) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each window's instrument, origin time and target times [n, H]."""
    start = ds.starts
    names = np.array(ds.series.names, dtype=object)[ds.group[start].numpy()]
    origin = ds.time_ns[start + schema.encoder_length - 1].numpy()
    target = ds.time_ns[start[:, None] + ds.dec_offsets].numpy()
    return names, origin, target


def by_hand(dm, table: pa.Table, extra: list[str]) -> tuple[dict[int, np.ndarray], dict]:
    """The hand-written model's test forecasts per horizon (1 and HELD) and its facts."""
    import lightgbm

    started = time.perf_counter()
    index, names, x_all = quant_features(table, extra)
    returns = raw_returns(table)
    parts = {}
    for split in ("train", "val", "test"):
        inst, origin, target = window_keys(dm.datasets[split], dm.schema)
        rows = np.array([index[(n, o)] for n, o in zip(inst, origin, strict=True)])
        at = np.unique(origin, return_inverse=True)[1].ravel()
        x = x_all[rows]
        ranks = [by_date(np.nan_to_num(x[:, j], nan=0.0), at, "rank") for j in range(x.shape[1])]
        labels = {
            h: np.array(
                [returns.get((n, t), np.nan) for n, t in zip(inst, target[:, h - 1], strict=True)]
            )
            for h in (1, HELD)
        }
        parts[split] = (np.column_stack([x, *ranks]).astype(np.float32), at, labels)
    forecasts, rounds = {}, {}
    for h in (1, HELD):

        def data(split: str, h: int = h):
            x, at, labels = parts[split]
            y = labels[h]
            ok = np.isfinite(y)
            z = np.zeros_like(y)
            z[ok] = by_date(y[ok], at[ok], "zscore")
            return x[ok], z[ok]

        train = lightgbm.Dataset(*data("train"))
        val = lightgbm.Dataset(*data("val"), reference=train)
        booster = lightgbm.train(
            QUANT | {"num_threads": usable_cpus()},
            train,
            2_000,
            valid_sets=[val],
            callbacks=[lightgbm.early_stopping(100, verbose=False)],
        )
        rounds[h] = booster.best_iteration
        forecasts[h] = booster.predict(parts["test"][0], num_iteration=booster.best_iteration)
    facts = {
        "inputs": 2 * len(names),
        "rounds": rounds,
        "fit_s": round(time.perf_counter() - started, 1),
    }
    return forecasts, facts


def old_fit(train, quantiles: np.ndarray, target_kind: str):
    """foxhunt's LightGBM before #67: quantile models, 50 rounds on 10,000 windows."""
    import lightgbm

    groups = len(train.static_real)
    rng = np.random.default_rng(0)
    n = len(train)
    step = n / 10_000
    pick = (
        np.arange(n)
        if n <= 10_000
        else np.minimum(rng.uniform(0, step) + step * np.arange(10_000), n - 1).astype(np.int64)
    )

    def rows(w: Windows) -> np.ndarray:
        n, steps = w.target.shape
        inputs = np.column_stack(
            [
                w.last_step,
                w.history[:, -8:],
                ewma_volatility(w.history),
                w.static,
                np.eye(groups)[w.group],
            ]
        )
        return np.column_stack(
            [
                np.repeat(inputs, steps, axis=0),
                w.known.reshape(n * steps, -1),
                np.tile(np.arange(steps), n),
            ]
        )

    fit_on = gather(train, pick, target_kind)
    params = {
        "objective": "quantile",
        "learning_rate": 0.1,
        "num_leaves": 15,
        "min_data_in_leaf": 100,
        "seed": 0,
        "verbose": -1,
    }
    data = lightgbm.Dataset(rows(fit_on), fit_on.move.ravel(), free_raw_data=False)
    models = [
        lightgbm.train(params | {"alpha": float(a)}, data, num_boost_round=50) for a in quantiles
    ]

    def predict(w: Windows) -> np.ndarray:
        pred = np.stack([m.predict(rows(w)) for m in models], axis=-1)
        return np.sort(pred.reshape(*w.target.shape, len(quantiles)), axis=-1)

    return predict


def scored(dm, names, origin, target, forecast: dict[int, np.ndarray], returns: dict) -> dict:
    """Rank IC by date at horizon 1 and HELD, and the lag-1 book, on raw returns."""
    out = {}
    utc = pa.timestamp("ns", tz="UTC")
    for h, f in forecast.items():
        realised = np.array(
            [returns.get((n, t), np.nan) for n, t in zip(names, target[:, h - 1], strict=True)]
        )
        ok = np.isfinite(realised) & np.isfinite(f)
        s = stats.ic(f[ok], realised[ok], origin[ok], lags=h, rank=True)
        out[f"h{h}"] = {"rank_ic": s["mean"], "icir": s.get("icir"), "t": s["t"], "dates": s["n"]}
        if h == HELD:
            table = pa.table(
                {
                    "instrument": pa.array(names[ok].astype(str)),
                    "origin_time": pa.array(origin[ok], utc),
                    "horizon": pa.array(np.full(ok.sum(), HELD, np.int32)),
                    "target_time": pa.array(target[ok, h - 1], utc),
                    quantile_column(0.5): f[ok],
                    "actual": realised[ok],
                    "naive": np.zeros(ok.sum()),
                }
            )
            panel = Panel.of(held_bars(table, "return", LAG))
            result = run_book(panel, weights(panel, TOP, "equal", 10), COST_BPS)
            out["book"] = {"net_sharpe": result["sharpe"], "gross_sharpe": result["gross_sharpe"]}
    return out


def run(data: str, seed: int, work: Path) -> list[dict]:
    overrides = DATASETS[data](work, seed)
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", [*overrides, f"seed={seed}", f"data.cache_dir={work / 'cache'}"])
    dm = ParquetDataModule(cfg.data)
    dm.setup()
    path = Path(str(cfg.data.path))
    table = pq.read_table(path)
    extra = list(cfg.data.extra_features) + list(cfg.data.static_features)
    q = np.asarray(cfg.model.quantiles, dtype=np.float64)
    kind = dm.schema.target_kind
    test = dm.datasets["test"]
    names, origin, target = window_keys(test, dm.schema)
    returns = raw_returns(table)
    median = int(np.argmin(np.abs(q - 0.5)))
    rows = []
    common = {"data": data, "seed": seed, "target_transform": dm.schema.target_transform}

    def forecaster(label: str, predict, fit_s: float, facts: dict) -> None:
        pred = forecast_all(predict, test, kind)
        found, _ = score({label: predict}, test, kind, list(q), list(test.series.names))
        # the median in the target's units (each name's scale), as the book ranks it
        table_ = forecast_table(test, dm.schema, pred, list(q))
        med = table_[quantile_column(q[median])].to_numpy().reshape(len(test), -1)
        row = common | {
            "forecaster": label,
            "fit_s": round(fit_s, 1),
            "pinball": found[label][None]["loss"],
        }
        row |= scored(dm, names, origin, target, {1: med[:, 0], HELD: med[:, HELD - 1]}, returns)
        rows.append(row | {"facts": facts})

    began = time.perf_counter()
    predictors, facts = fit_baselines(dm.datasets["train"], kind, list(q), seed, dm.datasets["val"])
    forecaster("foxhunt", predictors["lightgbm"], facts["lightgbm"]["fit_s"], facts["lightgbm"])
    began = time.perf_counter()
    old = old_fit(dm.datasets["train"], q, kind)
    forecaster("old", old, time.perf_counter() - began, {})
    forecasts, facts = by_hand(dm, table, extra)
    row = common | {"forecaster": "by hand", "fit_s": facts["fit_s"], "pinball": None}
    rows.append(row | scored(dm, names, origin, target, forecasts, returns) | {"facts": facts})
    return rows


def model_rows(data: str, seed: int, work: Path) -> list[dict]:
    """The TFT's rows (`--model`): the median forecasts in test_forecasts.parquet of the last
    `verdict` study cell of `benchmarks.panel_study` on this data set and seed (its run
    directory still there), scored here as the LightGBMs are, on the same dates."""
    found = [
        r
        for r in map(json.loads, (RESULTS.parent / "panel_study.jsonl").open())
        if r["study"] == "verdict" and r["data"] == data and r["seed"] == seed
    ]
    if not found or not (Path(found[-1]["run_dir"]) / "test_forecasts.parquet").exists():
        return []
    cell = found[-1]
    forecasts = pq.read_table(Path(cell["run_dir"]) / "test_forecasts.parquet")
    DATASETS[data](work, seed)
    returns = raw_returns(pq.read_table(next(work.glob("*.parquet"))))
    order = [("instrument", "ascending"), ("origin_time", "ascending")]
    by_h = {
        h: forecasts.filter(pc.equal(forecasts["horizon"], h)).sort_by(order) for h in (1, HELD)
    }
    names = np.array(by_h[1]["instrument"].to_pylist(), dtype=object)
    origin = by_h[1]["origin_time"].cast(pa.int64()).to_numpy()
    assert (by_h[HELD]["origin_time"].cast(pa.int64()).to_numpy() == origin).all()
    # [n, 2]: the targets of horizons 1 and HELD (2), as `scored` indexes them
    target = np.column_stack(
        [by_h[h]["target_time"].cast(pa.int64()).to_numpy() for h in (1, HELD)]
    )
    forecast = {h: by_h[h][quantile_column(0.5)].to_numpy() for h in (1, HELD)}
    row = {"data": data, "seed": seed, "target_transform": cell["target_transform"]}
    row |= {"forecaster": "TFT", "fit_s": cell["wall_s"], "pinball": cell["raw_test_loss"]}
    facts = {"commit": cell["commit"], "run_dir": cell["run_dir"], "epochs": cell["epochs"]}
    return [row | scored(None, names, origin, target, forecast, returns) | {"facts": facts}]


ORDER = ("TFT", "foxhunt", "by hand", "old")  # the table's rows, per data set


def table() -> str:
    """docs/panels.md's table (`--table`): per data set and forecaster, over the seeds of each
    one's last rows, the mean (min..max) rank IC by date at h1 and at the book's horizon with
    the mean ICIR and t, the book's net Sharpe, the pinball loss and the TFT's skill against
    it, and the fit."""
    last = {}
    for r in map(json.loads, RESULTS.open()):
        last[(r["data"], r["seed"], r["forecaster"])] = r
    lines = [
        "| data | forecaster | seeds | h1 rank IC by date (ICIR, t) | h2 rank IC (ICIR, t) | "
        "book net Sharpe at 10 bp | pinball | the TFT's skill against it | fit s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def spread(values: list[float], digits: int) -> str:
        return f"{np.mean(values):.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"

    for data in sorted({k[0] for k in last}, reverse=True):
        for who in ORDER:
            rows = [r for (d, _, f), r in sorted(last.items()) if d == data and f == who]
            if not rows:
                continue
            ic = {
                h: f"{spread([r[h]['rank_ic'] for r in rows], 3)} "
                f"({np.mean([r[h]['icir'] for r in rows]):.2f}, "
                f"{np.mean([r[h]['t'] for r in rows]):.1f})"
                for h in ("h1", f"h{HELD}")
            }
            pin, skill = "n/a", "n/a"
            if rows[0]["pinball"] is not None:
                pin = spread([r["pinball"] for r in rows], 4)
                tft = [last.get((data, r["seed"], "TFT")) for r in rows]
                if who != "TFT" and all(tft):
                    gain = [
                        100 * (1 - t["pinball"] / r["pinball"])
                        for t, r in zip(tft, rows, strict=True)
                    ]
                    skill = f"{np.mean(gain):+.2f}% ({min(gain):+.2f}%..{max(gain):+.2f}%)"
            book = spread([r["book"]["net_sharpe"] for r in rows], 1)
            fit = f"{np.mean([r['fit_s'] for r in rows]):.0f}"
            cells = [data, who, len(rows), ic["h1"], ic[f"h{HELD}"], book, pin, skill, fit]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="drift250,planted250")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--model", action="store_true", help="score the verdict study's TFT alone")
    ap.add_argument(
        "--table", action="store_true", help="print docs/panels.md's table, run nothing"
    )
    a = ap.parse_args()
    if a.table:
        print(table())
        return
    load = os.getloadavg()[0]
    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpus": usable_cpus(),
        "load_before": round(load, 2),
        "commit": commit(),
    }
    print(
        f"{'data':<11} {'seed':>4} {'forecaster':<8} {'h1 rank IC (ICIR, t)':<24} "
        f"{'h2 rank IC':<10} {'book net (gross)':<18} {'pinball':>8} {'fit s':>6}"
    )
    rows = []
    for data in a.data.split(","):
        for seed in (int(s) for s in a.seeds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                cell = (model_rows if a.model else run)(data, seed, Path(tmp))
                for r in cell:
                    r |= meta
                    rows.append(r)
                    RESULTS.parent.mkdir(parents=True, exist_ok=True)
                    with RESULTS.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                    h1, h2, b = r["h1"], r[f"h{HELD}"], r["book"]
                    pin = "" if r["pinball"] is None else f"{r['pinball']:.4f}"
                    print(
                        f"{data:<11} {seed:>4} {r['forecaster']:<8} "
                        f"{h1['rank_ic']:.3f} ({h1['icir']:.2f}, {h1['t']:.1f}){'':<6} "
                        f"{h2['rank_ic']:<10.3f} {b['net_sharpe']:.2f} ({b['gross_sharpe']:.2f})"
                        f"{'':<7} {pin:>8} {r['fit_s']:>6}",
                        flush=True,
                    )
    print(json.dumps({"bench": "lightgbm_67", "rows": rows}, default=str))


if __name__ == "__main__":
    sys.exit(main())
