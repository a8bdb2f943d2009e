"""Rows after the data, for predict: each instrument's rows after its last target value are the
bars to forecast, and their known-future inputs the model's decoder takes (the serving core's
`foxhunt_serve.read.split_future`, on the data config's reading of the file)."""

from __future__ import annotations

from typing import Any

from foxhunt_serve import Future

from foxhunt.data.features import feature_plan
from foxhunt.data.section import ohlcv_spec_of

__all__ = ["Future", "known_of"]


def known_of(cfg: Any) -> tuple[list[str], dict[str, str]]:
    """The model's known inputs, in its order (with features=ohlcv the calendar encodings, then
    data.known_features), and the column each one given in the data is read from."""
    spec = ohlcv_spec_of(cfg)
    known = [*(feature_plan(spec)[1] if spec else []), *cfg.known_features]
    return known, {k: k for k in cfg.known_features}
