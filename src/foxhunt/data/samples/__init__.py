"""Deterministic synthetic market data (for examples, tests and benchmarks): the bundled
E-mini S&P 500 futures sample (`es`, whose docstring says what it imitates), a daily stock panel
as a vendor delivers it (`stocks`), and panels of any size for the benchmarks (`synthetic`)."""

from foxhunt.data.samples.es import ES_TICK, SAMPLE_PATH, SCHEMA, es_sample_table, make_es_sample
from foxhunt.data.samples.stocks import (
    PANEL_DAYS,
    PANEL_END,
    PANEL_SCHEMA,
    PANEL_SECTORS,
    make_stock_panel,
    stock_panel_table,
)

__all__ = [
    "ES_TICK",
    "PANEL_DAYS",
    "PANEL_END",
    "PANEL_SCHEMA",
    "PANEL_SECTORS",
    "SAMPLE_PATH",
    "SCHEMA",
    "es_sample_table",
    "make_es_sample",
    "make_stock_panel",
    "stock_panel_table",
]
