"""The exported model over the windows: the forecast table predict writes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from foxhunt_serve.calibration import apply, replay_plan, stored_outputs
from foxhunt_serve.errors import DataError
from foxhunt_serve.export import open_session, read_export
from foxhunt_serve.scaling import of_instruments
from foxhunt_serve.windows import FACTS, Facts, Windows, build_windows

# the output's column naming the data.target_transform the quantile columns are in: "none" (in
# the raw target's units, `actual`'s), xs_demean or xs_rank (in `actual_<transform>`'s)
TRANSFORM = "target_transform"
# windows per ONNX Runtime run: tft_small's [chunk, rows, 2 hidden] intermediates stay nearer
# the cache (3,790 windows of a 250-name panel: 2.76 s at 64, 2.9-3.1 s at 256; 2-core EPYC)
BATCH = 64


def actual_column(transform: str) -> str:
    """The column of the realised target the quantiles of a model trained under
    data.target_transform=`transform` forecast: `actual` (raw) for none, else
    `actual_<transform>` (`actual` holds the raw target beside it)."""
    return "actual" if transform == "none" else f"actual_{transform}"


def forecast(
    session: Any,
    meta: dict[str, Any],
    w: Windows,
    batch_size: int,
    resume: bool = False,
    memo: dict[bytes, np.ndarray] | None = None,
) -> np.ndarray:
    """The quantiles [windows, H, Q] in the target's units, calibrated (`resume`: ACI from its
    stored state; `memo`: `run_model`'s)."""
    held = None
    if resume:  # the windows whose outputs ACI's state holds: not run again
        shape = (len(w.starts), meta["prediction_length"], len(meta["quantiles"]))
        held = stored_outputs(meta["calibration"], w.instrument, w.origin_ns, shape)
    return calibrated(meta, w, run_model(session, meta, w, batch_size, memo, held), resume)


def calibrated(meta: dict[str, Any], w: Windows, out: np.ndarray, resume: bool) -> np.ndarray:
    """The model's quantiles `out` [windows, H, Q] (normalized) calibrated, in the target's
    units (`resume`: ACI from its stored state)."""
    centre, scale = of_instruments(meta["target"], meta["instruments"], w.instrument)
    actual = (w.target_actual - centre[:, None]) / scale[:, None]
    cal = meta["calibration"]
    values = apply(
        out, cal, meta["quantiles"], w.instrument, actual, w.origin_ns, w.target_ns, None, resume
    )
    return values * scale[:, None, None] + centre[:, None, None]


def run_model(
    session: Any,
    meta: dict[str, Any],
    w: Windows,
    batch_size: int,
    memo: dict[bytes, np.ndarray] | None = None,
    held: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """The model's quantiles [windows, H, Q], normalized, as ONNX Runtime gives them. `memo`:
    the outputs of the windows a call before forecast, by their inputs (`Forecaster`'s): only
    the others run, and it then holds this call's. `held`: the windows whose outputs are
    given (`stored_outputs`), not run (nor kept in `memo`)."""
    e, h = meta["encoder_length"], meta["prediction_length"]
    n_observed = len(meta["inputs"][0]["features"])
    names = {spec["name"] for spec in meta["inputs"]}
    out = np.empty((len(w.starts), h, len(meta["quantiles"])), np.float32)
    skip = np.zeros(len(w.starts), bool) if held is None else held[0]
    if memo is None:
        keys, todo = [], np.flatnonzero(~skip)
    else:
        keys = [_key(w, i, e, h, n_observed) for i in range(len(w.starts))]
        todo = np.array([i for i, k in enumerate(keys) if not skip[i] and k not in memo], np.int64)
    for start in range(0, len(todo), batch_size):
        at = todo[start : start + batch_size]
        s, g = w.starts[at], w.group[at]
        enc = w.rows[s[:, None] + np.arange(e)]
        feed = {"encoder_observed": enc[..., :n_observed]}
        if "encoder_known" in names:
            feed["encoder_known"] = enc[..., n_observed:]
            feed["decoder_known"] = w.rows[s[:, None] + np.arange(e, e + h)][..., n_observed:]
        if "static_real" in names:
            feed["static_real"] = w.static[g]
        if "instrument" in names:
            feed["instrument"] = w.embed[g]
        feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
        out[at] = session.run([meta["output"]["name"]], feed)[0]
    if held is not None:
        out[skip] = held[1][skip]
    if memo is not None:
        for i, k in enumerate(keys):
            if not skip[i] and k in memo:
                out[i] = memo[k]
        memo.clear()
        memo.update((k, out[i].copy()) for i, k in enumerate(keys) if not skip[i])
    return out


def _key(w: Windows, i: int, e: int, h: int, n_observed: int) -> bytes:
    """What the model reads of window `i`, hashed: its encoder's rows, its steps' known inputs,
    its statics and embedding row (a step's other columns: empty until its bar comes)."""
    s, g = w.starts[i], w.group[i]
    digest = hashlib.blake2b(w.rows[s : s + e].tobytes(), digest_size=16)
    digest.update(w.rows[s + e : s + e + h, n_observed:].tobytes())
    digest.update(w.static[g].tobytes() + w.embed[g : g + 1].tobytes())
    return digest.digest()


def times(ns: np.ndarray, time_type: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """Int64 nanoseconds as the input's time type (timestamps keep their time zone)."""
    mask = None if valid is None else ~valid
    if pa.types.is_timestamp(time_type):
        return pa.array(ns, pa.timestamp("ns", tz=time_type.tz), mask=mask)
    if pa.types.is_date(time_type):
        return pa.array(ns, pa.timestamp("ns"), mask=mask)
    return pa.array(ns, pa.int64(), mask=mask)


def output(
    w: Any, values: np.ndarray, columns: list[str], time_type: pa.DataType, transform: str
) -> pa.Table:
    """The forecast table: one row per window and step (instrument, origin_time, horizon,
    target_time, target_time_continued: true where the time was continued in the sessions
    rather than read from the data, one column per quantile, actual: the raw target realised;
    under data.target_transform=`transform` the model's own target realised in
    `actual_<transform>`; `target_transform`: the transform the quantiles are in), times in the
    input's time type; `w`: the windows' facts (`windows.FACTS`)."""
    n, h, _ = values.shape
    actuals = {"actual": w.actual.ravel()}
    if transform != "none":
        actuals[actual_column(transform)] = w.target_actual.ravel()
    return pa.table(
        {
            "instrument": pa.array(np.repeat(w.instrument, h), pa.string()),
            "origin_time": times(np.repeat(w.origin_ns, h), time_type),
            "horizon": pa.array(np.tile(np.arange(1, h + 1, dtype=np.int32), n)),
            "target_time": times(w.target_ns.ravel(), time_type),
            "target_time_continued": pa.array(~w.target_time_known.ravel()),
            **{c: pa.array(values[:, :, j].ravel()) for j, c in enumerate(columns)},
            **{k: pa.array(v, pa.float64(), mask=np.isnan(v)) for k, v in actuals.items()},
            TRANSFORM: pa.array([transform] * (n * h), pa.string()).dictionary_encode(),
        }
    )


class Forecaster:
    """An exported model with its ONNX Runtime session open: `predict` a table of bars once a
    bar in a live loop without paying the session's start each time (#68)."""

    def __init__(self, export_dir: Path, batch_size: int = BATCH, threads: int = 0) -> None:
        export_dir = Path(export_dir)
        self.meta, model = read_export(export_dir)  # both checked before any data is read
        self.session = open_session(model, self.meta, export_dir / "model.json", threads)
        self.batch_size = batch_size
        # the model's outputs of the last call's windows, by their inputs: a live loop's next
        # call runs the model on its new windows alone (ACI's replay reads the others again)
        self.memo: dict[bytes, np.ndarray] = {}

    def predict(self, data: pa.Table | Path | str, all_windows: bool = False) -> pa.Table:
        """The forecasts for the bars in `data` (a table, or a Parquet file's path), as
        predict.py's table: each instrument's latest window, or every window."""
        meta, source = self.meta, "the table"
        if not isinstance(data, pa.Table):
            source = str(data)
            try:
                data = pq.read_table(data)
            except (OSError, pa.ArrowInvalid) as exc:
                raise DataError(f"cannot read {source}: {' '.join(str(exc).split())}") from None
        todo = Todo.of(meta["calibration"], all_windows)
        windows = build_windows(data, meta, todo.every, source, replay=todo.replay)
        resume = todo.replay is not None
        values = forecast(self.session, meta, windows, self.batch_size, resume, self.memo)
        if todo.latest:
            at = latest_of(windows.instrument)
            windows, values = facts_at(windows, at), values[at]
        time_type = data.schema.field(meta["data"]["time_column"]).type
        transform = meta["data"].get("target_transform", "none")  # (model.json before it: none)
        return output(windows, values, meta["output"]["columns"], time_type, transform)


def predict(
    export_dir: Path,
    data: Path,
    all_windows: bool = False,
    batch_size: int = BATCH,
    threads: int = 0,
) -> pa.Table:
    """The forecasts of the exported model for the bars in `data`, as predict.py's table."""
    return Forecaster(export_dir, batch_size, threads).predict(data, all_windows)


@dataclass(frozen=True)
class Todo:
    """The windows predict forecasts for each name's latest forecast, under a calibration:
    `every` window, or those ACI `replay`s after its stored state (`replay_plan`), and whether
    only each name's `latest` is kept of them. foxhunt's predict and the consumer both ask here."""

    every: bool
    replay: tuple[dict[str, int], int] | None
    latest: bool

    @classmethod
    def of(cls, cal: dict[str, Any] | None, all_windows: bool) -> Todo:
        # aci adapts to the realized targets of a name's past windows: forecast them too, those
        # after its stored state (every one for a model.json or checkpoint without it)
        adapts = (cal or {}).get("method") == "aci" and not all_windows
        plan = replay_plan(cal) if adapts else None
        return cls(all_windows or (adapts and plan is None), plan, adapts)


def latest_of(instrument: np.ndarray) -> np.ndarray:
    """The index of each name's latest window, of windows in order by name, then time."""
    return np.flatnonzero(np.r_[instrument[1:] != instrument[:-1], True])


def facts_at(w: Facts, at: np.ndarray) -> Facts:
    """The facts of the windows `at` (indices) of `w`."""
    return Facts(**{k: getattr(w, k)[at] for k in FACTS})
