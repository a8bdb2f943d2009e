"""scripts/inspect_data.py: a panel's facts and every problem train.py would refuse, at once;
its figures are the ones train.py then uses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from foxhunt.data.samples import stock_panel_table
from tests.helpers import run_script

PANEL = ("data=parquet", "data.group_column=symbol", "data.features=ohlcv")
SMALL = ("model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4")


def panel_with_crypto(n: int = 12, days: int = 400) -> pa.Table:
    """A stock panel (staggered listings, delistings, halts) and a coin trading every day."""
    stocks = stock_panel_table(n, days=days, seed=3)
    end = pc.max(stocks["timestamp"]).as_py()
    t = np.arange(days) - days + 1
    times = np.datetime64(end.replace(tzinfo=None), "ns") + t * np.timedelta64(1, "D")
    close = 30_000 * np.exp(np.cumsum(np.random.default_rng(1).normal(0, 0.03, days)))
    coin = {
        "timestamp": pa.array(times, stocks.schema.field("timestamp").type),
        "symbol": pa.array(["BTCUSD"] * days),
        "open": close * 0.999,
        "high": close * 1.01,
        "low": close * 0.98,
        "close": close,
        "volume": np.full(days, 5_000, np.int64),
        "sector": np.full(days, 99, np.int64),
    }
    return pa.concat_tables([stocks, pa.table(coin).cast(stocks.schema)])


def inspect(*overrides: str) -> tuple[int, str, dict]:
    code, out, err = run_script("inspect_data.py", *overrides)
    assert out.strip(), err
    return code, out, json.loads(out.strip().splitlines()[-1])


def test_every_problem_of_a_panel_in_one_run(tmp_path):
    table = panel_with_crypto()
    names = table["symbol"].to_pylist()
    first, second = sorted(set(names))[:2]
    close = table["close"].to_numpy(zero_copy_only=False).copy()
    close[names.index(first) + 50] = np.nan  # a NaN in one instrument
    sector = table["sector"].to_numpy().copy()
    sector[names.index(second) + 10] += 1  # a static that varies in another
    for name, values in (("close", close), ("sector", sector)):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    table = table.append_column("rating", pa.array(["buy"] * len(table)))  # not numeric
    path = tmp_path / "panel.parquet"
    pq.write_table(table, path)
    code, out, facts = inspect(
        *PANEL,
        f"data.path={path}",
        "data.static_features=[sector]",
        "data.extra_features=[rating]",
        "data.batch_size=0",  # and a config train.py refuses
    )
    assert code == 2
    problems = facts["problems"]
    assert len(problems) == 4, problems
    assert "data.batch_size must be positive" in problems[0]
    assert any("column 'rating' is string" in p for p in problems)
    assert any(f"NaN/inf values in instrument {first}" in p for p in problems)
    assert any(f"static feature 'sector' varies within instrument {second}" in p for p in problems)
    assert sum(line.startswith("problem: ") for line in out.splitlines()) == 4
    # the facts train.py's refusal would not show: listings, delistings, gaps, calendars
    every = facts["instruments"]
    assert every["count"] == 13 and every["listed_within"] and every["delisted_within"]
    assert max(e["largest_gap_days"] for e in every["each"].values()) > 5  # a halt
    assert facts["bars"]["kind"] == "daily" and facts["bars"]["weekend"] == ["BTCUSD"]


@pytest.mark.slow
def test_the_figures_are_what_train_py_uses(tmp_path):
    path = tmp_path / "panel.parquet"
    pq.write_table(panel_with_crypto(), path)
    data = (*PANEL, f"data.path={path}", "data.static_features=[sector]", *SMALL)
    code, out, facts = inspect(*data)
    assert code == 0, out
    assert facts["problems"] == [] and facts["futures"] is None
    assert facts["time"]["train_batch_ms"] > 0 and facts["memory"]["train_step_mb"] > 0
    run = tmp_path / "run"
    limits = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "report=false")
    code, _, err = run_script("train.py", *data, *limits, f"hydra.run.dir={run}")
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert facts["windows"] == summary["windows"]
    assert facts["features"]["count"] == summary["num_features"]
    assert facts["cuts"]["val_start"] == summary["splits"]["cuts"]["val_start"]
    assert facts["memory"]["parameters"] == summary["num_parameters"]


def test_a_file_without_its_columns_is_listed_not_raised(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"when": pa.array([1.5, 2.5]), "y": pa.array([1.0, 2.0])}), path)
    code, out, facts = inspect(f"data.path={Path(path)}")
    assert code == 2 and len(facts["problems"]) == 1
    assert "add data.time_column=NAME" in facts["problems"][0]
