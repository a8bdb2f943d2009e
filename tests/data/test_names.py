"""The first run on a user's file (foxhunt.data.names): the default config on a file of daily
stock bars spelled its own way trains; what it cannot find is one line naming the override."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from foxhunt.config import DataConfig
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.names import resolve_names
from foxhunt.errors import DataError
from tests.helpers import compose_train, run_script

TICKERS = ("NDX", "AAPL", "MSFT")  # none parses as root + month code + year


def stock_bars(path: Path, tickers=TICKERS, days: int = 400, rename: dict | None = None) -> Path:
    """Daily bars as a vendor writes them: Date, Ticker, Open, High, Low, Close, Volume."""
    rng = np.random.default_rng(0)
    dates = np.arange(np.datetime64("2022-01-03"), np.datetime64("2022-01-03") + days * 2)
    dates = dates[np.is_busday(dates)][:days].astype("datetime64[ns]")
    parts = []
    for ticker in tickers:
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, days)))
        opened = close * np.exp(rng.normal(0, 0.003, days))
        parts.append(
            {
                "Date": dates,
                "Ticker": np.full(days, ticker),
                "Open": opened,
                "High": np.maximum(opened, close) * 1.01,
                "Low": np.minimum(opened, close) * 0.99,
                "Close": close,
                "Volume": rng.integers(1_000, 5_000, days).astype(float),
            }
        )
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    names = {k: (rename or {}).get(k, k) for k in cols}
    pq.write_table(pa.table({names[k]: v for k, v in cols.items()}), path)
    return path


def default_data(path: Path) -> OmegaConf:
    """The default config's data group (the bundled futures sample's) on `path`."""
    return compose_train(f"data.path={path}").data


def test_the_default_config_finds_a_stock_files_columns_and_trains_no_contracts(tmp_path):
    cfg = default_data(stock_bars(tmp_path / "stocks.parquet"))
    data = ParquetDataModule(cfg)
    data.setup()
    assert (cfg.time_column, cfg.group_column) == ("Date", "Ticker")
    assert [cfg.ohlcv[f] for f in ("open", "close", "volume")] == ["Open", "Close", "Volume"]
    assert cfg.futures.enabled is False
    assert data.schema.groups == sorted(TICKERS)  # each ticker its own series, none rolled
    assert len(data.datasets["test"]) > 0


def test_the_default_config_still_rolls_the_bundled_contracts(tmp_path):
    rows = 40
    ids = ["ESH6"] * rows + ["ESM6"] * rows
    t = np.arange(2 * rows) * 3600 * 10**9
    bars = {c: np.ones(2 * rows) for c in ("open", "high", "low", "close", "volume")}
    table = pa.table({"timestamp": pa.array(t, pa.timestamp("ns")), "symbol": ids, **bars})
    cfg = default_data(tmp_path / "x.parquet")
    resolve_names(cfg, pads.dataset(table))
    assert cfg.futures.enabled is True
    cfg = default_data(tmp_path / "x.parquet")
    mixed = table.set_column(1, "symbol", pa.array(["ESH6"] * rows + ["BTCUSD"] * rows))
    resolve_names(cfg, pads.dataset(mixed))
    assert cfg.futures.enabled is False  # one id that is no contract: nothing is rolled


def test_resolution_is_case_insensitive_and_leaves_exact_names_alone():
    table = pa.table(
        {"TIMESTAMP": pa.array([], pa.timestamp("ns")), "y": pa.array([], pa.float64())}
    )
    cfg = OmegaConf.structured(DataConfig(path="f.parquet", target="Y"))
    resolve_names(cfg, pads.dataset(table))
    assert (cfg.time_column, cfg.target) == ("TIMESTAMP", "y")
    exact = OmegaConf.structured(DataConfig(path="f.parquet", target="y", time_column="Date"))
    both = pa.table({"Date": pa.array([], pa.date32()), "date": pa.array([], pa.date32())})
    resolve_names(exact, pads.dataset(both))
    assert exact.time_column == "Date"
    ambiguous = OmegaConf.structured(DataConfig(path="f.parquet", target="y"))
    with pytest.raises(DataError, match="add data.time_column=NAME"):
        resolve_names(ambiguous, pads.dataset(both))  # Date and date: which is unsaid


@pytest.mark.parametrize(
    ("rename", "names"),
    [
        ({"Close": "Px"}, "data=parquet data.target=COLUMN"),  # the others: the full tier (#70)
        pytest.param({"Date": "When"}, "add data.time_column=NAME", marks=pytest.mark.slow),
        pytest.param({"Ticker": "Name"}, "add data.group_column=NAME", marks=pytest.mark.slow),
    ],
)
def test_what_is_not_found_is_one_line_naming_the_override(tmp_path, rename, names):
    path = stock_bars(tmp_path / "stocks.parquet", days=30, rename=rename)
    code, out, err = run_script("train.py", f"data.path={path}", f"hydra.run.dir={tmp_path}/run")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    assert names in lines[0] and "the file has:" in lines[0]


def test_one_time_twice_without_a_group_column_names_data_group_column(tmp_path):
    path = stock_bars(tmp_path / "stocks.parquet", days=60)
    cfg = OmegaConf.structured(DataConfig(path=str(path), features="ohlcv", lazy=False))
    with pytest.raises(DataError, match="needs data.group_column=NAME"):
        ParquetDataModule(cfg).setup()


@pytest.mark.slow
def test_train_py_on_a_stock_file_with_the_default_config(tmp_path):
    path = stock_bars(tmp_path / "stocks.parquet")
    run = tmp_path / "run"
    code, out, err = run_script(
        "train.py",
        f"data.path={path}",
        f"hydra.run.dir={run}",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=2",
        "trainer.enable_progress_bar=false",
        "report=false",
    )
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert sorted(summary["splits"]["instruments"]) == sorted(TICKERS)
    assert "rolls" not in summary
