"""benchmarks/bench_futures_cuts.py: the vendor-style file it builds from real daily bars, the
cuts it picks across a roll, and (slow) both of its modes end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_futures_cuts.py"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("arch") is None, reason="needs the arch package's data files"
)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_futures_cuts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vendor(bench):
    """The 2014-2018 file and its roll schedule."""
    table = bench.quarterly_table(bench.read_sp500("2014-01-01", "2018-12-31"))
    return table, bench.schedule(table)


def test_the_vendor_file_lists_two_or_three_months_at_once_and_rolls_each_quarter(bench, vendor):
    table, rolls = vendor
    t = table["timestamp"].cast(pa.int64()).to_numpy()
    ids = np.asarray(table["symbol"].to_pylist())
    assert set(ids) == {f"SP{m}{y}" for y in range(14, 19) for m in "HMUZ"} | {"SPH19", "SPM19"}
    listed = np.array([len(set(ids[t == d])) for d in np.unique(t)])
    assert set(listed) == {2, 3} and (listed == 3).mean() > 0.15
    for contract in ("SPU17", "SPZ18"):  # listed 200 days before expiry, trading until it
        days = t[ids == contract]
        expiry = bench.third_friday(2000 + int(contract[-2:]), "HMUZ".index(contract[2]) * 3 + 3)
        assert days[-1] == expiry and 195 <= (expiry - days[0]) / bench.DAY_NS <= 200
    # the volume rule rolls each quarter a few days before the front's expiry, to the next month
    assert len(rolls) == 20 and [r.from_id for r in rolls[1:]] == [r.to_id for r in rolls[:-1]]
    for r in rolls:
        expiry = t[ids == r.from_id][-1]
        assert 2 <= (expiry - r.time_ns) / bench.DAY_NS <= 9
    assert rolls[-1].held_at_end and rolls[-1].to_id == "SPH19"


def test_the_cuts_cover_the_crossover_and_each_gives_a_prefix_of_the_schedule(bench, vendor):
    """12+ cuts across one quarter: the next month's lead seen on 0, 1, 2 and 3 of the 3 bars
    the rule needs, the roll bar and after it; each cut's schedule is the full file's up to it."""
    table, full = vendor
    cuts = bench.cut_points(table, full, -2)
    assert len(cuts) >= 12
    roll = full[-2]
    seen = {}
    for label, day in cuts:
        part = table.filter(pc.less_equal(table["timestamp"].cast(pa.int64()), day))
        rolls = bench.schedule(part)
        found = [(r.time_ns, r.from_id, r.to_id, r.factor) for r in rolls]
        assert bench.same_prefix(found, full, day), label
        held, lead = bench.held_and_lead(part, rolls)
        assert held == (roll.to_id if day >= roll.time_ns else roll.from_id), label
        seen[label] = lead
    assert [seen[f"{k} of 3 led"] for k in (1, 2, 3)] == [1, 2, 3]
    assert seen["1 before the lead"] == 0 and seen["roll bar"] == 0
    assert sum(day > roll.time_ns for _, day in cuts) >= 4  # after the roll, into the next quarter


@pytest.mark.slow
def test_both_modes_run_end_to_end_and_end_with_their_json_line(tmp_path):
    common = dict(capture_output=True, text=True, timeout=600, check=False)
    quick = ["--quick", "--out", str(tmp_path / "cuts"), "trainer.accelerator=cpu"]
    cuts = subprocess.run([sys.executable, str(SCRIPT), *quick], **common)
    assert cuts.returncode == 0, cuts.stderr[-2000:]
    result = json.loads(cuts.stdout.strip().splitlines()[-1])
    assert result["bench"] == "futures_cuts" and len(result["cuts"]) == 2
    assert result["all_prefix"] and result["train_ok"] == result["predict_ok"] == 2
    lazy = subprocess.run(
        [sys.executable, str(SCRIPT), "--lazy-dir", "--out", str(tmp_path / "lazy")]
        + ["--lazy-roots", "2", "--lazy-contracts", "3", "--lazy-days", "60"]
        + ["--lazy-session-hours", "2"],
        **common,
    )
    assert lazy.returncode == 0, lazy.stderr[-2000:]
    result = json.loads(lazy.stdout.strip().splitlines()[-1])
    modes = {r["mode"]: r for r in result["results"]}
    assert set(modes) == {"eager", "lazy", "lazy, store reused"}
    assert len({(r["windows"], r["rolls"]) for r in modes.values()}) == 1  # lazy equals eager
    assert modes["eager"]["rolls"] == 4
