"""foxhunt-serve: forecasts from a foxhunt ONNX export with numpy, pyarrow and onnxruntime.

`foxhunt export ckpt_path=...` writes EXPORT_DIR: model.onnx and model.json. model.json carries
everything else (column names, features and their derivation, the normalization, the futures
roll, the calibration). `foxhunt-serve EXPORT_DIR DATA.parquet OUT.parquet` writes the table
`foxhunt predict` writes for the same data: one row per instrument, origin and horizon step,
with `instrument`, `origin_time`, `horizon`, `target_time`, one column per quantile in the
target's own units, `actual` (the raw target realised), and `target_transform`, the model's
data.target_transform the quantiles are in: under xs_demean or xs_rank they forecast the
target less the names' mean (or its rank) at each time, realised in `actual_<transform>`.
In a live loop, `Forecaster(EXPORT_DIR)` opens ONNX Runtime once and `.predict(table)` gives
the same table for each new table of bars.

The steps, one module each:

1. `read`: the columns as numpy arrays; each instrument's rows after its last target value are
   the bars to forecast (`split_future`); for a model that compares names at each time, so
   are the bars after the last complete time (`cross_section.complete_rows`);
2. `futures` (futures only): each root's held contracts over time, the roll schedule, as one
   back-adjusted series;
3. `series` and `features`: per instrument, the NaN policy, the features (columns, or derived
   from the OHLCV bars and the time), the warm-up rows dropped; then `cross_section`: across
   the instruments at each time, the model's ranked inputs and its target less their mean;
4. `windows`: the encoder rows and the forecast steps' known inputs (given in the rows to
   forecast, or the calendar of times continued at the bar interval in the instrument's
   sessions: `clock`, which also gives the local time the calendar is read in), normalized;
5. `forecast`: ONNX Runtime over batches; `calibration`: model.json's conformal offsets (CQR,
   or ACI adapting them to the realized targets in the data), the quantiles put in order;
   then scaled back.

Bad input is one `InputError` line; the command prints it as `error: ...` and exits 2.
"""

# The public API: what foxhunt, which trains the models this package serves, takes from it
# (tests/test_imports.py holds foxhunt to it), by step. Everything else here is internal.
from foxhunt_serve.calibration import POOLED, in_order, replay_plan, stored_outputs
from foxhunt_serve.calibration import adapted as adapted_state
from foxhunt_serve.calibration import apply as calibrate
from foxhunt_serve.clock import Clock, Sessions, changes, learn_open
from foxhunt_serve.cross_section import (
    CONTEXT,
    PANEL_NAMES,
    by_date,
    complete_rows,
    name_of,
    panel,
)
from foxhunt_serve.errors import DataError, InputError, WriteError
from foxhunt_serve.features import CALENDAR, FAMILIES, Ohlcv, calendar, warmup
from foxhunt_serve.files import TMP_SUFFIX, atomic_file, write_atomic
from foxhunt_serve.forecast import (
    TRANSFORM,
    Forecaster,
    Todo,
    actual_column,
    facts_at,
    latest_of,
    output,
)
from foxhunt_serve.futures import (
    ADJUSTMENTS,
    EXPIRED_NS,
    MONTH_CODES,
    PRICES,
    ROOT_PATTERN,
    RULES,
    Continuous,
    Contract,
    Roll,
    continuous,
    parse_contract,
    roll_schedule,
    stitch,
    third_friday,
)
from foxhunt_serve.normalize import as_float32, check_normalized, normalize_rows
from foxhunt_serve.read import TIME_UNITS, Future, as_float, as_text, group_codes, split_future
from foxhunt_serve.read import time_ns as read_time_ns
from foxhunt_serve.recent import recent_rows
from foxhunt_serve.scaling import (
    SCALE_INPUT,
    instrument_scales,
    lookup,
    moments,
    pooled_scale,
    scale_input,
    scale_static,
)
from foxhunt_serve.series import Series, checked_rows, iso_time, make_series
from foxhunt_serve.windows import (
    Cut,
    Facts,
    bar_interval,
    check_history,
    future_steps,
    known_inputs,
    series_rows,
)

__all__ = [
    "ADJUSTMENTS",
    "CALENDAR",
    "CONTEXT",
    "Clock",
    "Continuous",
    "Contract",
    "Cut",
    "DataError",
    "EXPIRED_NS",
    "FAMILIES",
    "Facts",
    "Future",
    "InputError",
    "MONTH_CODES",
    "Ohlcv",
    "PANEL_NAMES",
    "POOLED",
    "PRICES",
    "ROOT_PATTERN",
    "RULES",
    "Roll",
    "SCALE_INPUT",
    "Series",
    "Sessions",
    "TIME_UNITS",
    "TMP_SUFFIX",
    "TRANSFORM",
    "WriteError",
    "actual_column",
    "as_float",
    "as_float32",
    "as_text",
    "atomic_file",
    "bar_interval",
    "by_date",
    "calendar",
    "adapted_state",
    "calibrate",
    "replay_plan",
    "stored_outputs",
    "changes",
    "check_history",
    "check_normalized",
    "checked_rows",
    "complete_rows",
    "continuous",
    "future_steps",
    "group_codes",
    "in_order",
    "instrument_scales",
    "iso_time",
    "known_inputs",
    "learn_open",
    "lookup",
    "make_series",
    "moments",
    "name_of",
    "normalize_rows",
    "output",
    "Forecaster",
    "Todo",
    "facts_at",
    "latest_of",
    "panel",
    "parse_contract",
    "pooled_scale",
    "read_time_ns",
    "recent_rows",
    "roll_schedule",
    "scale_input",
    "scale_static",
    "series_rows",
    "split_future",
    "stitch",
    "third_friday",
    "warmup",
    "write_atomic",
]
