"""Evaluation beside the model: its test forecasts, made once (`forecasts`); the baselines they
are scored beside, pooled and per instrument (`baselines`); and what a quant reads of them
(`quality`): the IC and calibration (`stats`) and a costed strategy (`strategy`)."""
