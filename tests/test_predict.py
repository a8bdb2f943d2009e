"""Prediction: a tiny model trained once, then forecasts on a held-out tail of its data."""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from foxhunt_serve import POOLED, Cut
from foxhunt_serve.clock import Clock
from foxhunt_serve.windows import future_steps, known_inputs
from omegaconf import OmegaConf

import foxhunt
from foxhunt.app.predict.inference import training_data_config
from foxhunt.app.predict.predictor import _schema_data_config
from foxhunt.app.predict.windows import build_windows
from foxhunt.app.train.phases import train
from foxhunt.data.features import clock_of, derive_features
from foxhunt.data.horizon import Future, known_of
from foxhunt.data.schema import DataSchema
from foxhunt.errors import CheckpointError
from foxhunt.quantization.qat import export_int8, load_int8, prepare_qat, set_qat_phase
from foxhunt.training.checkpoint_io import calibration_of
from foxhunt.training.module import TFTModule, model_init
from tests.helpers import (
    FIVE_MIN,
    compose_train,
    make_table,
    run_script,
    session_times,
    tiny_overrides,
    write_table,
)

E, H = 16, 4  # tiny_overrides' window
TAIL = 30  # rows per instrument in the prediction file: 26 with a target, then H to forecast
QUANTILES = ["q0.1", "q0.5", "q0.9"]

SLOW = pytest.mark.slow  # a case the fast tier has a sibling of: the full tier (#70)


def _last_rows(symbols: np.ndarray, k: int) -> np.ndarray:
    """Mask of each instrument's last k rows (rows grouped by instrument, in time order)."""
    mask = np.zeros(len(symbols), dtype=bool)
    for s in np.unique(symbols):
        mask[np.flatnonzero(symbols == s)[-k:]] = True
    return mask


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One epoch on all but each instrument's last H rows; the prediction file is the last
    TAIL rows, with target and observed features of the last H emptied (the bars to forecast)."""
    root = tmp_path_factory.mktemp("predict")
    cols = make_table({"AAA": 300, "BBB": 200})
    train_path = write_table(
        root / "train.parquet",
        {k: v[~_last_rows(cols["symbol"], H)] for k, v in cols.items()},
    )
    cfg = compose_train(
        *tiny_overrides(train_path, "trainer.max_epochs=1"),
        *("trainer.limit_train_batches=3", "trainer.limit_val_batches=1"),
        *("trainer.limit_test_batches=1", "model.hidden_dim=16", "model.variable_dim=4"),
    )
    run = root / "run"
    summary = train(cfg, run)
    (run / ".hydra").mkdir()  # what train.py's Hydra run leaves beside the checkpoints
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    tail = {k: v[_last_rows(cols["symbol"], TAIL)] for k, v in cols.items()}
    future = _last_rows(tail["symbol"], H)
    for k in ("y", "f1", "f2"):
        tail[k] = np.where(future, np.nan, tail[k])
    return SimpleNamespace(
        ckpt=Path(summary["best_checkpoint"]),
        root=root,
        tail=tail,
        future=future,
        tail_path=write_table(root / "tail.parquet", tail),
    )


def _ns(table: pa.Table, column: str) -> np.ndarray:
    return pc.cast(table.column(column), pa.int64()).to_numpy()


def _assert_ordered(table: pa.Table) -> None:
    q = np.column_stack([table.column(c).to_numpy() for c in QUANTILES])
    assert (np.diff(q, axis=1) >= 0).all()


@pytest.mark.slow  # 5 CPU-s: the full tier
def test_latest_window_per_instrument_equals_a_hand_computation(trained):
    # the data config: the training run's; CQR's static offsets (not the run's aci, which
    # adapts them along the file's earlier windows: tests/test_export.py checks it)
    predictor = foxhunt.load(trained.ckpt, calibration="cqr")
    table = predictor.predict(trained.tail_path)  # batch size from the memory estimator
    assert predictor.batch_size_for(2) == 2  # the two windows fit at once
    assert 1 <= predictor.batch_size_for(100_000) <= 8192
    assert table.column_names == [
        "instrument",
        "origin_time",
        "horizon",
        "target_time",
        "target_time_continued",
        *QUANTILES,
        "actual",
        "target_transform",  # none: the quantiles forecast `actual` itself
    ]
    assert table.num_rows == 2 * H  # instruments x horizon, each row one quantile set
    assert table.column("instrument").to_pylist() == ["AAA"] * H + ["BBB"] * H
    assert table.column("horizon").to_pylist() == list(range(1, H + 1)) * 2
    assert table.column("actual").null_count == 2 * H  # the forecast bars are not realised
    _assert_ordered(table)

    tail, schema = trained.tail, predictor.schema
    module = TFTModule.load_from_checkpoint(trained.ckpt, map_location="cpu")
    calibration = calibration_of(torch.load(trained.ckpt, weights_only=True))
    assert calibration["method"] == "aci" and calibration["pairs"] == [[0, 2]]
    model = module.model.eval()
    for name in ("AAA", "BBB"):
        # the target on the instrument's own centre and scale; the scale's log a static input
        g = schema.groups.index(name)
        mean, std = np.asarray(schema.input_mean), np.asarray(schema.input_std)
        mean[0], std[0] = schema.target_centres[g], schema.target_scales[g]
        scale_input = np.log(std[0] / schema.target_scale)
        static = (scale_input - schema.static_mean[0]) / schema.static_std[0]
        rows = np.flatnonzero(tail["symbol"] == name)
        enc, dec = rows[-H - E : -H], rows[-H:]
        raw = np.column_stack([tail[c][enc] for c in ("y", "f1", "f2", "k1")])
        batch = {
            "encoder_cont": torch.tensor((raw - mean) / std, dtype=torch.float32)[None],
            "decoder_known": torch.tensor(
                (tail["k1"][dec] - mean[3]) / std[3], dtype=torch.float32
            )[None, :, None],
            "static_cat": torch.tensor([[g]]),
            "static_real": torch.tensor([[static]], dtype=torch.float32),
        }
        with torch.no_grad():
            out = model(batch)[0].numpy().astype(np.float64)
        # the run's CQR offsets (the instrument's own, or pooled) widen the 0.1-0.9 interval
        offsets = calibration["offsets"].get(name, calibration["offsets"]["*"])
        off = np.asarray(offsets)[:, 0]
        lower = np.minimum(out[:, 0] - off, out[:, 1])
        upper = np.maximum(out[:, 2] + off, out[:, 1])
        expected = np.column_stack([lower, out[:, 1], upper]) * std[0] + mean[0]  # centred too
        got = table.filter(np.asarray(table.column("instrument").to_pylist()) == name)
        values = np.column_stack([got.column(c).to_numpy() for c in QUANTILES])
        # the predictor runs both instruments in one batch, this each alone: float32 matmuls
        # round differently by batch size, ~1e-6 of the forecast's scale (an element near 0
        # would fail a tolerance relative to itself)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(values, expected, rtol=1e-5, atol=2e-6 * scale)
        assert _ns(got, "origin_time").tolist() == [tail["timestamp"][enc[-1]]] * H
        np.testing.assert_array_equal(_ns(got, "target_time"), tail["timestamp"][dec])

    # without the training run's config, one derived from the checkpoint's schema (plus the
    # group column, which the schema does not name)
    alone = shutil.copy(trained.ckpt, trained.root / "alone.ckpt")
    bare = foxhunt.load(alone, {"group_column": "symbol"}, batch_size=2, calibration="cqr")
    assert bare.predict(trained.tail_path).equals(table)


def test_all_windows_actuals_and_table_input(trained):
    predictor = foxhunt.load(trained.ckpt, batch_size=7)  # several batches
    table = predictor.predict(trained.tail_path, all_windows=True)
    observed = TAIL - H
    windows = 2 * (observed - E + 1)  # origins from the 16th row to the last with a target
    assert table.num_rows == windows * H
    _assert_ordered(table)
    tail = trained.tail
    rows = zip(table.column("instrument").to_pylist(), _ns(table, "target_time"), strict=True)
    for (name, t), actual in zip(rows, table.column("actual").to_pylist(), strict=True):
        at = np.flatnonzero((tail["symbol"] == name) & (tail["timestamp"] == t))[0]
        assert actual is None if trained.future[at] else actual == tail["y"][at]
    assert table.column("actual").null_count == 2 * (1 + 2 + 3 + 4)  # steps into the future
    from_table = predictor.predict(pq.read_table(trained.tail_path), all_windows=True)
    assert from_table.equals(table)


def test_aci_in_predict_adapts_to_realized_targets_known_at_each_origin(trained):
    """The run's method, aci: each instrument's windows in time order, the intervals moving with
    each realized target, and a forecast made before a target's time never sees it."""
    predictor = foxhunt.load(trained.ckpt, batch_size=64)
    assert predictor.calibration.method == "aci"
    adaptive = predictor.predict(trained.tail_path, all_windows=True)
    static = foxhunt.load(trained.ckpt, batch_size=64, calibration="cqr").predict(
        trained.tail_path, all_windows=True
    )
    _assert_ordered(adaptive)
    widths = [t["q0.9"].to_numpy() - t["q0.1"].to_numpy() for t in (adaptive, static)]
    assert not np.allclose(*widths)
    # the targets of the last 6 realized bars of AAA, changed: no forecast whose origin
    # precedes them moves (neither its inputs nor the intervals' adaptation held them)
    tail = dict(trained.tail)
    aaa = np.flatnonzero((tail["symbol"] == "AAA") & ~trained.future)[-6:]
    tail["y"] = tail["y"].copy()
    tail["y"][aaa] += 50.0
    changed = predictor.predict(write_table(trained.root / "changed.parquet", tail), True)
    before = (_ns(adaptive, "origin_time") < tail["timestamp"][aaa[0]]) | (
        np.asarray(adaptive["instrument"].to_pylist()) != "AAA"
    )
    assert 0 < before.sum() < len(before)
    for q in QUANTILES:
        got, want = changed[q].to_numpy(), adaptive[q].to_numpy()
        np.testing.assert_array_equal(got[before], want[before])
        assert not np.allclose(got[~before], want[~before])


def test_the_windows_aci_replays_are_those_after_its_state_at_most_a_cap():
    """After ACI's stored state, each name's latest window and those before it with a step
    the state has not counted (the state's time), at most `cap` before the latest; a name
    without a state of its own, those after the latest of the names' (POOLED's time: its
    windows before it replay nothing a start from the names' mean lacks); a file that starts
    after the state's time: `cap`."""
    e, h, n = 4, 3, 40
    time_ns = np.arange(n) * 10
    steps = np.arange(n, n + h) * 10  # the bars to forecast

    def first(replay):
        cut = Cut(e, h, False, replay)
        return cut.origins("A", time_ns, np.zeros(n), steps, np.ones(h, bool))[0]

    np.testing.assert_array_equal(first(({"A": 300}, 100)), np.arange(28, n))  # 28 + 3 > 30
    np.testing.assert_array_equal(first(({"A": 300}, 5)), np.arange(n - 6, n))  # the cap
    np.testing.assert_array_equal(first(({"B": 300}, 10)), np.arange(n - 11, n))  # no state
    pooled = {"B": 300, POOLED: 300}  # A without its own: the names' latest time
    np.testing.assert_array_equal(first((pooled, 100)), np.arange(28, n))
    np.testing.assert_array_equal(first((pooled | {POOLED: 10_000}, 100)), [n - 1])  # delisted
    np.testing.assert_array_equal(first(({"A": 10_000}, 100)), [n - 1])  # all counted
    np.testing.assert_array_equal(first(({"A": -5}, 100)), np.arange(e - 1, n))  # none yet
    np.testing.assert_array_equal(first(None), [n - 1])


def test_the_checkpoint_carries_aci_s_state_where_predict_resumes(trained):
    """The run's calibration holds each name's adapted miscoverage, the last target time it
    counted (the test period's end), the offsets of its windows pending then, and the pooled
    state; predict forecasts the windows after it alone, as a full replay would there."""
    predictor = foxhunt.load(trained.ckpt, batch_size=64)
    state = predictor.calibration.state
    test = pq.read_table(trained.root / "run" / "test_forecasts.parquet")
    tested = set(test["instrument"].to_pylist())  # one test batch: AAA's (BBB: the pooled)
    assert set(state) == tested | {POOLED} and tested
    for name in tested:
        rows = test.filter(pc.equal(test["instrument"], name))
        last = pc.max(rows["origin_time"].cast(pa.int64())).as_py()  # its last test window's
        assert max(state[name]["seen_ns"]) == last
        assert np.shape(state[name]["miscoverage"]) == (H, 1) and state[name]["pending"]
    forecast, sizes = predictor._forward, []

    def counted(ds, progress, held=None):  # the windows the model runs on
        sizes.append(len(ds) - (0 if held is None else int(held[0].sum())))
        return forecast(ds, progress, held)

    predictor._forward = counted
    resumed = predictor.predict(trained.tail_path)
    predictor.predict(trained.tail_path, all_windows=True)
    assert 2 <= sizes[0] < sizes[1]
    _assert_ordered(resumed)
    # the test windows pending at the state's time: their outputs held (the run forecast them),
    # as the model gives them again, within float32 rounding
    for name in tested:
        assert set(state[name]["bounds"]) == set(state[name]["pending"])
    for held in state.values():
        held.pop("bounds", None)
    again = predictor.predict(trained.tail_path)
    assert sizes[2] > sizes[0]
    for q in QUANTILES:
        np.testing.assert_allclose(again[q].to_numpy(), resumed[q].to_numpy(), rtol=1e-5)


def test_future_times_continue_at_the_bar_interval():
    """With only calendar known inputs (features=ohlcv), missing future rows are made up from
    the most common bar step (a session gap does not count), marked continued."""
    t = np.array([0, 5, 10, 100, 105, 110]) * 60 * 10**9  # a gap after the third bar
    cfg = OmegaConf.merge(compose_train().data, {"known_features": []})
    given = Future(t[-1:] + FIVE_MIN, {})
    # the sessions of the bars seen: an hour and a half tells nothing of the hours after it
    bars = future_steps("ES", t, given, 3, [], Clock.of({}))[0]
    times, from_data, user = future_steps("ES", t, given, 3, [])
    np.testing.assert_array_equal(times, t[-1] + FIVE_MIN * np.arange(1, 4))
    np.testing.assert_array_equal(bars, times)
    assert from_data.tolist() == [True, False, False] and user == {}
    ones = np.ones(3)
    calendar = derive_features(times, ones, ones, ones, ones, ones, clock=clock_of(cfg)).known
    known = known_inputs(times, user, *known_of(cfg), clock_of(cfg))
    np.testing.assert_array_equal(known, np.column_stack(list(calendar.values())))


# --- the steps after the data follow the exchange's sessions (data.calendar) ------------------

# a zone, one of its 2026 changes (a Sunday) and its cash session
SESSIONS = [
    ("America/New_York", "2026-03-08", ("09:30", "16:00")),
    ("America/New_York", "2026-11-01", ("09:30", "16:00")),
    ("America/Chicago", "2026-03-08", ("08:30", "15:00")),
    ("America/Chicago", "2026-11-01", ("08:30", "15:00")),
    ("Europe/London", "2026-03-29", ("08:00", "16:30")),
    ("Europe/London", "2026-10-25", ("08:00", "16:30")),
]


def _days(day: str, n: int) -> str:
    return (date.fromisoformat(day) + timedelta(days=n)).isoformat()


@pytest.mark.parametrize(("zone", "change", "hours"), SESSIONS)
def test_intraday_steps_after_the_data_continue_at_the_next_open(zone, change, hours):
    """5-minute bars of the cash session, Monday to Friday, to the Friday before a change: the
    steps after the data are Monday's first bars, after the change, as datetime and zoneinfo
    place them; cut at Friday noon, the bars of that afternoon, then Monday's."""
    history = session_times(zone, _days(change, -12), _days(change, -2), hours)
    bars = Clock.of({"time_zone": zone})
    times, from_data, _ = future_steps("SPX", history, None, 6, [], bars)
    monday = session_times(zone, _days(change, 1), _days(change, 1), hours)
    assert times.tolist() == monday[:6].tolist() and not from_data.any()
    noon = session_times(zone, _days(change, -2), _days(change, -2), (hours[0], "12:00"))
    cut = history[history <= noon[-1]]
    n = int((history > noon[-1]).sum()) + 3
    times, _, _ = future_steps("SPX", cut, None, n, [], bars)
    assert times.tolist() == [*history[history > noon[-1]].tolist(), *monday[:3].tolist()]


@pytest.mark.parametrize(("zone", "change", "hours"), SESSIONS)
def test_daily_steps_keep_the_local_close_and_skip_weekends_and_holidays(zone, change, hours):
    """Daily bars at the local close, Monday to Friday, to the Thursday before a change: the
    steps after the data are the next weekdays at the local close across the change (not an
    hour off), less a holiday given; `continuous` is the rule before data.calendar."""
    close = (hours[1], hours[1][:-1] + "1")  # one bar a day, at the close
    history = session_times(zone, _days(change, -40), _days(change, -3), close)
    want = session_times(zone, _days(change, -2), _days(change, 20), close)[:8]
    bars = Clock.of({"time_zone": zone})
    assert future_steps("SPX", history, None, 8, [], bars)[0].tolist() == want.tolist()
    holiday = Clock.of({"time_zone": zone, "holidays": [_days(change, 1)]})  # the Monday
    monday = want[1]  # Friday, then Monday
    got = future_steps("SPX", history, None, 7, [], holiday)[0]
    assert got.tolist() == [t for t in want.tolist() if t != monday]
    continuous = Clock.of({"time_zone": zone, "session": "continuous"})
    day = 86_400 * 10**9
    old = history[-1] + day * np.arange(1, 9)  # on Saturday and Sunday too, an hour off after
    for clock in (continuous, None):
        assert future_steps("SPX", history, None, 8, [], clock)[0].tolist() == old.tolist()


@pytest.mark.parametrize("zone", ["America/New_York", "Europe/London"])
@pytest.mark.parametrize("month", [3, 10])
def test_round_the_clock_bars_tick_through_a_change(zone, month):
    """Bars every 5 minutes around the clock, ten days to the night of a change: the steps
    after the data are every 5 minutes of UTC through it (the spring's skipped hour is never
    a bar, the autumn's repeated hour is two hours of bars)."""
    change = {(3, "America/New_York"): "2026-03-08", (10, "America/New_York"): "2026-11-01"}
    change |= {(3, "Europe/London"): "2026-03-29", (10, "Europe/London"): "2026-10-25"}
    end = np.datetime64(change[month, zone], "ns").astype(np.int64)
    history = end - FIVE_MIN * np.arange(10 * 288)[::-1]
    times, _, _ = future_steps("BTC", history, None, 400, [], Clock.of({"time_zone": zone}))
    assert times.tolist() == (history[-1] + FIVE_MIN * np.arange(1, 401)).tolist()


def test_known_inputs_after_the_data_are_on_the_data_calendar():
    """The known inputs on a New York clock: derive_features' calendar on it, not UTC's."""
    cfg = OmegaConf.merge(compose_train().data, {"known_features": []})
    cfg.calendar.time_zone = "America/New_York"
    times = session_times("America/New_York", "2026-03-06", "2026-03-09", ("15:50", "16:00"))
    ones = np.ones(len(times))
    clock = clock_of(cfg)
    want = derive_features(times, ones, ones, ones, ones, ones, clock=clock).known
    known = known_inputs(times, {}, *known_of(cfg), clock)
    np.testing.assert_array_equal(known, np.column_stack(list(want.values())))
    utc = derive_features(times, ones, ones, ones, ones, ones).known
    assert not np.allclose(known, np.column_stack(list(utc.values())))


def test_a_model_from_before_the_calendar_predicts_as_it_did(tmp_path):
    """A run config without data.calendar (a model trained before it): UTC, the close at
    20:00, every bar interval continued; with one, the run's own; without any config, as
    before it too."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    old = {"data": {"path": "bars.parquet", "features": "ohlcv", "group_column": "symbol"}}
    OmegaConf.save(OmegaConf.create(old), run / ".hydra" / "config.yaml")
    export = run / "checkpoints" / "model_fp32.safetensors"  # its run's config is read
    assert clock_of(training_data_config(export)) == Clock()
    old["data"]["calendar"] = {"time_zone": "America/Chicago", "close": "15:00"}
    OmegaConf.save(OmegaConf.create(old), run / ".hydra" / "config.yaml")
    chicago = clock_of(training_data_config(export))
    assert (chicago.time_zone, chicago.close_min, chicago.session) == (
        "America/Chicago",
        900,
        "bars",
    )
    calendar = ["tod_sin", "tod_cos", "dow_sin", "dow_cos", "to_cash_close"]
    schema = DataSchema(["logret_2"], calendar, [], [], "log_return", "return", 16, 4)
    assert clock_of(_schema_data_config(schema)) == Clock()


def _predict_tail(trained, tmp_path, out, *extra):
    """scripts/predict.py on the tail file, writing to predict.out=`out`."""
    return run_script(
        "predict.py",
        f"ckpt_path='{trained.ckpt}'",
        f"data.path={trained.tail_path}",
        f"predict.out={out}",
        *extra,
        f"hydra.run.dir={tmp_path / 'run'}",
    )


def test_cli_writes_predictions_and_previews(trained, tmp_path):
    out = tmp_path / "p.parquet"
    code, stdout, stderr = _predict_tail(trained, tmp_path, out)
    assert code == 0, stderr
    assert pq.read_table(out).num_rows == 2 * H
    assert stdout.splitlines()[0].split() == [
        "instrument",
        "origin_time",
        "horizon",
        "target_time",
        "target_time_continued",
        *QUANTILES,
        "actual",
        "target_transform",
    ]
    assert stdout.splitlines()[-1].endswith(f"to {out}")


@pytest.mark.slow  # 7 CPU-s: the full tier
def test_cli_output_never_overwrites_by_accident(trained, tmp_path):
    def predict(out, *extra):
        return _predict_tail(trained, tmp_path, out, *extra)

    folder = tmp_path / "folder"
    folder.mkdir()
    code, stdout, stderr = predict(folder)  # a directory gets the file inside it
    assert code == 0, stderr
    assert pq.read_table(folder / "predictions.parquet").num_rows == 2 * H
    before = trained.tail_path.read_bytes()
    for out, extra in ((trained.tail_path, ()), (trained.tail_path, ("predict.overwrite=true",))):
        code, _, stderr = predict(out, *extra)  # the input data: never, whatever overwrite says
        assert (
            code == 2
            and stderr.strip() == f"error: predict.out={out} is the input data; give another path"
        )
    assert trained.tail_path.read_bytes() == before
    mine = tmp_path / "mine.parquet"
    mine.write_bytes(b"keep")
    code, _, stderr = predict(mine)
    assert code == 2 and "exists; give another path, or predict.overwrite=true" in stderr
    assert mine.read_bytes() == b"keep"
    code, _, stderr = predict(mine, "predict.overwrite=true")
    assert code == 0, stderr
    assert pq.read_table(mine).num_rows == 2 * H


def test_the_float_export_forecasts_as_its_checkpoint(trained):
    export = trained.ckpt.parent / "model_fp32.safetensors"  # written by every fp32 run
    want = foxhunt.load(trained.ckpt, batch_size=64).predict(trained.tail_path, all_windows=True)
    got = foxhunt.load(export, batch_size=64).predict(trained.tail_path, all_windows=True)
    assert got.equals(want)


@pytest.mark.parametrize(
    ("change", "extra", "message"),
    [
        ("drop f2", [], "missing column(s) f2"),  # the others in the full tier (#70)
        pytest.param("add f3", ["data.features=all"], "extra in the data: f3", marks=SLOW),
        pytest.param(
            "keep 18 rows",
            [],
            "encoder of 16 rows, 2 of 2 instruments: AAA has 14 (of 14 in the data)",
            marks=SLOW,
        ),
        pytest.param("no future k1", [], "the forecast needs the known input(s) k1", marks=SLOW),
    ],
)
def test_cli_data_errors_are_one_line(trained, tmp_path, change, extra, message):
    cols = dict(trained.tail)
    if change == "drop f2":
        del cols["f2"]
    elif change == "add f3":
        cols["f3"] = np.ones(len(cols["y"]))
    elif change == "keep 18 rows":  # 14 with a target, then 4 to forecast
        keep = _last_rows(cols["symbol"], 18)  # every name short: nothing to forecast
        cols = {k: v[keep] for k, v in cols.items()}
    else:
        cols = {k: v[~trained.future] for k, v in cols.items()}
    path = write_table(tmp_path / "new.parquet", cols)
    code, _, stderr = run_script(
        "predict.py",
        f"ckpt_path='{trained.ckpt}'",
        f"data.path={path}",
        f"hydra.run.dir={tmp_path / 'run'}",
        *extra,
    )
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("error: ")
    assert message in stderr


def test_int8_export_predicts(trained):
    module = TFTModule.load_from_checkpoint(trained.ckpt, map_location="cpu")
    schema: DataSchema = module.schema
    predictor = foxhunt.load(trained.ckpt, batch_size=64)
    fp32 = predictor.predict(trained.tail_path, all_windows=True)
    cfg = predictor.data_cfg.copy()  # the int8 ranges are observed on these windows
    cfg.path = str(trained.tail_path)
    dataset = build_windows(pq.read_table(trained.tail_path), cfg, schema, True).dataset
    batch = dataset.__getitems__(list(range(len(dataset))))
    model = prepare_qat(module.model).eval()
    set_qat_phase(model, observe=True, fake_quant=True)
    with torch.no_grad():
        model(batch)
    set_qat_phase(model, observe=False, fake_quant=True)
    init = model_init(module.hparams.model, schema)
    path = trained.ckpt.parent / "model_int8.safetensors"  # beside the checkpoints: config found
    calibration = calibration_of(torch.load(trained.ckpt, weights_only=True))
    export_int8(model, init, path, schema=schema.to_dict(), calibration=calibration)
    int8 = foxhunt.load(path, batch_size=64).predict(trained.tail_path, all_windows=True)
    assert int8.num_rows == fp32.num_rows
    _assert_ordered(int8)
    a, b = (np.column_stack([t.column(c).to_numpy() for c in QUANTILES]) for t in (int8, fp32))
    assert np.abs(a - b).mean() < 0.05 * b.std()

    old = trained.root / "old_int8.safetensors"  # as made before exports carried the schema
    export_int8(model, init, old)
    load_int8(old)
    with pytest.raises(CheckpointError, match="exported without its data schema"):
        foxhunt.load(old)


@pytest.mark.slow  # a training of its own: the full tier (#70)
def test_a_changed_clock_is_refused_before_the_data_is_read(trained, tmp_path):
    """A model's clock (time zone, close) is part of it: predict and export refuse a
    data.calendar that moves it, in one line, before reading the data (a path that does not
    exist is not reached) or writing model.json; a data option's calendar gives way to it."""
    missing = tmp_path / "not_there.parquet"
    for tokyo in ("data.calendar.time_zone=Asia/Tokyo", "data.calendar.close=16:00"):
        for script, extra in (("predict.py", []), ("export.py", [f"export.out={tmp_path}/x"])):
            code, _, stderr = run_script(
                script,
                f"ckpt_path='{trained.ckpt}'",
                f"data.path={missing}",
                tokyo,
                *extra,
                f"hydra.run.dir={tmp_path / 'run'}",
            )
            assert code == 2 and stderr.count("\n") == 1, (script, stderr)
            assert stderr.startswith("error: data.calendar gives the clock "), stderr
            assert "but the model was trained on UTC (close 20:00)" in stderr
    assert not (tmp_path / "x" / "model.json").exists()
    option = OmegaConf.merge(training_data_config(trained.ckpt), {"calendar": {"close": "15:00"}})
    kept = foxhunt.load(trained.ckpt, data_defaults=option).data_cfg
    assert clock_of(kept) == clock_of(training_data_config(trained.ckpt))
    holidays = {"calendar": {"holidays": ["2027-01-01"]}}  # the steps after the data may change
    assert foxhunt.load(trained.ckpt, holidays).data_cfg.calendar.holidays == ["2027-01-01"]
