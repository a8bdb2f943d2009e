"""What the target's training rows say of it (foxhunt.data.target): a column of returns is
forecast as returns under data.target_kind=auto, and warned of under level; a name whose target
is constant is named; each warning once, at the start of training, and in foxhunt inspect's
problems (issue 58, items 3 and 4)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from foxhunt.app.backtest.folds import _target_kind
from foxhunt.app.train.assemble import Resumed, assemble
from foxhunt.app.train.phases import prepare
from foxhunt.config import PANEL_NAMES
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.target import evidence, target_kind
from foxhunt.errors import ConfigError
from foxhunt.precision import precision_of
from tests.helpers import (
    FIVE_MIN,
    T0,
    TINY_MODEL,
    compose_train,
    run_script,
    tiny_overrides,
    with_,
    write_table,
)

NAMES = ("AAA", "BBB", "CCC")
SAY_RETURN = "set data.target_kind=return"


def bars(tmp_path: Path, y: dict[str, np.ndarray], n: int = 300) -> Path:
    """A file of `make_table`'s columns with each name's target `y[name]`."""
    rng = np.random.default_rng(0)
    cols = {k: [] for k in ("timestamp", "symbol", "f1", "f2", "k1", "y")}
    for name, values in y.items():
        cols["timestamp"].append(T0 + FIVE_MIN * np.arange(n))
        cols["symbol"].append(np.full(n, name))
        for c in ("f1", "f2"):
            cols[c].append(rng.normal(size=n))
        cols["k1"].append(np.sin(np.arange(n) / 10))
        cols["y"].append(values)
    return write_table(tmp_path / "bars.parquet", {k: np.concatenate(v) for k, v in cols.items()})


def returns(n: int = 300, vol: float = 0.01) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {name: rng.normal(size=n) * vol for name in NAMES}


def prices(n: int = 300) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {name: 100 * np.exp(np.cumsum(rng.normal(size=n) * 0.01)) for name in NAMES}


def decide(configured: str, y: dict[str, np.ndarray]) -> tuple[str, list[str]]:
    found = [evidence(name, values) for name, values in y.items()]
    return target_kind(configured, "level", "y", found)


def test_the_rule_tells_returns_from_prices():
    assert decide("auto", prices()) == ("level", [])
    assert decide("level", prices()) == ("level", [])
    assert decide("auto", returns()) == ("return", [])  # clearly returns: no warning
    kind, said = decide("level", returns())  # the config says level: kept, with a warning
    assert kind == "level" and len(said) == 1 and SAY_RETURN in said[0]
    kind, said = decide("auto", returns(vol=30.0))  # returns in basis points: not clearly
    assert kind == "level" and len(said) == 1 and "not clearly" in said[0]
    assert SAY_RETURN in said[0]
    assert target_kind("return", "return", "y", [evidence("A", np.ones(50))])[0] == "return"


@pytest.mark.parametrize("lazy", [False, True])
def test_a_column_of_returns_is_forecast_as_returns(tmp_path, data_cfg, lazy):
    cfg = with_(data_cfg, path=str(bars(tmp_path, returns())), lazy=lazy)
    cfg = with_(cfg, cache_dir=str(tmp_path / "cache"))
    dm = ParquetDataModule(cfg)
    dm.setup()
    assert dm.schema.target_kind == "return" and not dm.schema.target_anchor
    assert dm.target_warnings == []
    level = ParquetDataModule(with_(cfg, target_kind="level"))
    level.setup()
    assert level.schema.target_kind == "level" and level.schema.target_anchor
    assert len(level.target_warnings) == 1 and SAY_RETURN in level.target_warnings[0]
    if lazy:  # a store opened again says it again
        again = ParquetDataModule(with_(cfg, target_kind="level"))
        again.setup()
        assert again.target_warnings == level.target_warnings


def test_a_column_of_returns_on_a_panel_is_made_market_neutral(tmp_path, data_cfg):
    """data.target naming a column of returns on a panel of PANEL_NAMES names or more: auto is
    xs_demean, as for a derived return (the kind its training rows show decides the transform);
    the lazy path, which reads one name at a time, refuses it in one line."""
    rng = np.random.default_rng(3)
    y = {f"N{i:02d}": rng.normal(size=300) * 0.01 for i in range(PANEL_NAMES + 2)}
    cfg = with_(data_cfg, path=str(bars(tmp_path, y)), cache_dir=str(tmp_path / "cache"))
    assert cfg.target_transform == "auto" and cfg.target_kind == "auto"
    dm = ParquetDataModule(with_(cfg, lazy=False))
    dm.setup()
    assert dm.schema.target_kind == "return" and dm.schema.target_transform == "xs_demean"
    assert not dm.target_warnings
    with pytest.raises(ConfigError) as refused:
        ParquetDataModule(with_(cfg, lazy=True)).setup()
    said = str(refused.value)
    assert "\n" not in said and f"(xs_demean on {PANEL_NAMES + 2} names)" in said
    assert "data.lazy=true reads the panel one name at a time" in said


def test_a_checkpoint_keeps_the_kind_it_was_trained_as(tmp_path, data_cfg):
    """data.target_kind=auto under a checkpoint's schema is the checkpoint's kind (a model
    trained before auto read the rows took a column of returns as a level)."""
    cfg = with_(data_cfg, path=str(bars(tmp_path, returns())), target_kind="level")
    trained = ParquetDataModule(cfg)
    trained.setup()
    again = ParquetDataModule(with_(cfg, target_kind="auto"), schema=trained.schema)
    again.setup()
    assert again.schema.target_kind == "level"


def test_a_constant_target_is_named(tmp_path, data_cfg):
    y = prices()
    y["BBB"] = np.full(300, 42.0)  # halted for good
    dm = ParquetDataModule(with_(data_cfg, path=str(bars(tmp_path, y))))
    dm.setup()
    assert len(dm.target_warnings) == 1
    said = dm.target_warnings[0]
    assert "constant over the training rows of BBB (42)" in said and "AAA" not in said


def _warned_at_start(tmp_path: Path, path: Path, *overrides: str) -> list[str]:
    """The warnings `foxhunt train`'s set-up (before fit) logs, from `assemble`."""
    cfg = compose_train(*tiny_overrides(path, *overrides), *TINY_MODEL)
    run = prepare(cfg, tmp_path / "run")
    logger = logging.getLogger("foxhunt.app.train.assemble")
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        assemble(cfg, run, Resumed(), precision_of(cfg), [], None)
    finally:
        logger.removeHandler(handler)
    return [r.getMessage() for r in records]


def _inspected(path: Path, *overrides: str) -> tuple[int, list[str]]:
    args = (*tiny_overrides(path, *overrides), *TINY_MODEL, "+time_batches=false")
    code, out, err = run_script("inspect_data.py", *args)
    assert out.strip(), err
    return code, json.loads(out.strip().splitlines()[-1])["problems"]


@pytest.mark.slow  # two inspects and a set-up, 5 s: the full tier (#70)
def test_returns_as_a_level_are_said_once_before_training_and_by_inspect(tmp_path):
    path = bars(tmp_path, returns())
    said = _warned_at_start(tmp_path, path, "data.target_kind=level")
    assert len(said) == 1 and said[0].startswith("data: target 'y' looks like returns")
    assert SAY_RETURN in said[0]
    code, problems = _inspected(path, "data.target_kind=level")
    assert code == 2 and len(problems) == 1 and SAY_RETURN in problems[0]
    assert _inspected(path)[1] == []  # auto: returns, nothing to say


@pytest.mark.slow  # 7 CPU-s: the fast tier says a return-as-level once (#70)
def test_a_constant_target_is_said_once_before_training_and_by_inspect(tmp_path):
    y = prices()
    y["CCC"] = np.full(300, 7.5)
    path = bars(tmp_path, y)
    said = _warned_at_start(tmp_path, path)
    assert len(said) == 1 and "constant over the training rows of CCC (7.5)" in said[0]
    code, problems = _inspected(path)
    assert code == 2 and len(problems) == 1 and "CCC (7.5)" in problems[0]


def test_the_backtest_judges_the_kind_its_folds_were_trained_as(tmp_path):
    """data.target_kind=auto is decided from each fold's rows: the pooled judgement reads the
    kind from the folds' summaries, not from the config."""
    cfg = compose_train(*tiny_overrides(tmp_path / "bars.parquet"))
    fold = tmp_path / "fold-0"
    fold.mkdir()
    (fold / "summary.json").write_text(json.dumps({"target": {"kind": "return"}}))
    assert _target_kind({0: fold}, cfg) == "return"
    assert _target_kind({}, cfg) == "level"  # no fold's summary: the config's reading
