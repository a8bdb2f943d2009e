"""Evaluation beside the model: its test forecasts, made once (`forecasts`), and the baselines
they are scored beside, pooled and per instrument (`baselines`)."""
