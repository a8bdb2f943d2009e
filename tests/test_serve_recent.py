"""The rows a latest forecast reads (`foxhunt_serve.recent_rows`, #68): each name's last windows,
those ACI replays after its stored state, and the encoder and warm-up rows before them; every
row at a kept time for a model that compares names at each time; the whole file for futures
and a NaN policy that drops or carries values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from foxhunt_serve import POOLED, recent_rows

E, H, WARMUP = 5, 2, 3
BEFORE = E + WARMUP + 3 * H  # the rows kept before a name's first window to forecast
DAY = 86_400 * 10**9


def _data(transform: str = "none", **changes) -> dict:
    """A model.json data section of the panel below."""
    return {
        "time_column": "timestamp",
        "time_unit": None,
        "group_column": "symbol",
        "ohlcv": {"warmup_rows": WARMUP},
        "futures": None,
        "nan_policy": "error",
        "calendar": None,
        "cross_section": "none",
        "target_transform": transform,
    } | changes


def _panel() -> pa.Table:
    """Daily bars of names with different histories, rows in no particular order: AAA the whole
    300 days, BBB listed on day 290, CCC delisted after day 120, DDD 10 days in all."""
    spans = {"AAA": (0, 300), "BBB": (290, 300), "CCC": (0, 121), "DDD": (50, 60)}
    days = [(name, d) for name, (a, b) in spans.items() for d in range(a, b)]
    order = np.random.default_rng(0).permutation(len(days))
    names = [days[i][0] for i in order]
    stamps = np.array([days[i][1] for i in order], np.int64) * DAY
    return pa.table({"timestamp": pa.array(stamps, pa.timestamp("ns", tz="UTC")), "symbol": names})


def _kept(table: pa.Table) -> dict[str, list[int]]:
    """Each name's kept days, in order."""
    days = table["timestamp"].cast(pa.int64()).to_numpy() // DAY
    names = np.array(table["symbol"].to_pylist())
    return {n: sorted(days[names == n].tolist()) for n in sorted(set(names))}


def test_each_name_keeps_its_last_window_and_the_rows_it_reads():
    kept = _kept(recent_rows(_panel(), _data(), E, H))
    assert kept["AAA"] == list(range(300 - BEFORE, 300))
    assert kept["BBB"] == list(range(290, 300))  # all it has
    assert kept["CCC"] == list(range(121 - BEFORE, 121))  # its own last window, long ago
    assert kept["DDD"] == list(range(50, 60))


def test_aci_s_replay_keeps_the_windows_after_each_name_s_state_at_most_a_cap():
    seen = {"AAA": 250 * DAY, "CCC": 100 * DAY, POOLED: 250 * DAY}
    kept = _kept(recent_rows(_panel(), _data(), E, H, (seen, 1000)))
    assert kept["AAA"][0] == 251 - BEFORE  # its first row after the state, less BEFORE
    assert kept["CCC"][0] == 101 - BEFORE
    assert kept["BBB"] == list(range(290, 300))  # no state: after the names' latest
    assert kept["DDD"] == list(range(50, 60))  # ended before it: its latest window alone
    capped = _kept(recent_rows(_panel(), _data(), E, H, (seen, 20)))
    assert capped["AAA"][0] == 300 - 20 - BEFORE


def test_a_model_across_names_keeps_every_row_at_a_kept_time():
    """For the whole panel, not per name: a date's rank and mean are every name's there."""
    table = _panel()
    kept = recent_rows(table, _data("xs_demean"), E, H)
    days = table["timestamp"].cast(pa.int64()).to_numpy() // DAY
    kept_days = kept["timestamp"].cast(pa.int64()).to_numpy() // DAY
    # the union of each name's own span: AAA's and CCC's last rows, DDD's all (BBB's in AAA's)
    want = set(range(300 - BEFORE, 300)) | set(range(121 - BEFORE, 121)) | set(range(50, 60))
    assert set(kept_days.tolist()) == want
    assert kept.num_rows == np.isin(days, list(want)).sum()  # every name's row at those times


def test_futures_and_a_nan_policy_that_moves_rows_read_the_whole_file():
    table = _panel()
    for data in (_data(nan_policy="ffill"), _data(nan_policy="drop"), _data(futures={})):
        assert recent_rows(table, data, E, H) is table
