"""Rows after the data, for predict: each instrument's rows after its last target value are the
bars to forecast, and their known-future inputs the model's decoder takes (the serving core's
`foxhunt_serve.read.split_future`, on the data config's reading of the file)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from foxhunt_serve import Future
from foxhunt_serve import split_future as serve_split_future

from foxhunt.data.columns import ohlcv_spec_of
from foxhunt.data.features import feature_plan
from foxhunt.data.serving import data_section

__all__ = ["Future", "known_of", "split_future"]


def split_future(table: pa.Table, cfg: Any) -> tuple[pa.Table, dict[str, Future]]:
    """Take off each instrument's rows after its last target value (the target, or with
    features=ohlcv the close, empty): the bars to forecast, whose known inputs may be given.
    Returns the table without them and those rows by instrument (with data.futures, by root)."""
    return serve_split_future(table, data_section(cfg))


def known_of(cfg: Any) -> tuple[list[str], dict[str, str]]:
    """The model's known inputs, in its order (with features=ohlcv the calendar encodings, then
    data.known_features), and the column each one given in the data is read from."""
    spec = ohlcv_spec_of(cfg)
    known = [*(feature_plan(spec)[1] if spec else []), *cfg.known_features]
    return known, {k: k for k in cfg.known_features}
