"""Forecasting models."""

from foxhunt.models.tft import TemporalFusionTransformer

__all__ = ["TemporalFusionTransformer"]
