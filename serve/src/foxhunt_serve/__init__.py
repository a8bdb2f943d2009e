"""foxhunt-serve: forecasts from a foxhunt ONNX export with numpy, pyarrow and onnxruntime.

`foxhunt export ckpt_path=...` writes EXPORT_DIR: model.onnx and model.json. model.json carries
everything else (column names, features and their derivation, the normalization, the futures
roll, the calibration). `foxhunt-serve EXPORT_DIR DATA.parquet OUT.parquet` writes the table
`foxhunt predict` writes for the same data: one row per instrument, origin and horizon step,
with `instrument`, `origin_time`, `horizon`, `target_time`, one column per quantile in the
target's own units, and `actual`.

The steps, one module each:

1. `read`: the columns as numpy arrays; each instrument's rows after its last target value are
   the bars to forecast (`split_future`);
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
