"""The model's forecasts of every test window, made once after the test: the baselines score
them beside their own (`baselines.score`), per instrument and pooled, and every run writes them
to `test_forecasts.parquet` (a walk-forward backtest pools its folds' files).

As predict's and the consumer's (`foxhunt_serve.output`): `actual` is the raw target realised;
under data.target_transform (xs_demean, xs_rank) the quantiles forecast the model's own
target, realised in `actual_<transform>` (`target_column`), and `target_transform` names it.
Losses and calibration read the model's target; the strategy and the book trade `actual`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from foxhunt_serve import TRANSFORM, actual_column

from foxhunt.data.schema import DataSchema
from foxhunt.data.windows import WindowDataset

FORECASTS = "test_forecasts.parquet"
RAW_PREFIX = "raw_"  # the model's own quantiles before calibration: raw_q0.1, ...


def quantile_column(q: float) -> str:
    """The output column of quantile `q`: 0.1 -> "q0.1"."""
    return f"q{q:g}"


def quantile_levels(table: pa.Table) -> list[float]:
    """The levels of a forecast table's quantile columns (`q<level>`), ascending."""
    levels = []
    for name in table.column_names:
        if not name.startswith("q"):
            continue
        try:
            levels.append(float(name[1:]))
        except ValueError:  # another column that starts with q
            continue
    return sorted(levels)


def transform_of(table: pa.Table) -> str:
    """The data.target_transform a forecast table's quantiles are in (none: a table written
    before its column, or of no rows)."""
    if TRANSFORM not in table.column_names or table.num_rows == 0:
        return "none"
    return str(table[TRANSFORM][0].as_py())


def target_column(table: pa.Table) -> str:
    """The column of the realised target a forecast table's quantiles forecast: `actual`, or
    `actual_<transform>` under a data.target_transform."""
    return actual_column(transform_of(table))


@dataclass
class WindowFacts:
    """What each window of a dataset is, beside its forecast: its instrument, origin and
    target times, and the realized targets (normalized, as the model forecasts them)."""

    instrument: np.ndarray  # [n] names (object; None for one unnamed series)
    origin_ns: np.ndarray  # [n] int64: the time of the last encoder row
    target_ns: np.ndarray  # [n, H] int64
    actual: np.ndarray  # [n, H] float64, normalized: the model's target
    # [n, H] float64 in the target's units: the target before data.target_transform (None: the
    # target is raw)
    raw: np.ndarray | None = None


def window_facts(dataset: WindowDataset, schema: DataSchema) -> WindowFacts:
    start = dataset.starts
    dec = start[:, None] + dataset.dec_offsets
    names = dataset.series.names if schema.groups else [None]
    raw = dataset.raw_target
    return WindowFacts(
        instrument=np.array([names[g] for g in dataset.group[start].tolist()], dtype=object),
        origin_ns=dataset.time_ns[start + schema.encoder_length - 1].numpy(),
        target_ns=dataset.time_ns[dec].numpy(),
        actual=dataset.target[dec].double().numpy(),
        raw=None if raw is None else np.asarray(raw, np.float64)[dec.numpy()],
    )


def forecast_table(
    dataset: WindowDataset,
    schema: DataSchema,
    pred: np.ndarray,
    quantiles: list[float],
    baseline: tuple[str, np.ndarray] | None = None,
    raw: np.ndarray | None = None,
) -> pa.Table:
    """`pred` [windows, H, Q] (normalized) in the target's own units: one row per (instrument,
    origin, horizon step) with the actual value (raw; the model's target beside it under a
    transform, see module), the naive forecast (zero return or last value: what directional
    accuracy measures moves from) and the target's scale (to normalize losses as test_loss is).
    `pred` is the forecast delivered (calibrated); `raw`, the model's own before calibration,
    as columns `raw_q<level>`. `baseline`: (name, its forecasts like `pred`): the strongest
    baseline's, as columns `baseline` and `baseline_q<level>` (its strategy runs beside)."""
    n, h = len(dataset), schema.prediction_length
    start = dataset.starts
    # each window's instrument's (foxhunt_serve.scaling), [n, 1] against its steps
    series = dataset.window_series()
    center, scale = dataset.series.centre[series, None], dataset.series.scale[series, None]
    facts = window_facts(dataset, schema)
    target = facts.actual * scale + center  # the model's own, which the quantiles forecast
    transform = schema.target_transform
    actuals = {"actual": target}
    if transform != "none":
        if facts.raw is None:
            raise ValueError(f"windows of a {transform} target without the raw target")
        actuals = {"actual": facts.raw, actual_column(transform): target}
    if schema.target_kind == "return":
        naive = np.zeros_like(target)
    else:
        last = dataset.target[start + schema.encoder_length - 1].double().numpy()
        naive = np.repeat(last[:, None] * scale + center, h, 1)
    utc = pa.timestamp("ns", tz="UTC")

    def columns(prefix: str, forecasts: np.ndarray) -> dict[str, np.ndarray]:
        """Normalized forecasts [n, H, Q] in the target's units, a column per quantile."""
        values = forecasts.astype(np.float64) * scale[..., None] + center[..., None]
        return {
            prefix + quantile_column(q): values[:, :, j].ravel() for j, q in enumerate(quantiles)
        }

    theirs = {} if raw is None else columns(RAW_PREFIX, raw)
    if baseline is not None:
        theirs["baseline"] = pa.array([baseline[0]] * (n * h), pa.string()).dictionary_encode()
        theirs |= columns("baseline_", baseline[1])
    return pa.table(
        {
            "instrument": pa.array(np.repeat(facts.instrument, h), pa.string()),
            "origin_time": pa.array(np.repeat(facts.origin_ns, h), utc),
            "horizon": pa.array(np.tile(np.arange(1, h + 1, dtype=np.int32), n)),
            "target_time": pa.array(facts.target_ns.ravel(), utc),
            **columns("", pred),
            **{k: v.ravel() for k, v in actuals.items()},
            "naive": naive.ravel(),
            "target_scale": np.repeat(scale[:, 0], h),
            TRANSFORM: pa.array([transform] * (n * h), pa.string()).dictionary_encode(),
            **theirs,
        }
    )
