"""A user's panel at scale: 250 daily stocks (staggered listings, delistings, halts, a sector
static) trained, tested, judged beside every baseline and reported, with the report compact."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from foxhunt.data.samples import stock_panel_table
from tests.helpers import SMALL_MODEL, run_script

INSTRUMENTS = 250


@pytest.mark.slow  # 60 CPU-s: the full tier
def test_a_250_instrument_panel_end_to_end(tmp_path):
    path = tmp_path / "panel.parquet"
    pq.write_table(stock_panel_table(INSTRUMENTS, days=320, seed=5), path)
    run = tmp_path / "run"
    code, _, err = run_script(
        "train.py",
        "data=parquet",
        f"data.path={path}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.static_features=[sector]",
        *SMALL_MODEL,
        "memory.val_batch_size=1024",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run}",
    )
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    scored = summary["evaluation"]["by_instrument"]
    assert len(scored) > 200  # every instrument with test windows, in the summary
    ran = {n for n, b in summary["baselines"].items() if b.get("test_loss") is not None}
    assert {"unconditional", "volatility_scaled", "linear", "lightgbm"} <= ran
    report = (run / "report.md").read_text()
    assert len(report.splitlines()) < 400, len(report.splitlines())
    named = [name for name in scored if f"| {name} |" in report]
    assert 0 < len(named) <= 20, named  # the best and worst 10, not 250 rows
    assert "Cross-sectional IC" in report.split("## ")[1]  # the headline for a panel
    # the panel's cross-sectional book: traded a bar late, costed, beside the best baseline's
    book = summary["book"]
    assert book["names"] > 200 and book["execution_lag"] == 1 and book["horizon"] == 2
    assert book["cost_bps"] == summary["strategy"]["cost_bps"]  # one cost for both
    assert {"model", "best_baseline", "market"} <= set(book) and len(book["deciles"]) == 10
    assert book["model"]["dates"] > 10 and book["model"]["turnover"] > 0
    assert "## Cross-sectional book" in report and (run / "book.png").is_file()
