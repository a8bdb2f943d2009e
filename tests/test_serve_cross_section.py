"""The cross-section at serve time (`foxhunt_serve.cross_section.complete_rows`): predict and
the consumer forecast a model trained across names from the file's last complete time, and
warn once when a time holds too few of the names the model was trained among. A model trained
without a cross-section serves any subset of names as given."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from foxhunt_serve import recent_rows, replay_plan
from foxhunt_serve import windows as serve_windows
from foxhunt_serve.cross_section import (
    CONTEXT,
    MIN_SHARE,
    STOP_SHARE,
    complete_rows,
    last_complete,
)
from foxhunt_serve.read import iso_time
from foxhunt_serve.windows import check_history

import foxhunt
import foxhunt.app.predict.windows as app_windows
from foxhunt.data.samples import stock_panel_table
from tests.helpers import (
    PREDICT_BATCH,
    TINY_MODEL,
    make_table,
    run_cli,
    run_script,
    walked_from_the_run_s_start,
)

TIMES, NAMES, H = 30, 40, 4
QUANTILES = ("q0.1", "q0.5", "q0.9")
LATE = "hold the bars of some names only"  # the warning of a file whose last times are partial
FEW = "names the model was trained among"  # the warning of a time short of the trained names


def _grid(names: int = NAMES, times: int = TIMES) -> tuple[np.ndarray, np.ndarray]:
    """Every name at every time: (time index, name index) per row."""
    return np.tile(np.arange(times), names), np.repeat(np.arange(names), times)


def test_the_last_complete_time_waits_for_late_bars_not_for_listings_halts_or_delistings():
    at, name = _grid()
    listed_late = (name >= 30) & (at < 10)  # a quarter of the names listed a third in
    halted = (name == 3) & (at >= 20) & (at < 29)  # one halted for the last days but one
    delisted = (name == 4) & (at > 27)  # one delisted the day before the last
    keep = ~(listed_late | halted | delisted)
    at, name = at[keep], name[keep]
    assert last_complete(at, name, H) == TIMES - 1  # nothing missing: the last time
    # a live file: the last day's bars of 5 names have arrived
    arrived = (at < TIMES - 1) | (name < 5)
    assert last_complete(at[arrived], name[arrived], H) == TIMES - 2
    # two names' bars ran two days ahead of the others'
    ahead = (at < TIMES - 2) | (name < 2)
    assert last_complete(at[ahead], name[ahead], H) == TIMES - 3
    # a quarter of the names delisted at once: long ago, they are gone; in the last H days,
    # whether they are late or gone cannot be told yet, and the forecast waits for them
    for stop, want in ((10, TIMES - 1), (TIMES - 3, TIMES - 3)):
        gone = (name >= 10) & (name < 20) & (at > stop)
        assert last_complete(at[~gone], name[~gone], H) == want
    # fewer than ten names: one that stops in the last H days is a tenth and more of them
    at, name = _grid(names=5)
    stopped = (name == 0) & (at > TIMES - 3)
    assert last_complete(at[~stopped], name[~stopped], H) == TIMES - 3
    assert STOP_SHARE * NAMES >= 1 > STOP_SHARE * 5


def _data(transform: str = "xs_demean") -> dict:
    """A model.json data section of a `make_table` file."""
    return {
        "time_column": "timestamp",
        "time_unit": None,
        "group_column": "symbol",
        "target_column": "y",
        "ohlcv": None,
        "futures": None,
        "calendar": None,
        "known_columns": ["k1"],
        "cross_section": "none",
        "target_transform": transform,
    }


def _table(names: list[str], days: int, first: dict[str, int] | None = None) -> pa.Table:
    """A daily bar of each of `names` (from its day in `first`, else the first)."""
    cols = make_table(dict.fromkeys(names, days))
    day = np.tile(np.arange(days), len(names))
    keep = day >= np.array([(first or {}).get(str(n), 0) for n in cols["symbol"]])
    table = pa.table({k: v[keep] for k, v in cols.items()})
    start = np.datetime64("2021-11-01", "ns").astype(np.int64)
    stamps = pa.array(start + day[keep] * 86_400 * 10**9, pa.timestamp("ns", tz="UTC"))
    return table.set_column(0, "timestamp", stamps)


def _said(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if what in r.getMessage()]


def test_a_file_of_30_of_the_250_trained_names_warns_once(caplog):
    vocabulary = [f"N{i:03d}" for i in range(250)]
    days = 20
    table = _table(vocabulary[:30], days)
    observed, future = complete_rows(table, _data(), vocabulary, H)
    assert observed.equals(table) and future == {}  # every time complete: read as given
    last = iso_time(pc.max(table["timestamp"]).cast(pa.int64()).as_py())
    assert _said(caplog, FEW) == [
        f"30 of the 250 {FEW} at {last} (fewer than {round(MIN_SHARE * 100)}%; {days - 1} "
        "earlier time(s) of the file too): the model compares each name with the others at "
        "each time, so its target history and cross-sectional inputs there are measured among "
        "these names only; give it the panel it was trained on"
    ]
    caplog.clear()
    # the whole panel, half of it listed on the tenth day: each time holds every name then
    complete_rows(
        _table(vocabulary, days, dict.fromkeys(vocabulary[125:], 10)), _data(), vocabulary, H
    )
    # a model trained without a cross-section takes any names as given
    complete_rows(table, _data("none"), vocabulary, H)
    assert caplog.records == []


@pytest.fixture(scope="module")
def neutral(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A tiny model trained on a 40-name panel (staggered listings, halts, delistings) with
    ranked inputs, the market's context and a market-neutral target, and its ONNX export."""
    tmp = tmp_path_factory.mktemp("served")
    panel = stock_panel_table(NAMES, days=300, seed=3)
    pq.write_table(panel, tmp / "panel.parquet")
    common = [f"hydra.run.dir={tmp / 'run'}"]
    done = run_cli(
        "data=parquet",
        f"data.path={tmp / 'panel.parquet'}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.cross_section=rank",
        "data.target_transform=xs_demean",
        "data.market_context=true",
        "data.encoder_length=16",
        f"data.prediction_length={H}",
        *TINY_MODEL,
        "trainer.max_epochs=1",
        "report=false",
        *common,
        cwd=tmp,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = next((tmp / "run" / "checkpoints").glob("best-*.ckpt"))
    code, _, err = run_script(
        "export.py",
        f"ckpt_path={ckpt}",
        f"export.out={tmp / 'onnx'}",
        f"hydra.run.dir={tmp / 'export_run'}",
    )
    assert code == 0, err[-3000:]
    return SimpleNamespace(tmp=tmp, panel=panel, ckpt=ckpt, onnx=tmp / "onnx")


def _serve(neutral: SimpleNamespace, table: pa.Table, name: str) -> tuple[pa.Table, pa.Table]:
    """The forecasts of `foxhunt predict` and of the consumer for `table`."""
    from foxhunt_serve import cli

    path = neutral.tmp / f"{name}.parquet"
    pq.write_table(table, path)
    predicted = foxhunt.load(neutral.ckpt, batch_size=PREDICT_BATCH).predict(path)
    out = neutral.tmp / f"{name}.served.parquet"
    assert cli.main([str(neutral.onnx), str(path), str(out), "--overwrite"]) == 0
    return predicted, pq.read_table(out)


def _times(table: pa.Table) -> np.ndarray:
    return table["timestamp"].cast(pa.int64()).to_numpy()


@pytest.mark.slow  # trains and exports a 40-name model (about 40 CPU-s): the full tier
def test_a_last_time_of_some_names_is_forecast_from_the_time_before(neutral, caplog):
    pytest.importorskip("onnxruntime")
    caplog.set_level(logging.WARNING)
    t, symbols = _times(neutral.panel), neutral.panel["symbol"].to_numpy()
    last = t == t.max()
    arrived = np.isin(symbols, symbols[last][:5])
    partial = neutral.panel.filter(pa.array(~last | arrived))  # 5 names' last bars arrived
    whole = neutral.panel.filter(pa.array(~last))  # the file a day before
    got, want = _serve(neutral, partial, "partial"), _serve(neutral, whole, "whole")
    for g, w in zip(got, want, strict=True):  # predict's and the consumer's
        assert g.num_rows == w.num_rows > 0
        assert pc.max(g["origin_time"].cast(pa.int64())).as_py() == t[~last].max()
        for column in ("instrument", "origin_time", "horizon", "target_time", *QUANTILES):
            assert g[column].equals(w[column]), column
    said = _said(caplog, LATE)
    assert len(said) == 2  # once by each
    assert said[0].startswith(f"the file's last 1 time(s), to {iso_time(int(t.max()))}, {LATE}")


@pytest.mark.slow  # trains and exports a 40-name model (about 40 CPU-s): the full tier
def test_a_file_of_a_few_trained_names_warns_once_in_predict_and_the_consumer(neutral, caplog):
    pytest.importorskip("onnxruntime")
    caplog.set_level(logging.WARNING)
    t = _times(neutral.panel)
    symbols = neutral.panel["symbol"].to_numpy()
    few = np.unique(symbols[t == t.max()])[:12]
    _serve(neutral, neutral.panel.filter(pa.array(np.isin(symbols, few))), "few")
    want = f"12 of the {NAMES} {FEW} at {iso_time(int(t.max()))} (fewer than 50%"
    said = _said(caplog, FEW)
    assert len(said) == 2 and all(s.startswith(want) for s in said)  # once by each
    assert _said(caplog, LATE) == []


@pytest.mark.slow  # trains and exports a 40-name model (about 40 CPU-s): the full tier
def test_the_latest_forecasts_read_only_the_rows_they_need(neutral, monkeypatch):
    """#68: predict's and the consumer's latest forecasts from the rows `recent_rows` keeps (the
    windows after ACI's stored state, their encoders and warm-up, every name at those times)
    are theirs from the whole file, to float32 rounding; predict's are the consumer's."""
    pytest.importorskip("onnxruntime")
    meta = json.loads((neutral.onnx / "model.json").read_text())
    assert {meta["features"][c]["source"] for c in CONTEXT} == {"context"}  # made, not read
    plan = replay_plan(meta["calibration"])
    e, h = meta["encoder_length"], meta["prediction_length"]
    assert recent_rows(neutral.panel, meta["data"], e, h, plan).num_rows < neutral.panel.num_rows
    got = _serve(neutral, neutral.panel, "recent")
    for module in (serve_windows, app_windows):
        monkeypatch.setattr(module, "recent_rows", lambda table, *args: table)
    want = _serve(neutral, neutral.panel, "whole")
    for g, w in (*zip(got, want, strict=True), got):  # each way alike; predict as the consumer
        for column in ("instrument", "origin_time", "horizon", "target_time"):
            assert g[column].equals(w[column]), column
        a, b = (np.column_stack([t[q].to_numpy() for q in QUANTILES]) for t in (g, w))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


@pytest.mark.slow  # trains and exports a 40-name model (about 40 CPU-s): the full tier
def test_the_file_trained_on_is_served_by_running_each_name_s_latest_window_alone(neutral):
    """#68: ACI's state holds the model's outputs of the test windows pending at its time and
    of the windows after the test split (`foxhunt.app.train.after_test`): the consumer serving the
    file the run trained on runs the model on one window a name."""
    pytest.importorskip("onnxruntime")
    from foxhunt_serve import forecast

    served, ran = forecast.Forecaster(neutral.onnx), []
    session = served.session

    def run(names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        ran.append(len(feed["encoder_observed"]))
        return session.run(names, feed)

    served.session = SimpleNamespace(run=run)
    got = served.predict(neutral.panel)
    assert sum(ran) == len(set(got["instrument"].to_pylist())) > 0


@pytest.mark.slow  # trains and exports a 40-name model (about 40 CPU-s): the full tier
def test_the_latest_forecasts_from_the_state_are_aci_walked_from_where_the_run_began(neutral):
    """#68's parity on a panel (tests.helpers.walked_from_the_run_s_start): the names with a
    state of their own; those delisted before the test split start from POOLED's."""
    path = neutral.tmp / "parity.parquet"
    pq.write_table(neutral.panel, path)
    got, want = walked_from_the_run_s_start(neutral.ckpt, path, neutral.tmp / "run")
    assert 0 < got.num_rows < NAMES * H


def test_a_model_trained_without_a_cross_section_serves_a_partial_last_time_as_given(
    tiny_run, caplog
):
    caplog.set_level(logging.WARNING)
    cols = make_table({"AAA": 60, "BBB": 60})  # the same times for both
    future = np.tile(np.arange(60) >= 60 - H, 2)
    late = (cols["symbol"] == "BBB") & (np.arange(120) == 60 + 60 - H - 1)  # BBB's last bar
    for k in ("y", "f1", "f2"):
        cols[k] = np.where(future | late, np.nan, cols[k])
    stamps = pa.array(cols["timestamp"], pa.timestamp("ns", tz="UTC"))
    predictor = foxhunt.load(tiny_run.ckpt, batch_size=PREDICT_BATCH)
    got = predictor.predict(pa.table(cols).set_column(0, "timestamp", stamps))
    origins = got["origin_time"].cast(pa.int64()).to_pylist()
    origin = dict(zip(got["instrument"].to_pylist(), origins, strict=True))
    times = cols["timestamp"][:60]
    assert origin == {"AAA": times[60 - H - 1], "BBB": times[60 - H - 2]}
    assert _said(caplog, LATE) == [] and _said(caplog, FEW) == []


def test_many_short_names_are_one_short_line(caplog):
    """28 of 30 names listed days ago: one warning that counts them and names the first few, not
    a line naming all 28 (#68)."""
    names = [f"N{i:02d}" for i in range(30)]
    usable = {n: (100 if i < 2 else 3) for i, n in enumerate(names)}
    rows = pa.table({"symbol": [n for n in names for _ in range(usable[n])]})
    data = {"group_column": "symbol", "futures": None}
    with caplog.at_level("WARNING"):
        short = check_history(usable, names, rows, data, needed=20)
    assert short == set(names[2:])
    (line,) = [r.getMessage() for r in caplog.records]
    assert "28 of 30 instruments" in line and "N02 has 3 (of 3 in the data)" in line
    assert "and 23 more" in line and "N29" not in line and len(line) < 400
