"""Evaluation beside the model: the baselines a forecast must beat (`baselines`)."""
