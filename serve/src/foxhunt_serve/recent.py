"""The rows a latest forecast reads (#68): each name's last windows, those ACI replays after its
stored state, and the rows before them that their encoders and the features' warm-up need, not
the name's whole history. foxhunt's predict and the consumer both cut here, before the features
are made, so the work grows with the answer, not with the file.

The features are rolling (`foxhunt_serve.features`: each looks back at most
data.ohlcv.warmup_rows bars) and the scales are the model's, so a name's rows before the cut
change no input of the windows forecast; the window sums' float rounding differs (their prefix
sums start later), far below float32's. Every row at a kept time is kept for a model that
compares names at each time (`cross_section.across_names`): a date's ranks and mean are the
whole panel's. The whole file is read as before for futures (a root's contracts are stitched over
their history) and under data.nan_policy ffill or drop (a row dropped, or a value carried from
before the cut, would move the windows)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from foxhunt_serve.calibration import POOLED
from foxhunt_serve.cross_section import across_names
from foxhunt_serve.read import group_codes, time_ns, zone_of

# rows kept beyond those counted: the rows after a name's last target value (to forecast) are
# among its last, up to a horizon of them in a file a feed left short (`cross_section`)
SPARE_HORIZONS = 3


def recent_rows(
    table: pa.Table,
    data: dict[str, Any],
    encoder_length: int,
    horizon: int,
    replay: tuple[dict[str, int], int] | None = None,
) -> pa.Table:
    """The rows of `table` that each name's latest window, and with `replay` (`replay_plan`'s)
    the windows ACI replays, read: from `encoder_length` + warm-up + a few horizons before the
    first replayed window (the latest alone without `replay`), at most the replay's cap of
    windows before the latest. `data`: model.json's data section."""
    columns = [data["time_column"], *([data["group_column"]] if data["group_column"] else [])]
    whole = data["futures"] is not None or data["nan_policy"] != "error"
    if whole or table.num_rows == 0 or any(c not in table.column_names for c in columns):
        return table  # (a missing column: reading the series names it)
    t = time_ns(table, data["time_column"], data["time_unit"], zone_of(data))
    codes, names = group_codes(table, data["group_column"])
    order = np.lexsort((t, codes))
    sorted_t = t[order]
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    warmup = data["ohlcv"]["warmup_rows"] if data.get("ohlcv") else 0
    before = encoder_length + warmup + SPARE_HORIZONS * horizon
    seen, cap = replay if replay is not None else ({}, 0)
    start = np.empty(len(names), np.int64)
    for g, name in enumerate(names):
        lo, hi = bounds[g], bounds[g + 1]
        since = seen.get(name, seen.get(POOLED))
        after = hi if since is None else lo + np.searchsorted(sorted_t[lo:hi], since, "right")
        start[g] = max(lo, after - before, hi - cap - before)
    first, last = sorted_t[start], sorted_t[bounds[1:] - 1]
    if across_names(data):  # every row at a time one name's kept rows hold
        keep = _within(t, first, last)
    else:
        keep = t >= first[codes]
    return table if keep.all() else table.filter(pa.array(keep))


def _within(t: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Whether each time of `t` lies in one of the intervals [first, last] (inclusive)."""
    order = np.argsort(first, kind="stable")
    first, reach = first[order], np.maximum.accumulate(last[order])
    at = np.searchsorted(first, t, "right") - 1  # the last interval starting at or before
    return (at >= 0) & (t <= reach[np.maximum(at, 0)])
