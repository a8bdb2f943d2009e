"""Futures on the data users really have: every listed month at once, a file that ends today.

    python benchmarks/bench_futures_cuts.py [--out DIR] [--quick] [override ...]
    python benchmarks/bench_futures_cuts.py --lazy-dir [--out DIR] [--lazy-roots 4]
        [--lazy-contracts 40] [--lazy-days 200] [--lazy-session-hours 8]

Cuts (the default): real S&P 500 daily bars (the `arch` package's data files, read as CSV; arch
itself is not imported: pip install --no-deps arch), 2014-2018, delivered as a vendor does:
quarterly contracts SPH14 .. SPM19 (root SP, month code, 2-digit year) in one file, each listed
200 days before its expiry (the third Friday of its month), so 2-3 months trade at once; a
contract's prices are the index's x exp(carry x years to expiry), carry 3%/yr; its volume, a
share of the index's, is the front's, the deferred months thin, moving from the front to the
next over a few days around 8 days before the front's expiry. The full file's roll schedule
(data.futures.roll.rule=volume, confirm_bars=3) picks one roll (--roll, default the one before
the last); the file is cut at 17 points (16 days: two fall on one) across that quarter:
mid-quarter, the bars before the next month's lead, with 1, 2 and 3 of the 3 leading bars seen,
the roll bar, after it, the old front's expiry, into the next quarter. Each cut:
scripts/train.py (a short training: max_epochs=1, 5 training and 2 validation batches; --quick:
2 cuts, 2 and 1 batches, a small model), then scripts/predict.py on the cut (each instrument's
latest window). One row per cut: the contracts trading on its last day, the contract held there,
the bars the next month has led the held one, the rolls its run found (rolls.csv) and whether
they are the full file's up to the cut, train and predict ok, their wall times. Extra arguments
go to train.py as Hydra overrides. Prints a table, then one JSON line.

--lazy-dir: a synthetic listing as a directory of one Parquet file per contract (--lazy-roots
roots x --lazy-contracts quarterly contracts of 5-minute bars, --lazy-session-hours a weekday,
each listed --lazy-days before its expiry: 4 x 40 x 200 days x 8 hours is 2.2M rows), and
ParquetDataModule(...).setup() on it in a fresh process each: eager (data.lazy=false), lazy
(true, a new window store) and lazy again (the store reused): file rows, windows, rolls, setup
time, the process's memory before setup and at its peak (VmHWM). Prints a table, then one JSON
line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from foxhunt_serve import MONTH_CODES, Roll, third_friday
from omegaconf import OmegaConf

from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.futures import continuous_table
from foxhunt.data.section import DataSection

ROOT = Path(__file__).resolve().parents[1]
DAY_NS = 86_400 * 10**9
YEAR_NS = 365.25 * DAY_NS
PRICES = ("open", "high", "low", "close")
CONFIRM_BARS = 3  # data.futures.roll.confirm_bars' default
TRAIN = [
    "data=parquet",
    "data.group_column=symbol",
    "data.time_column=timestamp",
    "data.futures.enabled=true",
    "data.features=ohlcv",
    "data.generate_if_missing=false",
    "report=false",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]
FULL = ["trainer.limit_train_batches=5", "trainer.limit_val_batches=2"]
FULL += ["trainer.limit_test_batches=2"]
QUICK = ["trainer.limit_train_batches=2", "trainer.limit_val_batches=1"]
QUICK += ["trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0"]
QUICK += ["model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4"]
QUICK_CUTS = ("2 of 3 led", "roll bar")


# --- the vendor's file ------------------------------------------------------------------------


def read_sp500(start: str, end: str) -> dict[str, np.ndarray]:
    """The S&P 500's daily bars from `start` to `end` (inclusive): time_ns, OHLC, volume."""
    spec = importlib.util.find_spec("arch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "bench_futures_cuts: needs the arch package's data files: pip install --no-deps arch"
        )
    t = pacsv.read_csv(Path(spec.submodule_search_locations[0]) / "data/sp500/sp500.csv.gz")
    days = [datetime.strptime(d, "%m/%d/%Y").replace(tzinfo=UTC) for d in t["Date"].to_pylist()]
    time_ns = pa.array(days, pa.timestamp("ns", tz="UTC")).cast(pa.int64()).to_numpy()
    keep = (time_ns >= _ns(start)) & (time_ns <= _ns(end))
    bars = {p: t[p.capitalize()].to_numpy().astype(float)[keep] for p in (*PRICES, "volume")}
    return {"time_ns": time_ns[keep], **bars}


def quarterly_table(
    bars: dict[str, np.ndarray],
    root: str = "SP",
    listed_days: int = 200,
    carry: float = 0.03,
    seed: int = 0,
) -> pa.Table:
    """One row per contract and bar, as a vendor delivers it (module docstring): timestamp,
    symbol (the contract id), open, high, low, close, volume."""
    rng = np.random.default_rng(seed)
    t = bars["time_ns"]
    first, last = _year(t[0]), _year(t[-1])
    months = [(y, m) for y in range(first - 1, last + 2) for m in (3, 6, 9, 12)]
    expiries = [third_friday(y, m) for y, m in months]
    parts = []
    for (year, month), before, expiry in zip(months[1:], expiries, expiries[1:], strict=False):
        rows = (t >= expiry - listed_days * DAY_NS) & (t <= expiry)
        if not rows.any():
            continue
        tk = t[rows]
        premium = np.exp(carry * (expiry - tk) / YEAR_NS)
        share = volume_share(tk, before, expiry)
        noise = rng.lognormal(0.0, 0.1, len(tk))
        parts.append(
            {
                "timestamp": tk,
                "symbol": np.full(len(tk), f"{root}{MONTH_CODES[month - 1]}{year % 100:02d}"),
                **{p: bars[p][rows] * premium for p in PRICES},
                "volume": np.round(bars["volume"][rows] * 1e-4 * share * noise),
            }
        )
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return pa.table(
        {
            **cols,
            "timestamp": pa.array(cols["timestamp"], pa.timestamp("ns", tz="UTC")),
            "symbol": pa.array(cols["symbol"], pa.string()),
        }
    )


def volume_share(time_ns: np.ndarray, before: int, expiry: int, days: float = 8) -> np.ndarray:
    """A contract's share of its root's volume: thin (2%) while deferred, rising to the front's
    over a few days around `days` before the previous contract's expiry (`before`), falling
    from `days` before its own."""
    rising = 1 / (1 + np.exp(-(time_ns - (before - days * DAY_NS)) / (1.5 * DAY_NS)))
    falling = 1 / (1 + np.exp(-((expiry - days * DAY_NS) - time_ns) / (1.5 * DAY_NS)))
    return 0.02 + 0.98 * rising * falling


# --- the schedule and the cuts ------------------------------------------------------------------


def data_cfg(path: Path, **changes):
    """The data config train.py composes from TRAIN, for foxhunt's own functions."""
    cfg = OmegaConf.structured(
        DataConfig(path=str(path), group_column="symbol", features="ohlcv", **changes)
    )
    cfg.futures.enabled = True
    return cfg


def schedule(table: pa.Table) -> list:
    """The roll schedule of a table (foxhunt.data.futures.continuous_table's)."""
    return continuous_table(table, DataSection.of(data_cfg(Path("unused.parquet"))))[1]


def cut_points(table: pa.Table, rolls: list, index: int) -> list[tuple[str, int]]:
    """(label, last day) of each cut across the quarter of `rolls[index]`: mid-quarter, the
    days before the next month's lead, with 1, 2 and 3 of its CONFIRM_BARS leading days seen,
    the roll bar, after it, the old front's expiry, into the next quarter."""
    index %= len(rolls)
    roll = rolls[index]
    days = np.unique(table["timestamp"].cast(pa.int64()).to_numpy())
    at = int(np.searchsorted(days, roll.time_ns))  # the first day the new contract is held
    front_last = int(_bars(table, roll.from_id)[0][-1])
    expired = int(np.searchsorted(days, front_last))
    quarter_start = rolls[index - 1].time_ns if index > 0 else days[0]
    next_roll = rolls[index + 1].time_ns if index + 1 < len(rolls) else days[-1]
    cuts = {
        "quarter start +5": int(np.searchsorted(days, quarter_start)) + 5,
        "roll -45 d": int(np.searchsorted(days, roll.time_ns - 45 * DAY_NS)),
        "roll -30 d": int(np.searchsorted(days, roll.time_ns - 30 * DAY_NS)),
        "roll -15 d": int(np.searchsorted(days, roll.time_ns - 15 * DAY_NS)),
        "2 before the lead": at - CONFIRM_BARS - 2,
        "1 before the lead": at - CONFIRM_BARS - 1,
        **{f"{k} of {CONFIRM_BARS} led": at - CONFIRM_BARS - 1 + k for k in (1, 2)},
        f"{CONFIRM_BARS} of {CONFIRM_BARS} led": at - 1,  # confirmed: held from the next bar
        "roll bar": at,
        "roll +1": at + 1,
        "roll +3": at + 3,
        "front expiry -1": expired - 1,
        "front expiry": expired,
        "front expiry +1": expired + 1,
        "front expiry +15 d": int(np.searchsorted(days, front_last + 15 * DAY_NS)),
        "next roll -5": int(np.searchsorted(days, next_roll)) - 5,
    }
    out: dict[int, list[str]] = {}  # labels falling on one day are one cut
    for label, i in sorted(cuts.items(), key=lambda kv: kv[1]):
        out.setdefault(int(days[min(max(i, 0), len(days) - 1)]), []).append(label)
    return [(" / ".join(labels), day) for day, labels in out.items()]


def held_and_lead(table: pa.Table, rolls: list) -> tuple[str, int]:
    """The contract held at a table's end and for how many days up to it the next listed
    contract's volume has exceeded it (the run the volume rule counts)."""
    ids = sorted(set(table["symbol"].to_pylist()), key=_expiry_order)
    held = rolls[-1].to_id if rolls else ids[0]
    later = ids[ids.index(held) + 1 :]
    if not later:
        return held, 0
    ht, hv = _bars(table, held)
    nt, nv = _bars(table, later[0])
    common, hi, ni = np.intersect1d(ht, nt, return_indices=True)
    ahead = nv[ni] > hv[hi]
    if not len(ahead) or common[-1] != ht[-1]:
        return held, 0
    behind = np.flatnonzero(~ahead)
    return held, int(len(ahead) - (behind[-1] + 1 if len(behind) else 0))


def same_prefix(found: list[tuple], full: list, end_ns: int) -> bool:
    """Whether a cut's rolls are the full file's up to its end (time, from, to, factor)."""
    want = [r for r in full if r.time_ns <= end_ns]
    return len(found) == len(want) and all(
        (t, a, b) == (r.time_ns, r.from_id, r.to_id) and np.isclose(f, r.factor, rtol=1e-9)
        for (t, a, b, f), r in zip(found, want, strict=True)
    )


def read_rolls(path: Path) -> list[tuple]:
    """A run's rolls.csv as (time ns, from, to, factor); none without the file."""
    if not path.exists():
        return []
    t = pacsv.read_csv(path)
    times = pc.cast(t["time"], pa.timestamp("ns", tz="UTC")).cast(pa.int64()).to_pylist()
    return list(
        zip(times, t["from"].to_pylist(), t["to"].to_pylist(), t["factor"].to_pylist(), strict=True)
    )


def run(script: str, out: Path, overrides: list[str]) -> tuple[bool, float, str]:
    """(ok, wall seconds, the last lines of stderr) of one of scripts/."""
    started = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "scripts" / script), *overrides, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    said = (done.stdout + done.stderr).strip().splitlines()
    tail = "\n".join(line for line in said if line.startswith("error:")) or "\n".join(said[-3:])
    return done.returncode == 0, time.perf_counter() - started, tail


def run_cut(table: pa.Table, full: list, label: str, day: int, out: Path, train: list) -> dict:
    """One cut: the file up to `day`, trained on and forecast from; its row of the table."""
    out.mkdir(parents=True, exist_ok=True)
    part = table.filter(pc.less_equal(table["timestamp"].cast(pa.int64()), day))
    path = out / "cut.parquet"
    pq.write_table(part, path)
    last_day = pc.equal(part["timestamp"].cast(pa.int64()), day)
    listed = sorted(set(part.filter(last_day)["symbol"].to_pylist()), key=_expiry_order)
    trained, train_s, train_err = run("train.py", out / "train", [*train, f"data.path={path}"])
    rolls = read_rolls(out / "train" / "rolls.csv")
    if not trained:  # the schedule the run would have found
        rolls = [(r.time_ns, r.from_id, r.to_id, r.factor) for r in schedule(part)]
    held, lead = held_and_lead(part, [Roll(*r) for r in rolls])
    predicted, predict_s, predict_err = False, 0.0, "no checkpoint"
    ckpt = out / "train" / "checkpoints" / "last.ckpt"
    if ckpt.exists():
        forecasts = out / "predictions.parquet"
        args = [f"ckpt_path={ckpt}", f"data.path={path}", f"predict.out={forecasts}"]
        predicted, predict_s, predict_err = run("predict.py", out / "predict", args)
        predicted = predicted and _forecasts_from(forecasts, part, held)
    return {
        "cut": str(np.datetime64(day, "ns").astype("datetime64[D]")),
        "label": label,
        "listed": listed,
        "held": held,
        "lead": lead,
        "rolls": len(rolls),
        "last_roll": f"{rolls[-1][1]}->{rolls[-1][2]} {_day(rolls[-1][0])}" if rolls else None,
        "prefix": same_prefix(rolls, full, day),
        "train_ok": trained,
        "predict_ok": predicted,
        "train_s": round(train_s, 1),
        "predict_s": round(predict_s, 1),
        **({} if trained else {"train_error": train_err}),
        **({} if predicted or not trained else {"predict_error": predict_err}),
    }


def bench_cuts(args: argparse.Namespace) -> None:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    table = quarterly_table(read_sp500(args.start, args.end))
    pq.write_table(table, out / "sp_quarterly.parquet")
    full = schedule(table)
    roll = full[args.roll]
    cuts = cut_points(table, full, args.roll)
    if args.quick:
        cuts = [c for c in cuts if set(c[0].split(" / ")) & set(QUICK_CUTS)]
    train = [*TRAIN, *(QUICK if args.quick else FULL), *args.overrides]
    rows = []
    for k, (label, day) in enumerate(cuts):
        rows.append(run_cut(table, full, label, day, out / f"cut-{k:02d}", train))
        print(_line(rows[-1]), file=sys.stderr, flush=True)  # progress: a run takes a while
    head = ["cut", "label", "listed", "held", "lead", "rolls", "last_roll", "prefix"]
    head += ["train_ok", "predict_ok", "train_s", "predict_s"]
    print(" | ".join(head))
    for r in rows:
        print(_line(r))
    contracts = len(set(table["symbol"].to_pylist()))
    print(
        f"({table.num_rows} rows, {contracts} contracts, {len(full)} rolls in the full file; "
        f"cuts across {roll.from_id}->{roll.to_id} at {_day(roll.time_ns)}; "
        f"load average {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s)"
    )
    print(
        json.dumps(
            {
                "bench": "futures_cuts",
                "rows": table.num_rows,
                "contracts": contracts,
                "full_rolls": len(full),
                "roll": f"{roll.from_id}->{roll.to_id} {_day(roll.time_ns)}",
                "quick": args.quick,
                "overrides": args.overrides,
                "all_prefix": all(r["prefix"] for r in rows),
                "train_ok": sum(r["train_ok"] for r in rows),
                "predict_ok": sum(r["predict_ok"] for r in rows),
                "load_average": round(os.getloadavg()[0], 2),
                "wall_s": round(time.perf_counter() - started, 1),
                "cuts": rows,
            }
        )
    )


# --- the lazy path on one file per contract -----------------------------------------------------


def write_contract_dir(
    folder: Path,
    roots: int,
    contracts: int,
    listed_days: int,
    session_hours: float,
    bar_minutes: int = 5,
    seed: int = 0,
) -> int:
    """`roots` x `contracts` quarterly contracts of `bar_minutes` bars (`session_hours` from
    13:30 UTC each weekday), one Parquet file each, listed `listed_days` before expiry; rows."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    months = [(y, m) for y in range(2000, 2100) for m in (3, 6, 9, 12)][: contracts + 1]
    expiries = [third_friday(y, m) for y, m in months]
    days = np.arange(expiries[1] - listed_days * DAY_NS, expiries[-1] + 1, DAY_NS)
    days = days[(days // DAY_NS + 3) % 7 < 5]  # weekdays
    bars = np.arange(0, session_hours * 60, bar_minutes) * 60 * 10**9
    t = (days[:, None] + (13 * 60 + 30) * 60 * 10**9 + bars[None, :].astype(np.int64)).ravel()
    rows = 0
    for r in range(roots):
        root = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[r] * 2
        path = 3000 * np.exp(np.cumsum(rng.normal(0, 7e-4, len(t))))
        base = rng.lognormal(6, 0.5, len(t))
        for (year, month), before, expiry in zip(
            months[1:], expiries[:-1], expiries[1:], strict=True
        ):
            k = (t >= expiry - listed_days * DAY_NS) & (t <= expiry + DAY_NS)
            tk = t[k]
            close = path[k] * np.exp(0.03 * (expiry - tk) / YEAR_NS)
            opens = np.concatenate([[close[0]], close[:-1]])
            wick = np.exp(np.abs(rng.normal(0, 3e-4, (2, len(tk)))))
            volume = np.round(base[k] * volume_share(tk, before, expiry))
            contract = pa.table(
                {
                    "timestamp": pa.array(tk, pa.timestamp("ns", tz="UTC")),
                    "symbol": pa.array(
                        [f"{root}{MONTH_CODES[month - 1]}{year % 100:02d}"] * len(tk)
                    ),
                    "open": opens,
                    "high": np.maximum(opens, close) * wick[0],
                    "low": np.minimum(opens, close) / wick[1],
                    "close": close,
                    "volume": volume,
                }
            )
            name = contract["symbol"][0].as_py()
            pq.write_table(contract, folder / f"{name}.parquet")
            rows += len(tk)
    return rows


def measure_setup(path: Path, lazy: bool, cache: Path) -> dict:
    """ParquetDataModule(...).setup() in this process: windows, rolls, seconds, memory."""
    base = _memory_mib("VmRSS")
    started = time.perf_counter()
    data = ParquetDataModule(data_cfg(path, lazy=lazy, cache_dir=str(cache)))
    data.setup()
    return {
        "setup_s": round(time.perf_counter() - started, 2),
        "windows": sum(len(d) for d in data.datasets.values()),
        "rolls": len(data.rolls),
        "base_mib": base,
        "peak_mib": _memory_mib("VmHWM"),
    }


def bench_lazy(args: argparse.Namespace) -> None:
    out = args.out.resolve()
    folder, cache = out / "contracts", out / "cache"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    rows = write_contract_dir(
        folder, args.lazy_roots, args.lazy_contracts, args.lazy_days, args.lazy_session_hours
    )
    write_s = time.perf_counter() - started
    results = []
    for mode, lazy in (("eager", False), ("lazy", True), ("lazy, store reused", True)):
        cmd = [sys.executable, __file__, "--measure-setup", str(folder), str(cache), str(lazy)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            results.append({"mode": mode, "error": done.stderr.strip().splitlines()[-1]})
            continue
        results.append({"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])})
    head = ["mode", "setup_s", "windows", "rolls", "base_mib", "peak_mib"]
    print(" | ".join(head))
    for r in results:
        print(" | ".join(str(r.get(k, r.get("error", ""))) for k in head))
    files = args.lazy_roots * args.lazy_contracts
    print(
        f"({rows} rows in {files} files, written in {write_s:.0f} s; "
        f"load average {os.getloadavg()[0]:.2f})"
    )
    print(
        json.dumps(
            {
                "bench": "futures_lazy",
                "rows": rows,
                "files": files,
                "roots": args.lazy_roots,
                "contracts": args.lazy_contracts,
                "listed_days": args.lazy_days,
                "session_hours": args.lazy_session_hours,
                "load_average": round(os.getloadavg()[0], 2),
                "results": results,
            }
        )
    )


# --- small helpers ------------------------------------------------------------------------------


def _ns(day: str) -> int:
    return int(np.datetime64(day, "ns").astype(np.int64))


def _day(time_ns: int) -> str:
    return str(np.datetime64(int(time_ns), "ns").astype("datetime64[D]"))


def _year(time_ns: int) -> int:
    return int(np.datetime64(int(time_ns), "ns").astype("datetime64[Y]").astype(int)) + 1970


def _expiry_order(contract_id: str) -> tuple[int, int]:
    """(year, month) of an id ROOT + month code + 2-digit year."""
    return 2000 + int(contract_id[-2:]), MONTH_CODES.index(contract_id[-3])


def _bars(table: pa.Table, contract_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(time ns, volume) of one contract, in time order."""
    rows = table.filter(pc.equal(table["symbol"], contract_id))
    t = rows["timestamp"].cast(pa.int64()).to_numpy()
    order = np.argsort(t, kind="stable")
    return t[order], rows["volume"].to_numpy()[order]


def _forecasts_from(path: Path, part: pa.Table, held: str) -> bool:
    """Whether predict forecast the root from the last bar of the contract held at the cut."""
    if not path.exists():
        return False
    got = pq.read_table(path)
    origins = set(got["origin_time"].cast(pa.int64()).to_pylist())
    return got.num_rows > 0 and origins == {int(_bars(part, held)[0][-1])}


def _memory_mib(field: str) -> float:
    """This process's VmRSS or VmHWM (its peak) in MiB; ru_maxrss where /proc has none."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _line(r: dict) -> str:
    cells = [" ".join(v) if isinstance(v, list) else str(v) for v in list(r.values())[:12]]
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_futures_cuts")
    parser.add_argument("--quick", action="store_true", help="2 cuts, the shortest training")
    parser.add_argument("--start", default="2014-01-01")
    parser.add_argument("--end", default="2018-12-31")
    parser.add_argument("--roll", type=int, default=-2, help="the full schedule's roll to cut at")
    parser.add_argument("--lazy-dir", action="store_true", help="the lazy bench instead")
    parser.add_argument("--lazy-roots", type=int, default=4)
    parser.add_argument("--lazy-contracts", type=int, default=40)
    parser.add_argument("--lazy-days", type=int, default=200)
    parser.add_argument("--lazy-session-hours", type=float, default=8.0)
    parser.add_argument("--measure-setup", nargs=3, metavar=("DIR", "CACHE", "LAZY"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.measure_setup:  # the child process of --lazy-dir
        path, cache, lazy = args.measure_setup
        print(json.dumps(measure_setup(Path(path), lazy == "True", Path(cache))))
    elif args.lazy_dir:
        bench_lazy(args)
    else:
        bench_cuts(args)


if __name__ == "__main__":
    main()
