"""#69's realistic panel (benchmarks/realistic_panel.py): each planted anomaly alone ranks the
next bar's returns by date at the size of a real daily stock signal, the panel without them
ranks nothing, and the planting keeps every row, listing, halt and bar's shape."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from benchmarks.realistic_panel import anomaly_ics, plant_anomalies
from foxhunt.data.samples import stock_panel_table


@pytest.mark.slow  # five 250-name panels: the full tier (#70)
def test_each_anomaly_alone_ranks_the_next_bar_as_a_real_signal_and_plain_noise_nothing():
    plain = stock_panel_table(200, days=900, seed=5)
    planted = plant_anomalies(plain)
    got = anomaly_ics(planted)
    assert all(0.015 <= ic <= 0.06 for ic in got.values()), got
    assert max(got.values()) >= 0.025, got  # the best input at 0.02-0.05, as real ones
    assert all(abs(ic) < 0.012 for ic in anomaly_ics(plain).values())  # the negative control


def test_planting_keeps_every_row_and_each_bar_s_shape_across_the_panel():
    plain = stock_panel_table(60, days=400, seed=2)  # late listings, delistings, halts
    planted = plant_anomalies(plain)
    for column in ("timestamp", "symbol", "volume", "sector"):
        assert planted[column].equals(plain[column]), column
    o, h, lo, c = (planted[k].to_numpy() for k in ("open", "high", "low", "close"))
    assert (lo > 0).all() and (lo <= np.minimum(o, c)).all() and (np.maximum(o, c) <= h).all()
    # the moves are planted in every name's prices: each bar scaled alike, not all by one number
    ratio = pc.divide(planted["close"], plain["close"]).to_numpy()
    np.testing.assert_allclose(ratio, planted["open"].to_numpy() / plain["open"].to_numpy())
    assert np.std(np.log(ratio)) > 0.01


def test_the_oracle_is_the_move_planted_in_each_name_s_next_bar():
    plain = stock_panel_table(40, days=300, seed=1)
    planted = plant_anomalies(plain)
    same = pc.equal(plain["symbol"][1:], plain["symbol"][:-1]).to_numpy(zero_copy_only=False)
    moved = np.diff(np.log(planted["close"].to_numpy() / plain["close"].to_numpy()))
    np.testing.assert_allclose(planted["oracle"].to_numpy()[:-1][same], moved[same], atol=1e-12)
