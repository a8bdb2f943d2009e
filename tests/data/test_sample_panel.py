"""Tests of the synthetic daily stock panel (foxhunt.data.samples.stock_panel_table): a vendor's
file of many stocks, its invariants checked across the whole panel at once."""

from __future__ import annotations

import re
import runpy
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from foxhunt_serve import ROOT_PATTERN, parse_contract

from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.samples import (
    PANEL_DAYS,
    PANEL_END,
    PANEL_SCHEMA,
    PANEL_SECTORS,
    make_es_sample,
    make_stock_panel,
    stock_panel_table,
)
from foxhunt.data.samples import stocks as sample_module
from foxhunt.errors import DataError
from tests.helpers import ROOT, compose_train

DAY_NS = 86_400 * 10**9
N = 50  # the script's default


@pytest.fixture(scope="module")
def panel() -> pa.Table:
    return stock_panel_table(N)


def _symbols(table: pa.Table) -> np.ndarray:
    return np.asarray(table["symbol"].to_pylist())


def _days(table: pa.Table) -> np.ndarray:
    """Each row's UTC calendar day (datetime64[D])."""
    ns = table["timestamp"].cast(pa.int64()).to_numpy()
    return (ns // DAY_NS).astype("datetime64[D]")


def _spans(table: pa.Table) -> dict[str, tuple[np.datetime64, np.datetime64, int]]:
    """(first day, last day, rows) of each stock."""
    sym, day = _symbols(table), _days(table)
    return {s: (day[sym == s][0], day[sym == s][-1], int(np.sum(sym == s))) for s in set(sym)}


def _calendar() -> np.ndarray:
    end = np.datetime64(PANEL_END, "D")
    return np.busday_offset(end, np.arange(1 - PANEL_DAYS, 1), roll="backward")


def _closes(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Stocks (sorted) by calendar day: the close (NaN where a stock has no row) and sectors."""
    cal = _calendar()
    sym, day = _symbols(table), _days(table)
    names, row = np.unique(sym, return_inverse=True)
    close = np.full((names.size, cal.size), np.nan)
    close[row, np.searchsorted(cal, day)] = table["close"].to_numpy()
    sector = np.zeros(names.size, dtype=np.int64)
    sector[row] = table["sector"].to_numpy()
    return close, sector


def test_schema_and_size(panel):
    expected = pa.schema(
        [
            ("timestamp", pa.timestamp("ns", tz="UTC")),
            ("symbol", pa.string()),
            ("open", pa.float64()),
            ("high", pa.float64()),
            ("low", pa.float64()),
            ("close", pa.float64()),
            ("volume", pa.int64()),
            ("sector", pa.int64()),
        ]
    )
    assert panel.schema.equals(expected) and PANEL_SCHEMA.equals(expected)
    assert len(set(_symbols(panel))) == N
    assert 0.85 * N * PANEL_DAYS < panel.num_rows <= N * PANEL_DAYS


def test_sorted_by_symbol_then_strictly_increasing_time(panel):
    sym = _symbols(panel)
    ns = panel["timestamp"].cast(pa.int64()).to_numpy()
    blocks = [sym[0], *sym[1:][sym[1:] != sym[:-1]]]
    assert blocks == sorted(set(blocks))  # one contiguous block per stock, blocks in order
    same = sym[1:] == sym[:-1]
    assert np.all(np.diff(ns)[same] > 0)


def test_business_days_only_at_one_time_of_day_ending_at_the_fixed_date(panel):
    ns = panel["timestamp"].cast(pa.int64()).to_numpy()
    day = _days(panel)
    assert np.all(np.is_busday(day))  # no Saturday or Sunday rows
    assert np.all(ns % DAY_NS == 21 * 3600 * 10**9)  # 21:00 UTC
    assert np.array_equal(np.unique(day), _calendar())  # every business day, ending at the end
    assert str(day.max()) == PANEL_END


def test_listings_are_staggered(panel):
    start = _calendar()[0]
    first = np.array([f for f, _, _ in _spans(panel).values()])
    assert np.mean(first == start) >= 0.6  # most trade from the start
    late = first[first > start]
    assert late.size >= 0.15 * N and np.unique(late).size == late.size  # on different dates
    assert np.all(late <= _calendar()[PANEL_DAYS * 3 // 5])  # each long enough to train on


def test_a_few_are_delisted_before_the_end(panel):
    end = _calendar()[-1]
    last = np.array([lst for _, lst, _ in _spans(panel).values()])
    early = last[last < end]
    assert 1 <= early.size <= 0.1 * N
    assert np.all(early < _calendar()[PANEL_DAYS * 9 // 10])  # gone, not a late last bar


def test_a_few_have_runs_of_missing_days(panel):
    cal = _calendar()
    halted = {}
    for s, (first, last, rows) in _spans(panel).items():
        business_days = np.searchsorted(cal, last) - np.searchsorted(cal, first) + 1
        if rows < business_days:
            halted[s] = business_days - rows
    assert 1 <= len(halted) <= 0.1 * N
    # each a run of days (a halt), not scattered single days
    sym, day = _symbols(panel), _days(panel)
    for s, missing in halted.items():
        steps = np.diff(np.searchsorted(cal, day[sym == s]))
        assert np.sum(steps > 1) == 1 and steps.max() == missing + 1, s


def test_ohlc_consistent_and_volume_positive(panel):
    o, h, lo, c = (panel[k].to_numpy() for k in ("open", "high", "low", "close"))
    assert np.all(lo <= np.minimum(o, c)) and np.all(h >= np.maximum(o, c))
    assert np.all(lo > 0)
    for p in (o, h, lo, c):
        assert np.allclose(p * 100, np.round(p * 100), rtol=0, atol=1e-6)  # in cents
    # bars have wicks: the day's high and low lie beyond its open and close
    assert np.mean(h > np.maximum(o, c)) > 0.8 and np.mean(lo < np.minimum(o, c)) > 0.8
    assert np.all(panel["volume"].to_numpy() > 0)
    # the open gaps from the previous close (the same stock's, the day before)
    sym = _symbols(panel)
    same = sym[1:] == sym[:-1]
    assert np.mean(o[1:][same] != c[:-1][same]) > 0.9


def test_sector_is_a_constant_code_per_stock(panel):
    sym, sector = _symbols(panel), panel["sector"].to_numpy()
    per_stock = {s: np.unique(sector[sym == s]) for s in set(sym)}
    assert all(codes.size == 1 for codes in per_stock.values())
    assert set(np.unique(sector)) == set(range(PANEL_SECTORS))  # 0..k-1, every code used
    few = stock_panel_table(5, days=40, sectors=3)["sector"].to_numpy()
    assert set(np.unique(few)) == {0, 1, 2}


def test_market_and_sector_factors_and_volatility_levels(panel):
    close, sector = _closes(panel)
    full = ~np.isnan(close).any(axis=1)
    r = np.diff(np.log(close[full]), axis=1)
    corr = np.corrcoef(r)
    same = sector[full][:, None] == sector[full][None, :]
    off = ~np.eye(corr.shape[0], dtype=bool)
    across, within = corr[off & ~same].mean(), corr[off & same].mean()
    assert across > 0.1  # a common market factor
    assert within > across + 0.05  # and sectors on top of it
    vol = r.std(axis=1)
    assert vol.max() > 1.8 * vol.min()
    assert 0.008 < np.median(vol) < 0.04  # daily


def test_deterministic_from_the_seed(panel):
    again = stock_panel_table(N)
    assert again.equals(panel)
    other = stock_panel_table(N, seed=1)
    assert not np.array_equal(other["close"].to_numpy()[:100], panel["close"].to_numpy()[:100])
    assert set(_symbols(other)) != set(_symbols(panel))


def test_symbols_are_tickers_not_futures_contracts(panel):
    symbols = sorted(set(_symbols(panel)))
    assert all(re.fullmatch(r"[A-Z]{3,4}", s) for s in symbols)
    for s in symbols:
        assert re.match(ROOT_PATTERN, s) is None, s
        with pytest.raises(DataError):
            parse_contract(s, 0)


def test_a_large_panel_builds_in_seconds():
    t0 = time.perf_counter()
    big = stock_panel_table(250, days=2000)
    elapsed = time.perf_counter() - t0
    assert 400_000 < big.num_rows <= 500_000
    assert len(set(big["symbol"].unique().to_pylist())) == 250
    assert elapsed < 5.0


def test_argument_checks():
    for bad in ({"n_instruments": 0}, {"days": 19}, {"sectors": 0}):
        with pytest.raises(ValueError):
            stock_panel_table(**bad)
    one = stock_panel_table(1, days=20)
    assert one.num_rows == 20 and one["sector"].to_pylist() == [0] * 20


def test_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = make_stock_panel(tmp_path / "sub" / "panel.parquet", 8, days=60, seed=3)
    assert pq.read_table(path).equals(stock_panel_table(8, days=60, seed=3))
    write_table = sample_module.pq.write_table

    def killed_midway(table, where, **options):
        write_table(table.slice(0, 10), where)
        raise KeyboardInterrupt

    monkeypatch.setattr(sample_module.pq, "write_table", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        make_stock_panel(tmp_path / "killed.parquet", 8, days=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_the_script_writes_a_panel_and_still_the_futures_sample(tmp_path, capsys):
    main = runpy.run_path(str(ROOT / "scripts" / "make_sample_data.py"))["main"]
    out = tmp_path / "panel.parquet"
    assert main(["--panel", "6", "--days", "30", "--sectors", "2", "--out", str(out)]) == 0
    assert pq.read_table(out).equals(stock_panel_table(6, days=30, sectors=2))
    # without --panel: the futures sample, as before
    es = tmp_path / "es.parquet"
    assert main(["--days", "2", "--out", str(es)]) == 0
    expected = make_es_sample(tmp_path / "expected.parquet", days=2)
    assert es.read_bytes() == expected.read_bytes()
    assert "rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--panel", "--bar-minutes", "5", "--out", str(out)])


def test_reads_as_one_instrument_per_stock_with_sector_static(tmp_path):
    path = make_stock_panel(tmp_path / "panel.parquet", 12, days=300)
    cfg = compose_train(
        "data=parquet",
        f"data.path={path}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.static_features=[sector]",
    ).data
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert dm.schema.groups == sorted(set(_symbols(pq.read_table(path))))
    assert dm.schema.static == ["sector"]
