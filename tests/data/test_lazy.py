"""The lazy path (data.lazy): a directory of Parquet files streamed one instrument at a time into
a disk-backed window store gives what the in-memory path gives for the same data as one file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from foxhunt.app.predict.windows import build_windows
from foxhunt.config import SplitConfig
from foxhunt.data import store as store_module
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.schema import CONSTANT
from foxhunt.data.splits import Moments, iso_time, mean_std
from foxhunt.errors import CheckpointError, ConfigError, DataError
from foxhunt.evaluation.controls import make_control
from tests.helpers import (
    FIVE_MIN,
    T0,
    compose_train,
    contracts_table,
    futures_cfg,
    listing,
    make_table,
    ohlcv_cfg,
    with_,
    write_table,
)

LENGTHS = {"AAA": 300, "BBB": 200, "CCC": 250}


def set_up(cfg, schema=None) -> ParquetDataModule:
    dm = ParquetDataModule(cfg, schema=schema)
    dm.setup()
    return dm


def rows_of(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


def per_instrument(folder: Path, cols: dict[str, np.ndarray]) -> Path:
    folder.mkdir()
    for symbol in np.unique(cols["symbol"]):
        write_table(folder / f"{symbol}.parquet", rows_of(cols, cols["symbol"] == symbol))
    return folder


def per_month(folder: Path, cols: dict[str, np.ndarray], months: int = 3, spoil=None) -> Path:
    """Every file holds a time slice of every instrument, rows interleaved by time;
    `spoil(columns)` may change the middle file (a table: written as it is)."""
    folder.mkdir()
    t = cols["timestamp"]
    for m, times in enumerate(np.array_split(np.unique(t), months)):
        part = rows_of(cols, (t >= times[0]) & (t <= times[-1]))
        part = rows_of(part, np.argsort(part["timestamp"], kind="stable"))
        if spoil is not None and m == 1:
            part = spoil(part)
        if isinstance(part, pa.Table):
            pq.write_table(part, folder / f"m{m}.parquet")
        else:
            write_table(folder / f"m{m}.parquet", part)
    return folder


def hive(folder: Path, cols: dict[str, np.ndarray]) -> Path:
    for symbol in np.unique(cols["symbol"]):
        part = rows_of(cols, cols["symbol"] == symbol)
        del part["symbol"]  # the partition directory provides it
        (folder / f"symbol={symbol}").mkdir(parents=True)
        write_table(folder / f"symbol={symbol}" / "part-0.parquet", part)
    return folder


def lazy(cfg, path: Path, tmp_path: Path):
    return with_(cfg, path=str(path), lazy=True, cache_dir=str(tmp_path / "cache"))


def assert_same(eager: ParquetDataModule, lazy_dm: ParquetDataModule) -> None:
    a, b = eager.schema.to_dict(), lazy_dm.schema.to_dict()
    stats = ("input_mean", "input_std", "static_mean", "static_std")
    for key in (*stats, "target_centres", "target_scales"):
        np.testing.assert_allclose(b.pop(key), a.pop(key), rtol=1e-12, atol=1e-300)
    assert a == b
    for split in ("train", "val", "test"):
        x, y = eager.datasets[split], lazy_dm.datasets[split]
        assert torch.equal(x.starts, y.starts) and torch.equal(x.group, y.group)
        assert torch.equal(x.time_ns, y.time_ns)  # (the baselines' seasons)
        if len(x) == 0:
            continue
        index = list(range(0, len(x), 7)) + [len(x) - 1]
        bx, by = x.__getitems__(index), y.__getitems__(index)
        for k in bx:
            torch.testing.assert_close(by[k], bx[k], rtol=0, atol=1e-6)


@pytest.fixture
def cols() -> dict[str, np.ndarray]:
    return make_table(LENGTHS)


@pytest.fixture
def eager(tmp_path, data_cfg, cols) -> ParquetDataModule:
    dm = set_up(with_(data_cfg, path=str(write_table(tmp_path / "one.parquet", cols)), lazy=False))
    assert dm.store_path is None
    return dm


@pytest.mark.parametrize("layout", [per_instrument, per_month, hive])
def test_directory_matches_one_file(tmp_path, data_cfg, cols, eager, layout):
    dm = set_up(lazy(data_cfg, layout(tmp_path / "parts", cols), tmp_path))
    assert dm.store_path is not None and isinstance(dm.datasets["train"].inputs, torch.Tensor)
    assert_same(eager, dm)


def test_eager_directory_matches_one_file(tmp_path, data_cfg, cols, eager):
    folder = per_month(tmp_path / "parts", cols)
    assert_same(eager, set_up(with_(data_cfg, path=str(folder), lazy=False)))
    assert_same(eager, set_up(with_(data_cfg, path=str(hive(tmp_path / "hive", cols)))))


def test_one_file_in_small_row_groups(tmp_path, data_cfg, cols, eager):
    path = tmp_path / "rg.parquet"
    arrays = {k: pa.array(v, pa.timestamp("ns", tz="UTC")) if k == "timestamp" else v
              for k, v in cols.items()}  # fmt: skip
    pq.write_table(pa.table(arrays), path, row_group_size=64)
    assert_same(eager, set_up(lazy(data_cfg, path, tmp_path)))


def test_ohlcv_features_match(tmp_path, es_sample, data_cfg):
    cfg = ohlcv_cfg(data_cfg, es_sample)
    assert_same(set_up(with_(cfg, lazy=False)), set_up(lazy(cfg, es_sample, tmp_path)))


def test_moments_merge_like_numpy():
    rng = np.random.default_rng(3)
    blocks = [rng.normal(loc, scale, size=(n, 4)) for loc, scale, n in
              ((1e3, 1.0, 500), (-5.0, 30.0, 70), (0.0, 1e-3, 1), (2.0, 2.0, 900))]  # fmt: skip
    moments = Moments(4)
    for b in blocks:
        moments.add(b)
    mean, std = moments.mean_std()
    want_mean, want_std = mean_std(np.concatenate(blocks))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12)
    np.testing.assert_allclose(std, want_std, rtol=1e-12)


# ---- the cache ----


def test_store_is_reused_and_rebuilt_when_the_data_changes(tmp_path, data_cfg, cols, monkeypatch):
    folder = per_instrument(tmp_path / "parts", cols)
    cfg = lazy(data_cfg, folder, tmp_path)
    first = set_up(cfg)
    built = first.store_path

    def no_reading(cfg):
        raise AssertionError("the store should have been reused")

    with monkeypatch.context() as m:
        m.setattr(store_module, "stream", no_reading)
        again = set_up(cfg)
    assert again.store_path == built
    assert_same(first, again)

    changed = rows_of(make_table(LENGTHS, seed=9), make_table(LENGTHS)["symbol"] == "BBB")
    write_table(folder / "BBB.parquet", changed)
    rebuilt = set_up(cfg)
    assert rebuilt.store_path != built and not built.exists()  # the stale store is removed
    assert rebuilt.schema.input_mean != first.schema.input_mean

    cfg = with_(cfg, val_fraction=0.25)  # a setting that changes the rows: a new key
    other = set_up(cfg)
    assert other.store_path != rebuilt.store_path
    assert set_up(with_(cfg, batch_size=3)).store_path == other.store_path  # one that does not
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [other.store_path.name]


def test_store_with_a_missing_file_is_rebuilt(tmp_path, data_cfg, cols):
    cfg = lazy(data_cfg, per_instrument(tmp_path / "parts", cols), tmp_path)
    first = set_up(cfg)
    (first.store_path / "inputs.f32").unlink()
    again = set_up(cfg)
    assert again.store_path == first.store_path
    assert_same(first, again)


def test_checkpoint_schema_fixes_the_normalization(tmp_path, data_cfg, cols, eager):
    folder = per_instrument(tmp_path / "parts", make_table(LENGTHS, seed=7))
    dm = set_up(lazy(data_cfg, folder, tmp_path), schema=eager.schema)
    assert dm.schema.input_mean == eager.schema.input_mean
    other = with_(lazy(data_cfg, folder, tmp_path), features=["f1", "k1"], known_features=[])
    with pytest.raises(CheckpointError, match="missing from the data: f2"):
        set_up(other, schema=eager.schema)


def test_lazy_auto_and_bad_value(tmp_path, data_cfg, cols, monkeypatch):
    folder = per_instrument(tmp_path / "parts", cols)
    cfg = with_(data_cfg, path=str(folder), lazy="auto", cache_dir=str(tmp_path / "cache"))
    assert set_up(cfg).store_path is None  # small: in memory
    monkeypatch.setattr(store_module, "LAZY_MEMORY_FRACTION", 0.0)
    assert set_up(cfg).store_path is not None
    with pytest.raises(ConfigError, match="data.lazy must be auto, true or false, got 'sometimes'"):
        set_up(with_(cfg, lazy="sometimes"))


def test_default_cache_dir_is_next_to_the_data(tmp_path, data_cfg, cols):
    folder = per_instrument(tmp_path / "parts", cols)
    dm = set_up(with_(data_cfg, path=str(folder), lazy="true"))
    assert dm.store_path.parent == tmp_path / ".foxhunt-cache"


# ---- bad input: one line naming the file, the instrument and the column ----


def swap_aaa_rows(part):
    i = np.flatnonzero(part["symbol"] == "AAA")[[5, 6]]
    part["timestamp"][i] = part["timestamp"][i[::-1]]
    return part


def nan_in_bbb(part):
    part["f1"][np.flatnonzero(part["symbol"] == "BBB")[3]] = np.nan
    return part


def without_f2(part):
    del part["f2"]
    return part


def f1_as_text(part):
    time = pa.array(part["timestamp"], pa.timestamp("ns", tz="UTC"))
    return pa.table({**part, "timestamp": time, "f1": pa.array(part["f1"].astype(str))})


def time_as_integer(part):
    return pa.table(part)  # int64 nanoseconds where the other files have timestamps


def test_a_file_that_is_not_parquet(tmp_path, data_cfg, cols):
    folder = per_instrument(tmp_path / "parts", cols)
    (folder / "BBB.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="cannot read .*BBB.parquet as Parquet"):
        set_up(lazy(data_cfg, folder, tmp_path))


@pytest.mark.parametrize(
    "spoil, message",
    [
        (swap_aaa_rows, r"not strictly increasing in instrument AAA at its row \d+ \(of 300\) in "),
        (nan_in_bbb, r"NaN/inf values in instrument BBB in .*: 'f1' \(1\); set data.nan_policy"),
        (without_f2, r"missing column\(s\) f2 in .*; the file has: timestamp, symbol, f1, k1, y"),
        (f1_as_text, r"column 'f1' is string in .*, expected a numeric column"),
        (time_as_integer, r"time column 'timestamp' is int64 in .* but timestamp\[ns, tz=UTC\]"),
    ],
)
def test_errors_name_the_file(tmp_path, data_cfg, cols, spoil, message):
    folder = per_month(tmp_path / "parts", cols, spoil=spoil)
    with pytest.raises(DataError, match=message) as err:
        set_up(lazy(data_cfg, folder, tmp_path))
    assert str(folder / "m1.parquet") in str(err.value) and "\n" not in str(err.value)
    assert not list((tmp_path / "cache").glob("*")), "a failed build leaves nothing behind"


@pytest.mark.parametrize("value, lazy_path", [("true", True), ("false", False), ("auto", False)])
def test_hydra_override(tmp_path, data_cfg, cols, value, lazy_path):
    composed = compose_train("data=parquet", f"data.lazy={value}")
    assert store_module.wants_lazy(with_(data_cfg, lazy=composed.data.lazy)) is lazy_path


def test_time_unit_is_in_the_cache_key(data_cfg):
    # it changes the rows (the calendar features), unlike batch_size
    keys = {store_module.cache_key(with_(data_cfg, time_unit=u), None) for u in ("s", "ms")}
    assert len(keys) == 2


def test_files_of_different_types_read_as_one_file(tmp_path, data_cfg):
    """A directory is read file by file in each file's own types, in memory as in the store:
    a scan of the whole directory would cast every file to the first one's types."""
    cols = make_table(LENGTHS)
    cols["f2"] = np.round(cols["f2"]).astype(np.int64)  # integers in the first file ...

    def halves(part):  # ... and halves in the second
        return {**part, "f2": part["f2"] + 0.5}

    folder = per_month(tmp_path / "parts", cols, spoil=halves)
    t = cols["timestamp"]
    middle = np.array_split(np.unique(t), 3)[1]  # the second file's times
    in_middle = (t >= middle[0]) & (t <= middle[-1])
    same = {**cols, "f2": np.where(in_middle, cols["f2"] + 0.5, cols["f2"])}
    one = set_up(with_(data_cfg, path=str(write_table(tmp_path / "one.parquet", same)), lazy=False))
    assert_same(one, set_up(with_(data_cfg, path=str(folder), lazy=False)))
    assert_same(one, set_up(lazy(data_cfg, folder, tmp_path)))


def test_empty_files_add_nothing(tmp_path, data_cfg, cols, eager):
    folder = hive(tmp_path / "hive", cols)
    (folder / "symbol=DDD").mkdir()  # an instrument's file with no rows
    nothing = rows_of(cols, np.zeros(len(cols["y"]), bool))
    part = {k: v for k, v in nothing.items() if k != "symbol"}  # the directory names it
    write_table(folder / "symbol=DDD" / "part-0.parquet", part)
    assert_same(eager, set_up(lazy(data_cfg, folder, tmp_path)))
    assert_same(eager, set_up(with_(data_cfg, path=str(folder), lazy=False)))
    empty = write_table(tmp_path / "empty.parquet", nothing)
    for cfg in (lazy(data_cfg, empty, tmp_path), with_(data_cfg, path=str(empty), lazy=False)):
        with pytest.raises(DataError, match="empty.parquet has no rows$"):
            set_up(with_(cfg, group_column=None))


# ---- features constant over the training split ----


def test_a_feature_constant_over_the_training_split_is_dropped_alike(tmp_path, data_cfg, caplog):
    cols = make_table(LENGTHS)
    late = cols["timestamp"] >= T0 + 200 * FIVE_MIN  # after the training split's end
    cols["f2"] = np.where(late, cols["f2"], 5.0)
    caplog.set_level("INFO")
    one = write_table(tmp_path / "one.parquet", cols)
    eager = set_up(with_(data_cfg, path=str(one), lazy=False))
    assert eager.splits["cuts"]["val_start"] <= str(np.datetime64(int(T0 + 200 * FIVE_MIN), "ns"))
    assert eager.schema.dropped == {"f2": CONSTANT} and eager.schema.observed == ["f1"]
    assert eager.datasets["train"].inputs.shape[1] == 3  # y, f1, k1
    assert caplog.text.count("dropped 1 feature(s) constant over the training split: f2") == 1
    assert_same(eager, set_up(lazy(data_cfg, per_month(tmp_path / "parts", cols), tmp_path)))

    # a checkpoint's model was trained without it: dropped from data where it varies, too
    varied = per_instrument(tmp_path / "varied", make_table(LENGTHS, seed=4))
    for cfg in (with_(data_cfg, path=str(varied), lazy=False), lazy(data_cfg, varied, tmp_path)):
        dm = set_up(cfg, schema=eager.schema)
        assert dm.schema.dropped == {"f2": CONSTANT} and dm.schema.observed == ["f1"]
        assert dm.datasets["train"].inputs.shape[1] == 3
    windows = build_windows(pq.read_table(one), with_(data_cfg, path=str(one)), eager.schema, True)
    rows = LENGTHS["AAA"]  # the first instrument's rows, as the data module normalized them
    torch.testing.assert_close(windows.dataset.inputs[:rows], eager.datasets["train"].inputs[:rows])


# ---- futures: a root's contracts read together ----


@pytest.mark.parametrize("layout", ["per_contract", "per_month"])
def test_futures_lazy_match_eager(tmp_path, layout):
    """Two roots of 3-4 listed months each, the data ending mid-quarter: a file per contract
    (a root's contracts read together) or per month (row groups holding both roots) give the
    eager path's rolls, windows and normalization."""
    table = pa.concat_tables(
        [contracts_table(listing(seed=s, root=r)[0]) for s, r in ((0, "ES"), (1, "NQ"))]
    )
    one = tmp_path / "one.parquet"
    pq.write_table(table, one)
    folder = tmp_path / "parts"
    folder.mkdir()
    if layout == "per_contract":
        for symbol in pc.unique(table["symbol"]).to_pylist():
            part = table.filter(pc.equal(table["symbol"], symbol))
            pq.write_table(part, folder / f"{symbol}.parquet")
    else:
        month = pc.strftime(table["timestamp"], "%Y-%m").to_numpy(zero_copy_only=False)
        for m in np.unique(month):
            pq.write_table(table.filter(pa.array(month == m)), folder / f"{m}.parquet")
    eager = set_up(futures_cfg(one, 3, tmp_path / "cache"))
    lazy_dm = set_up(with_(futures_cfg(folder, 3, tmp_path / "cache"), lazy=True))
    assert lazy_dm.store_path is not None and eager.schema.groups == ["ES", "NQ"]
    assert len(eager.rolls) == 14 and lazy_dm.rolls == eager.rolls
    assert_same(eager, lazy_dm)
    reused = set_up(with_(futures_cfg(folder, 3, tmp_path / "cache"), lazy=True))
    assert reused.rolls == eager.rolls  # from the store's meta.json, not read again


def test_a_positive_controls_panel_gives_the_same_windows_lazily(tmp_path):
    # what the model is trained on in the lazy path, the planted column among it, equals the
    # in-memory path's: the control's training (tests/evaluation) holds for both
    control = make_control("observed", tmp_path, instruments=6, bars=600)
    cfg = compose_train(*control.overrides, f"data.cache_dir={tmp_path / 'cache'}").data
    eager_dm = set_up(cfg)
    lazy_cfg = cfg.copy()
    lazy_cfg.lazy = True
    lazy_dm = set_up(lazy_cfg)
    assert lazy_dm.store_path is not None and "signal" in eager_dm.schema.observed
    assert_same(eager_dm, lazy_dm)


@pytest.mark.parametrize("layout", [per_instrument, per_month])
def test_a_run_without_a_test_period_reads_nothing_from_its_end(tmp_path, data_cfg, cols, layout):
    """data.split.test_start = test_end (a tuning study's fold): every instrument, whatever
    its history, is cut there as it is read, eagerly and lazily; a NaN target after the cut is
    never seen."""
    times = np.unique(cols["timestamp"])
    cut = int(times[180])  # inside every instrument's history (200 to 300 bars)
    spoiled = dict(cols, y=np.where(cols["timestamp"] >= cut, np.nan, cols["y"]))
    path = layout(tmp_path / "data", spoiled)
    split = SplitConfig(val_start=iso_time(int(times[130])), test_start=iso_time(cut))
    split.test_end = split.test_start
    eager_dm = set_up(with_(data_cfg, path=str(path), lazy=False, split=split))
    assert_same(eager_dm, set_up(lazy(with_(data_cfg, split=split), path, tmp_path)))
    assert len(eager_dm.datasets["test"]) == 0 and len(eager_dm.datasets["val"]) > 0
    assert int(eager_dm.datasets["val"].time_ns.max()) < cut
    with pytest.raises(DataError, match="NaN/inf values"):  # the cut is what spares them
        set_up(
            with_(
                data_cfg, path=str(path), lazy=False, split=SplitConfig(test_start=split.test_end)
            )
        )
