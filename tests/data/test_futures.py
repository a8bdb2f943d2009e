"""Futures: contract ids, roll schedules at the configured signal, and continuous series whose
returns (ratio) or price differences (difference) are each contract's own across every roll."""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from foxhunt_serve import MONTH_CODES, Contract, Roll, parse_contract, third_friday

import foxhunt
from foxhunt.app.predict.interpret import _roll_marks
from foxhunt.app.report.markdown import rolls_section as _rolls_section
from foxhunt.app.train.phases import train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.futures import continuous_table, roll_schedule, stitch
from foxhunt.data.section import DataSection
from foxhunt.errors import ConfigError, DataError
from tests.helpers import (
    DAY,
    PRICES,
    YEAR,
    compose_train,
    contracts_table,
    futures_cfg,
    listing,
    ns,
    run_script,
)

T0 = int(np.datetime64("2026-01-02", "ns").astype(np.int64))


def contracts(
    adjust: str, contango: float = 0.01, seed: int = 0
) -> tuple[list[Contract], np.ndarray]:
    """Three quarterly contracts of one daily price path: contract k trades at path x
    (1 + contango)^k (ratio) or path + 10 k (difference), each over its own 120 days,
    overlapping the next by 40; volume moves from one to the next over the overlap."""
    rng = np.random.default_rng(seed)
    days = 120 + 2 * 80
    path = 5000 * np.exp(np.cumsum(rng.normal(0, 0.01, days)))
    out = []
    for k, code in enumerate("HMU"):
        span = np.arange(80 * k, 80 * k + 120)
        level = path[span] * (1 + contango) ** k if adjust == "ratio" else path[span] + 10 * k
        # the front's volume falls and the next's rises across days 80-120 of each contract
        rising = np.clip((span - 80 * k) / 40, 0, 1)
        falling = np.clip((80 * k + 120 - span) / 40, 0, 1)
        volume = 1000 * np.minimum(rising if k else 1, falling if k < 2 else 1) + 1
        out.append(
            Contract(
                id=f"ES{code}6",
                root="ES",
                month="FGHJKMNQUVXZ".index(code) + 1,
                year=2026,
                time_ns=T0 + DAY * span,
                prices={p: level.copy() for p in ("open", "high", "low", "close")},
                volume=volume,
            )
        )
    return out, path


@pytest.mark.parametrize(
    ("contract", "first", "expected"),
    [
        ("ESH6", "2025-12-01", ("ES", 3, 2026)),
        ("ESZ9", "2029-06-01", ("ES", 12, 2029)),
        ("ESH0", "2029-12-15", ("ES", 3, 2030)),  # a contract trades before its expiry year
        ("CLZ25", "2025-01-01", ("CL", 12, 2025)),
        ("6EM2026", "2026-01-01", ("6E", 6, 2026)),
    ],
)
def test_contract_ids_parse_into_root_month_and_year(contract, first, expected):
    assert parse_contract(contract, ns(first)) == expected


def test_an_unparseable_contract_is_one_line_naming_it():
    with pytest.raises(DataError, match="contract 'SPX' does not parse as root \\+ month code"):
        parse_contract("SPX", T0)


def test_expiry_by_the_month_code_calendar_is_the_third_friday():
    assert third_friday(2026, 3) == ns("2026-03-20")
    assert third_friday(2026, 6) == ns("2026-06-19")
    assert third_friday(2025, 12) == ns("2025-12-19")


@pytest.mark.parametrize("confirm", [1, 3])
def test_the_volume_roll_is_at_the_confirmed_crossover(confirm):
    cs, _ = contracts("ratio")
    rolls = roll_schedule(cs, "volume", confirm_bars=confirm)
    assert [(r.from_id, r.to_id) for r in rolls] == [("ESH6", "ESM6"), ("ESM6", "ESU6")]
    for r, (front, nxt) in zip(rolls, itertools.pairwise(cs), strict=True):
        common, fi, ni = np.intersect1d(front.time_ns, nxt.time_ns, return_indices=True)
        ahead = nxt.volume[ni] > front.volume[fi]
        first = next(
            i
            for i in range(len(ahead))
            if ahead[i - confirm + 1 : i + 1].all() and i >= confirm - 1
        )
        assert r.time_ns == common[first + 1]  # decided at that bar's close: held from the next


def test_the_expiry_roll_is_n_days_before_the_front_s_expiry():
    cs, _ = contracts("ratio")
    cs = [Contract(**{**c.__dict__, "expiry_ns": int(c.time_ns[-1])}) for c in cs]
    rolls = roll_schedule(cs, "days_before_expiry", days=7)
    for r, front in zip(rolls, cs, strict=False):
        assert r.time_ns == front.time_ns[-1] - 7 * DAY  # daily bars: that very day


def test_a_full_listing_s_schedule_is_online_and_its_returns_are_the_path_s():
    """3-4 months at once: a file cut at any day of a quarter (before, during and after a
    crossover) has the full file's rolls up to the cut, then holds the contract the full file
    holds at the cut; ratio-adjusted returns are the path's less the carry's roll-down."""
    carry, confirm = 0.03, 3
    cs, path = listing(carry)
    table = contracts_table(cs)
    time_ns = table["timestamp"].cast(pa.int64()).to_numpy()
    assert (
        3
        <= min(np.unique(time_ns, return_counts=True)[1])
        < 4
        == max(np.unique(time_ns, return_counts=True)[1])
    )
    cfg = futures_cfg("unused.parquet")
    cfg.futures.roll.confirm_bars = confirm
    _, full = continuous_table(table, DataSection.of(cfg))
    held = ["ESH6", *(r.to_id for r in full)]
    assert held == ["ESH6", "ESM6", "ESU6", "ESZ6", "ESH7", "ESM7", "ESU7", "ESZ7"]
    assert [r.held_at_end for r in full] == [False] * 6 + [True]
    # the roll into ESU7: decided at the close of the bar before, the third of three bars the
    # next contract's volume leads; cut with 0, 1, 2 and 3 of them seen, and after
    roll = next(r for r in full if r.to_id == "ESU7")
    decided = roll.time_ns - DAY
    cuts = np.arange(roll.time_ns - 60 * DAY, roll.time_ns + 40 * DAY, DAY)  # a quarter
    assert {decided - k * DAY for k in range(4)} <= set(cuts.tolist())
    for cut in cuts:
        part = table.filter(pc.less_equal(table["timestamp"].cast(pa.int64()), cut))
        out, rolls = continuous_table(part, DataSection.of(cfg))
        want = [r for r in full if r.time_ns <= cut]
        got = [(r.time_ns, r.from_id, r.to_id, r.factor) for r in rolls]
        assert got == [(r.time_ns, r.from_id, r.to_id, r.factor) for r in want], cut
        assert rolls[-1].held_at_end and rolls[-1].to_id == want[-1].to_id
        days = (out["timestamp"].cast(pa.int64()).to_numpy() - ns("2026-01-01")) // DAY
        assert (days == np.arange(len(days))).all()  # every day, from the held contract
        returns = np.diff(np.log(out["close"].to_numpy()))
        np.testing.assert_allclose(
            returns, np.diff(np.log(path[: len(days)])) - carry * DAY / YEAR, rtol=0, atol=1e-12
        )
    # a front with no bar on the data's last 2 days has paused, not expired: still held
    time_ns, symbol = table["timestamp"].cast(pa.int64()), table["symbol"]
    cut = roll.time_ns - 20 * DAY
    paused = pc.and_(pc.equal(symbol, "ESM7"), pc.greater(time_ns, cut - 2 * DAY))
    part = table.filter(pc.and_(pc.less_equal(time_ns, cut), pc.invert(paused)))
    rolls = continuous_table(part, DataSection.of(cfg))[1]
    assert rolls[-1].to_id == "ESM7" and len(rolls) == len([r for r in full if r.time_ns <= cut])


def test_the_roll_goes_to_the_later_month_that_leads_and_never_back(caplog):
    """Three months at once: ESU6 (two out) leads ESH6 first and is held; ESM6 leading ESU6
    later is an earlier month, never rolled back to, and never held."""
    days = np.arange(100)
    volume = {
        "H": np.full(100, 100.0),
        "M": np.where(days >= 60, 500.0, 50.0),
        "U": np.where(days >= 30, 300.0, 50.0),
    }
    cs = [
        Contract(
            id=f"ES{code}6",
            root="ES",
            month=MONTH_CODES.index(code) + 1,
            year=2026,
            time_ns=T0 + DAY * days,
            prices={p: np.full(100, 5000.0) for p in PRICES},
            volume=volume[code],
        )
        for code in "HMU"
    ]
    with caplog.at_level(logging.INFO, logger="foxhunt_serve.futures"):
        rolls = roll_schedule(cs, "volume", confirm_bars=2)
    assert rolls == [Roll(T0 + 32 * DAY, "ESH6", "ESU6", rolls[0].factor, held_at_end=True)]
    assert "ES: 1 deferred contracts never held (ESM6)" in caplog.text
    series = stitch(cs, rolls, "ratio")
    assert series.ids == ["ESH6", "ESU6"] and (np.diff(series.time_ns) == DAY).all()


def test_an_expired_front_with_no_signal_rolls_at_its_last_bar_with_a_warning(caplog):
    cs, _ = contracts("ratio")
    flat = [Contract(**{**c.__dict__, "volume": np.full(len(c.time_ns), 5.0)}) for c in cs]
    with caplog.at_level(logging.WARNING, logger="foxhunt_serve.futures"):
        rolls = roll_schedule(flat, "volume", confirm_bars=2)
    # each front's bars end 40 days before the data's: it expired, the next is held after it
    assert [(r.from_id, r.to_id, r.time_ns) for r in rolls] == [
        ("ESH6", "ESM6", T0 + 120 * DAY),
        ("ESM6", "ESU6", T0 + 200 * DAY),
    ]
    assert "ESH6 expired" in caplog.text and "rolled to ESM6 at its last bar" in caplog.text
    assert "ESM6 expired" in caplog.text and "rolled to ESU6 at its last bar" in caplog.text
    with pytest.raises(DataError, match="ESM6's volume never exceeds ESH6's on 2 consecutive"):
        roll_schedule(flat, "volume", confirm_bars=2, strict=True)
    cfg = futures_cfg("unused.parquet")
    cfg.futures.roll.strict = True  # data.futures.roll.strict=true: the error
    with pytest.raises(DataError, match="contracts ESH6 and ESM6 overlap on 40 bars but ESM6's"):
        continuous_table(contracts_table(flat), DataSection.of(cfg))
    with pytest.raises(ConfigError, match="open_interest_column"):
        roll_schedule(cs, "open_interest")


@pytest.mark.parametrize("confirm", [1, 4])
def test_ratio_adjusted_returns_are_the_path_s_across_every_roll(confirm):
    cs, path = contracts("ratio", contango=0.02)
    series = stitch(cs, roll_schedule(cs, "volume", confirm_bars=confirm), "ratio")
    days = (series.time_ns - T0) // DAY
    assert (np.diff(days) == 1).all() and days[0] == 0 and days[-1] == len(path) - 1
    np.testing.assert_allclose(
        np.diff(np.log(series.prices["close"])), np.diff(np.log(path)), rtol=0, atol=1e-12
    )
    # the newest contract's prices are its own; the factors are the contango
    assert series.prices["close"][-1] == pytest.approx(path[-1] * 1.02**2)
    assert [r.factor for r in series.rolls] == pytest.approx([1.02, 1.02])
    assert list(series.contract[:80]) == [0] * 80 and series.contract[-1] == 2


def test_difference_adjusted_price_changes_are_the_path_s():
    cs, path = contracts("difference")
    series = stitch(cs, roll_schedule(cs, "volume"), "difference")
    np.testing.assert_allclose(np.diff(series.prices["close"]), np.diff(path), atol=1e-9)
    assert [r.factor for r in series.rolls] == pytest.approx([10.0, 10.0])


def test_unadjusted_series_keeps_the_jump():
    cs, path = contracts("ratio", contango=0.02)
    rolls = roll_schedule(cs, "volume")
    series = stitch(cs, rolls, "none")
    jumps = np.diff(np.log(series.prices["close"])) - np.diff(np.log(path))
    at = np.flatnonzero(np.abs(jumps) > 1e-9)
    assert len(at) == 2 and np.allclose(jumps[at], np.log(1.02))
    assert series.time_ns[at + 1].tolist() == [r.time_ns for r in rolls]


def test_a_gap_between_contracts_is_a_warning_naming_them(caplog):
    cs, _ = contracts("ratio")
    late = Contract(**{**cs[1].__dict__, "time_ns": cs[1].time_ns + 60 * DAY})
    with caplog.at_level(logging.WARNING, logger="foxhunt_serve.futures"):
        rolls = roll_schedule([cs[0], late], "volume")
    assert rolls[0].time_ns == late.time_ns[0]
    assert "ESH6 ends 21.0 days before ESM6's first bar after it" in caplog.text


def contract_file(path, contango: float = 0.02) -> tuple:
    """The three contracts as one Parquet file of daily OHLCV bars, one row per contract and
    day (the overlaps twice), symbol = the contract id."""
    cs, path_prices = contracts("ratio", contango=contango)
    pq.write_table(contracts_table(cs), path)
    return cs, path_prices


def futures_run(path) -> list[str]:
    """Overrides for a one-epoch CPU run on a contract file with data.futures on."""
    return [
        "data=parquet",
        f"data.path={path}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.encoder_length=16",
        "data.prediction_length=4",
        "data.lazy=false",
        "data.futures.enabled=true",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu",
        "report=false",
    ]


@pytest.mark.parametrize("adjust", ["ratio", "none", "difference"])
def test_a_root_s_contracts_train_as_one_continuous_instrument(tmp_path, adjust):
    cs, path = contract_file(tmp_path / "es.parquet")
    cfg = futures_cfg(tmp_path / "es.parquet")
    # none and difference too: the derived inputs and the target come from the ratio-adjusted
    # series, so a roll bar's return is never the spread, nor a return shifted by later rolls
    cfg.futures.roll.adjust = adjust
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert dm.schema.groups == ["ES"]  # the root is the instrument: the next contract is known
    assert [(r.from_id, r.to_id) for r in dm.rolls] == [("ESH6", "ESM6"), ("ESM6", "ESU6")]
    # the target (1-bar log return of the adjusted close) is the path's: no jump at a roll
    ds = dm.datasets["train"]
    target = ds.target.double().numpy() * dm.schema.target_scale + dm.schema.target_center
    days = (ds.time_ns.numpy() - T0) // DAY
    np.testing.assert_allclose(target[1:], np.diff(np.log(path))[days[1:] - 1], atol=1e-6)


def test_the_calendar_splits_cut_the_continuous_series(tmp_path):
    contract_file(tmp_path / "es.parquet")
    cfg = futures_cfg(tmp_path / "es.parquet")
    cfg.split.val_start, cfg.split.test_start = "2026-06-01", "2026-08-10"  # days 150, 220
    dm = ParquetDataModule(cfg)
    dm.setup()
    cuts = {k: np.datetime64(v[:-1], "ns").astype(np.int64) for k, v in dm.splits["cuts"].items()
            if v and "_" in k}  # fmt: skip
    periods = {
        "train": (T0, cuts["train_end"]),
        "val": (cuts["val_start"], cuts["val_end"]),
        "test": (cuts["test_start"], T0 + 1000 * DAY),
    }
    rolls = [r.time_ns for r in dm.rolls]
    for split, (lo, hi) in periods.items():
        ds = dm.datasets[split]
        targets = ds.target_times(np.arange(len(ds)))
        assert len(ds) > 0 and ((targets >= lo) & (targets < hi)).all(), split
        assert (ds.group[ds.starts] == 0).all()  # one instrument: ES
    # the series runs on across the rolls: a training window's history holds the first, the
    # test period lies after the second, with each window's history taken from before it
    train, test = dm.datasets["train"], dm.datasets["test"]
    first = train.time_ns[train.starts].numpy()
    assert (first < rolls[0]).any() and (
        train.target_times(np.arange(len(train)))[:, -1] > rolls[0]
    ).any()
    assert (
        test.time_ns[test.starts].numpy().min() < cuts["test_start"]
        and rolls[1] < cuts["test_start"]
    )


@pytest.mark.slow  # 3 CPU-s: the full tier
def test_a_run_writes_its_roll_schedule(tmp_path):
    contract_file(tmp_path / "es.parquet")
    train(compose_train(*futures_run(tmp_path / "es.parquet")), tmp_path / "run")
    rolls = pacsv.read_csv(tmp_path / "run" / "rolls.csv")
    assert rolls.column_names == ["time", "from", "to", "factor", "held_at_end"]
    assert rolls["from"].to_pylist() == ["ESH6", "ESM6"]
    assert rolls["held_at_end"].to_pylist() == [False, True]  # ESU6 is held at the end
    assert rolls["factor"].to_pylist() == pytest.approx([1.02, 1.02])


@pytest.mark.slow  # 8 CPU-s: the full tier
def test_a_model_trained_on_two_contracts_forecasts_the_third(tmp_path):
    contract_file(tmp_path / "all.parquet")
    table = pq.read_table(tmp_path / "all.parquet")
    two = table.filter(pc.is_in(table["symbol"], pa.array(["ESH6", "ESM6"])))
    pq.write_table(two, tmp_path / "two.parquet")
    nxt = table.filter(pc.is_in(table["symbol"], pa.array(["ESM6", "ESU6"])))
    run = compose_train(*futures_run(tmp_path / "two.parquet"))
    ckpt = train(run, tmp_path / "run")["best_checkpoint"]
    # ESU6 is unknown to the checkpoint as a contract, known as a contract of ES
    futures = foxhunt.load(ckpt, {"group_column": "symbol", "futures": {"enabled": True}})
    got = futures.predict(nxt, all_windows=True)
    assert set(got["instrument"].to_pylist()) == {"ES"}
    # bars to forecast after ESU6's last (an empty close): the forecast of ES at their times
    last = nxt["timestamp"].cast(pa.int64()).to_numpy().max()
    times = last + DAY * np.arange(1, 5)
    empty = pa.array([None] * 4, pa.float64())
    ahead = pa.table(
        {
            "timestamp": pa.array(times, pa.timestamp("ns", tz="UTC")),
            "symbol": ["ESU6"] * 4,
            **{c: empty for c in ("open", "high", "low", "close", "volume")},
        }
    )
    forecast = futures.predict(pa.concat_tables([nxt, ahead.cast(nxt.schema)]))
    assert forecast["instrument"].to_pylist() == ["ES"] * 4
    assert forecast["target_time"].cast(pa.int64()).to_pylist() == times.tolist()
    # predict.py alike: data=es_fut_small has data.futures on and names contracts by symbol
    # (data= replaces the data config the checkpoint carries)
    pq.write_table(nxt, tmp_path / "next.parquet")
    code, _, stderr = run_script(
        "predict.py",
        f"ckpt_path='{ckpt}'",
        "data=es_fut_small",
        f"data.path={tmp_path / 'next.parquet'}",
        "data.generate_if_missing=false",
        "predict.all_windows=true",
        f"predict.out={tmp_path / 'cli.parquet'}",
        f"hydra.run.dir={tmp_path / 'predict'}",
    )
    assert code == 0, stderr
    assert pq.read_table(tmp_path / "cli.parquet").equals(got)
    # the same bars as one continuous series, stitched beforehand: the same forecasts
    cfg = futures_cfg(tmp_path / "all.parquet")
    cfg.futures.roll.confirm_bars = 3  # the default the run and the predictor use
    stitched, _ = continuous_table(
        nxt.cast(nxt.schema.set(0, pa.field("timestamp", pa.timestamp("ns")))), DataSection.of(cfg)
    )
    # the checkpoint carries its run's data config (futures on): off for a stitched series
    plain = foxhunt.load(ckpt, {"group_column": "symbol", "futures": {"enabled": False}})
    want = plain.predict(stitched, all_windows=True)
    assert got.num_rows == want.num_rows > 0
    for column in ("origin_time", "horizon", "q0.1", "q0.5", "q0.9"):
        np.testing.assert_allclose(
            got[column].to_numpy().astype(float), want[column].to_numpy().astype(float), rtol=1e-6
        )


def test_the_report_lists_the_rolls_and_the_fan_chart_marks_them():
    rolls = [Roll(T0 + 10 * DAY, "ESH6", "ESM6", 1.0075, held_at_end=True)]
    text = "\n".join(_rolls_section(SimpleNamespace(rolls=rolls)))
    assert "| 2026-01-12 00:00 | ESH6 | ESM6 | 1.008 | yes |" in text
    # a window of 6 encoder and 2 forecast bars starting at row 5: the roll bar is row 10,
    # the sixth encoder bar, so 1 bar before the forecast start (x = 0 is the last observed)
    dataset = SimpleNamespace(time_ns=torch.arange(20) * DAY + T0, starts=torch.tensor([0, 5]))
    schema = SimpleNamespace(encoder_length=6, prediction_length=2)
    assert _roll_marks([{"window": 1}], dataset, schema, rolls) == {1: [0]}
    assert _roll_marks([{"window": 0}], dataset, schema, rolls) == {0: []}


def test_an_expiry_column_sets_the_expiry_roll_and_may_not_be_empty(tmp_path):
    contract_file(tmp_path / "es.parquet")
    table = pq.read_table(tmp_path / "es.parquet")
    symbol = table["symbol"].to_numpy(zero_copy_only=False)
    ends = {
        c: table["timestamp"].cast(pa.int64()).to_numpy()[symbol == c].max() for c in set(symbol)
    }
    expiry = np.array([ends[c] for c in symbol]).astype("datetime64[ns]").astype("datetime64[D]")
    with_expiry = table.append_column("expiry", pa.array(expiry, pa.date32()))
    pq.write_table(with_expiry, tmp_path / "expiry.parquet")
    cfg = futures_cfg(tmp_path / "expiry.parquet")
    cfg.futures.roll.rule = "days_before_expiry"
    cfg.futures.roll.days = 7
    cfg.futures.roll.expiry_column = "expiry"
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert [r.time_ns for r in dm.rolls] == [ends["ESH6"] - 7 * DAY, ends["ESM6"] - 7 * DAY]
    # an empty expiry: one line naming the contract
    holes = pa.array(np.where(symbol == "ESM6", None, expiry), pa.date32())
    pq.write_table(table.append_column("expiry", holes), tmp_path / "holes.parquet")
    cfg.path = str(tmp_path / "holes.parquet")
    with pytest.raises(
        DataError, match="expiry column 'expiry' is empty in 120 rows of contract ESM6"
    ):
        ParquetDataModule(cfg).setup()


def test_a_root_column_names_the_root_of_ids_without_a_month_code(tmp_path):
    contract_file(tmp_path / "es.parquet")
    table = pq.read_table(tmp_path / "es.parquet")
    ids = {"ESH6": "first", "ESM6": "second", "ESU6": "third"}
    symbol = [ids[s] for s in table["symbol"].to_pylist()]
    table = table.set_column(1, "symbol", pa.array(symbol)).append_column(
        "root", pa.array(["ES"] * table.num_rows)
    )
    pq.write_table(table, tmp_path / "named.parquet")
    cfg = futures_cfg(tmp_path / "named.parquet")
    cfg.futures.root_column = "root"
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert dm.schema.groups == ["ES"]
    # ordered by their bars (no month code, no expiry column), rolled on the volume
    assert [(r.from_id, r.to_id) for r in dm.rolls] == [("first", "second"), ("second", "third")]
    cfg.futures.roll.rule = "days_before_expiry"
    with pytest.raises(DataError, match="contract first has no expiry: its id names no month"):
        ParquetDataModule(cfg).setup()
    # a contract under two roots: one line naming it
    roots = np.where(np.arange(table.num_rows) == 5, "NQ", "ES")
    pq.write_table(
        table.set_column(table.num_columns - 1, "root", pa.array(roots)), tmp_path / "two.parquet"
    )
    cfg.path, cfg.futures.roll.rule = str(tmp_path / "two.parquet"), "volume"
    with pytest.raises(
        DataError, match="contract first has 2 roots in data.futures.root_column 'root': ES, NQ"
    ):
        ParquetDataModule(cfg).setup()


def test_daily_bars_get_no_time_of_day_features(tmp_path):
    # daily bars stamped at 21:00 or 22:00 UTC (a daylight-saving shift): a daily bar has no
    # time of day, whatever its clock time; eager and lazy paths alike, and predict
    _, path = contracts("ratio")
    n = len(path)
    shift = np.where(np.arange(n) < n // 2, 21, 22) * 3600 * 10**9
    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "timestamp": pa.array(T0 + DAY * np.arange(n) + shift, pa.timestamp("ns", tz="UTC")),
            "symbol": np.full(n, "SPX"),
            "open": path,
            "high": path * (1 + 0.01 * rng.random(n)),
            "low": path * (1 - 0.01 * rng.random(n)),
            "close": path,
            "volume": 1000 + rng.random(n),
        }
    )
    pq.write_table(table, tmp_path / "daily.parquet")
    found = []
    for lazy in (False, True):
        cfg = futures_cfg(tmp_path / "daily.parquet")
        cfg.futures.enabled, cfg.lazy, cfg.cache_dir = False, lazy, str(tmp_path / "cache")
        dm = ParquetDataModule(cfg)
        dm.setup()
        assert dm.schema.known == ["dow_sin", "dow_cos"], f"lazy={lazy}"
        found.append(dm.datasets["train"].inputs)
    assert torch.equal(found[0], found[1])


def test_a_contract_with_a_time_twice_names_the_contract_and_the_time(es_sample, tmp_path):
    """A futures file with one contract's row duplicated (foxhunt sorts rows itself, so the
    file's order is no fault): `foxhunt train` stops with exit 2 on one line naming the
    contract and the time, before any training, for a contract held or not held at the time."""
    table = pq.read_table(es_sample)
    for contract, row in (("ESM6", 10), ("ESH6", 2000)):  # ESM6's 10th bar: not yet held
        rows = table.filter(pc.equal(table["symbol"], contract))
        path = tmp_path / f"twice-{contract}.parquet"
        pq.write_table(pa.concat_tables([rows.slice(row, 1), table]), path)
        at = rows["timestamp"][row].as_py().strftime("%Y-%m-%dT%H:%M:%SZ")
        code, stdout, stderr = run_script(
            "train.py",
            "data=es_fut_small",
            f"data.path={path}",
            "data.generate_if_missing=false",
            "trainer.accelerator=cpu",
            *("trainer.max_epochs=1", "trainer.limit_train_batches=1", "report=false"),
            f"hydra.run.dir={tmp_path / 'run'}",
        )
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert stderr == (
            f"error: contract {contract} has two rows at {at}: one bar per contract and time, "
            "drop the duplicate\n"
        )
        assert "epoch" not in (stdout + stderr).lower()
