"""Interpretation and the run report: weights, calibration, files, the CLI, no matplotlib; a
panel's listings (the best and worst instruments and the spread) and its headline IC."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from foxhunt.app.predict.interpret import PLOTS, variable_names
from foxhunt.app.report.console import console_summary
from foxhunt.app.report.figures import learning_curves
from foxhunt.app.report.plots import LEARNING_CURVES
from foxhunt.app.report.run_report import _quality_section, report_run, write_report
from foxhunt.app.report.scores import headline_section, instrument_table
from foxhunt.app.report.scores import strategy_section as _strategy_section
from foxhunt.app.train.phases import train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.training.module import TFTModule
from tests.helpers import ROOT, TINY_MODEL, compose_train, make_table, tiny_overrides, write_table


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One tiny model trained for an epoch, reloaded from its best checkpoint alone."""
    tmp = tmp_path_factory.mktemp("report")
    table = write_table(tmp / "bars.parquet", make_table({"AAA": 300, "BBB": 200}))
    cfg = compose_train(*tiny_overrides(table, "trainer.max_epochs=1", "report=true"), *TINY_MODEL)
    run_dir = tmp / "run"
    summary = train(cfg, run_dir)
    assert (run_dir / "report.md").stat().st_size > 0  # training wrote it
    module = TFTModule.load_from_checkpoint(summary["best_checkpoint"], map_location="cpu")
    datamodule = ParquetDataModule(cfg.data, schema=module.schema)
    datamodule.setup()
    return {"cfg": cfg, "run_dir": run_dir, "summary": summary, "module": module, "dm": datamodule}


def test_every_run_writes_the_report_by_default():
    assert compose_train().report is True


def test_selection_and_attention_weights_sum_to_one_per_window(trained):
    model = trained["module"].model.eval()
    batch = next(iter(trained["dm"].test_dataloader(sharded=False)))
    with torch.no_grad():
        out = model.interpret(batch)
    for key in ("static_variable_weights", "encoder_variable_weights", "decoder_variable_weights"):
        sums = out[key].sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums))
    rows = out["attention"].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


@pytest.mark.slow  # 3 CPU-s: the full tier
def test_report_run_writes_interpretation_report_and_plots(trained):
    run_dir = trained["run_dir"]
    files = report_run(
        trained["cfg"], run_dir, trained["summary"], trained["module"], trained["dm"]
    )
    result = json.loads((run_dir / "interpretation.json").read_text())
    names = variable_names(trained["module"].schema, trained["module"].model)
    assert names["static"] == ["target_scale"]  # no instrument embedding (the default)
    assert names["encoder"] == ["y (target)", "f1", "f2", "k1", "relative time"]
    assert names["decoder"] == ["k1", "relative time"]
    for net, expected in names.items():
        found = result["variable_importance"][net]
        assert found["names"] == expected
        assert sum(found["weights"]) == pytest.approx(1.0, abs=1e-5)  # means of rows summing to 1
    assert sum(result["attention"]["by_lag"]) + sum(
        result["attention"]["decoder_share_by_horizon"]
    ) / len(result["attention"]["decoder_share_by_horizon"]) == pytest.approx(1.0, abs=1e-5)

    coverage = result["calibration"]["observed_coverage"]
    assert len(coverage) == len(result["calibration"]["quantiles"])
    assert all(0.0 <= c <= 1.0 for c in coverage)
    assert all(a <= b for a, b in zip(coverage, coverage[1:], strict=False))

    report = (run_dir / "report.md").read_text()
    assert files["report"] == run_dir / "report.md"
    for heading in ("## Data", "## Batch sizes and memory", "## Test metrics", "## Calibration"):
        assert heading in report
    # the conformal calibration: the model's own intervals, then each method's, and the plot
    conformal = report.split("## Conformal calibration")[1]
    for method in ("model", "cqr", "aci"):
        assert f"| {method} | 0.1-0.9 | 0.8 |" in conformal
    assert (run_dir / "calibration.png").stat().st_size > 5_000
    assert "AAA" in report and "2026-01-05" in report  # instruments and split dates
    for png in [*PLOTS.values(), LEARNING_CURVES]:
        assert f"]({png})" in report
        assert (run_dir / png).stat().st_size > 5_000, png


def test_without_matplotlib_report_but_no_plots(trained, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    run_dir = tmp_path / "run"
    (run_dir / "csv").mkdir(parents=True)
    shutil.copy(trained["run_dir"] / "csv" / "metrics.csv", run_dir / "csv")
    with caplog.at_level(logging.WARNING):
        files = report_run(
            trained["cfg"], run_dir, trained["summary"], trained["module"], trained["dm"]
        )
    assert files["report"].stat().st_size > 0
    assert not list(run_dir.glob("*.png"))
    assert [r.message for r in caplog.records if "matplotlib" in r.message] == [
        "matplotlib is not installed: no plots (pip install matplotlib)"
    ]


def run_interpret(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "interpret.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # 9 s: the fast tier stays under 120 s
def test_cli_interprets_a_checkpoint_and_rejects_a_missing_one(trained, tmp_path):
    # no data overrides: the data config comes from the checkpoint's run (.hydra/config.yaml)
    run_dir = trained["run_dir"]
    (run_dir / ".hydra").mkdir(exist_ok=True)
    OmegaConf.save(trained["cfg"], run_dir / ".hydra" / "config.yaml")
    out = tmp_path / "out"
    ok = run_interpret(
        f'ckpt_path="{trained["summary"]["best_checkpoint"]}"', f"out_dir={out}", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    printed = json.loads(ok.stdout.strip().splitlines()[-1])
    assert printed["files"] == ["interpretation.json", *PLOTS.values()]
    assert all((out / f).stat().st_size > 0 for f in printed["files"])

    missing = tmp_path / "missing.ckpt"
    bad = run_interpret(f"ckpt_path={missing}", f"out_dir={out}", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: checkpoint not found: {missing}"]


def test_learning_curves_join_a_resumed_runs_csv_logs(tmp_path):
    def write(path: Path, rows: list[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("epoch,step,train_loss_epoch,val_loss\n" + "\n".join(rows) + "\n")

    write(tmp_path / "csv" / "metrics.csv", ["0,9,,0.5", "0,9,0.6,", "1,19,,0.45"])
    # resumed in place during epoch 1: that epoch is logged again, the later file wins
    write(tmp_path / "csv" / "resume-1" / "metrics.csv", ["1,19,,0.4", "1,19,0.5,", "2,29,,0.3"])
    assert learning_curves(tmp_path) == {
        0: {"train_loss_epoch": 0.6, "val_loss": 0.5},
        1: {"train_loss_epoch": 0.5, "val_loss": 0.4},
        2: {"val_loss": 0.3},
    }


# --------------------------------------------------------------------------------------------
# A panel's listings: the best and worst by skill and the spread, not a row per instrument
# --------------------------------------------------------------------------------------------

RIVALS = ("zero", "lightgbm")
STATS = ("sharpe", "sharpe_se", "max_drawdown", "turnover", "net_return")


def panel_summary(instruments: int, cross_section: bool = True) -> dict:
    """A run's summary of `instruments` instruments S000, S001, ... whose skills all differ
    (shuffled), with every per-instrument figure the report lists."""
    rng = np.random.default_rng(0)
    names = [f"S{i:03d}" for i in range(instruments)]
    skills = rng.permutation(np.linspace(-0.05, 0.04, instruments))
    by = {
        n: {"windows": 90, "test_loss": 0.25 - k / 10, "skill": k, "best_baseline": "lightgbm"}
        for n, k in zip(names, skills.tolist(), strict=True)
    }
    ic = {"ic": 0.0213, "ic_se": 0.0062, "ic_t": 3.44, "ic_n": 480, "rank_ic": 0.018}
    ic |= {"rank_ic_se": 0.0062, "rank_ic_t": 2.9, "ic_mode": "time_series"}
    metrics = {"test_loss": 0.25, "skill": 0.004, "best_baseline": "lightgbm", "by_instrument": by}
    metrics |= ic | {"ic_mode": "cross_section" if cross_section else "time_series"}
    baselines = {
        r: {
            "about": r,
            "test_loss": 0.26,
            "test_by_instrument": {n: {"test_loss": 0.26} for n in names},
        }
        for r in RIVALS
    }
    row = {"horizon": 1, **{k: v for k, v in ic.items() if k != "ic_mode"}, "hit_rate": 0.5}
    evaluation = {
        "stride": 4,
        "windows": 900,
        "windows_scored": 225,
        "by_horizon": [row | {"majority_rate": 0.5}],
        "by_instrument": {n: ic | {"ic": float(rng.normal(0, 0.05))} for n in names},
        "quantiles": [0.1, 0.5, 0.9],
        "pinball_by_quantile": [0.1, 0.2, 0.1],
    }
    strategy = {"rule": "sign", "cost_bps": 1.0, **dict.fromkeys(STATS, 0.5)}
    strategy |= {
        "by_instrument": {n: {k: float(rng.normal()) for k in STATS} for n in names},
        "buy_and_hold": dict.fromkeys(STATS, 0.3),
    }
    return {
        "metrics": metrics,
        "baselines": baselines,
        "evaluation": evaluation,
        "strategy": strategy,
    }


def named(lines: list[str]) -> list[str]:
    """The instruments named in `lines`, in order, each as often as it is named."""
    return re.findall(r"\bS\d{3}\b", "\n".join(lines))


def listings(summary: dict) -> dict[str, list[str]]:
    """The lines of each per-instrument listing of a run's summary and report."""
    m = summary["metrics"]
    return {
        "printed": console_summary(summary),
        "per instrument": instrument_table(m["by_instrument"], summary["baselines"]),
        "IC": _quality_section(summary, Path("unused"), plots=False),
        "strategy": _strategy_section(summary, Path("unused")),
    }


@pytest.mark.parametrize("instruments", [21, 30])
def test_a_panel_lists_its_ten_best_and_ten_worst_by_skill_and_the_spread(instruments):
    summary = panel_summary(instruments)
    by = summary["metrics"]["by_instrument"]
    ranking = sorted(by, key=lambda n: -by[n]["skill"])
    best, worst = ranking[:10], ranking[::-1][:10]
    found = listings(summary)
    for listing, lines in found.items():
        assert named(lines) == best + worst, listing  # each once, the rest of the panel never
    printed = found["printed"]
    skills = np.array([by[n]["skill"] for n in ranking])
    spread = next(line for line in printed if line.startswith("skill per instrument: "))
    at = np.quantile(skills, [0, 0.1, 0.25, 0.5, 0.75, 0.9, 1])
    assert spread == (
        f"skill per instrument: {instruments} instruments, {np.mean(skills > 0):.0%} with "
        "positive skill; "
        + ", ".join(
            f"{q} {x:+.1%}"
            for q, x in zip(["min", "10%", "25%", "median", "75%", "90%", "max"], at, strict=True)
        )
    )
    assert printed[printed.index(spread) + 1] == "  best 10: " + ", ".join(
        f"{n} {by[n]['skill']:+.1%}" for n in best
    )
    assert printed[printed.index(spread) + 2].startswith("  worst 10: ")
    table = "\n".join(found["per instrument"])
    assert f"Skill over {instruments} instruments, " in table
    assert "Best 10:" in table and "Worst 10:" in table
    assert f"IC over {instruments} instruments, " in "\n".join(found["IC"])
    assert f"Sharpe ratio over {instruments} instruments, " in "\n".join(found["strategy"])


def test_a_panel_without_skill_is_listed_by_each_listing_s_own_figure():
    # per-instrument skill needs every fold's baselines in a backtest: without, no ranking by it
    summary = panel_summary(30)
    by = summary["metrics"]["by_instrument"]
    for m in by.values():
        m["skill"] = None
    found = listings(summary)
    losses = sorted(by, key=lambda n: by[n]["test_loss"])
    assert named(found["per instrument"]) == losses[:10] + losses[::-1][:10]
    assert "by test loss" in "\n".join(found["per instrument"])
    ics = summary["evaluation"]["by_instrument"]
    ic_order = sorted(ics, key=lambda n: -ics[n]["ic"])
    assert named(found["IC"]) == ic_order[:10] + ic_order[::-1][:10]
    assert "instruments by IC" in "\n".join(found["IC"])
    assert not [line for line in found["printed"] if line.startswith("skill per instrument")]


@pytest.mark.parametrize("instruments", [5, 20])
def test_up_to_twenty_instruments_every_one_is_listed(instruments):
    summary = panel_summary(instruments)
    names = list(summary["metrics"]["by_instrument"])
    found = listings(summary)
    for listing, lines in found.items():
        assert named(lines) == names, listing  # in their own order, as before
        assert "Best 10" not in "\n".join(lines) and "best 10" not in "\n".join(lines)
    (per,) = [line for line in found["printed"] if line.startswith("skill per instrument: ")]
    assert per.endswith(" (lightgbm)") and " instruments, " not in per


def test_a_panel_leads_with_its_cross_sectional_ic():
    printed = console_summary(panel_summary(30))
    assert (
        printed[0]
        == "cross-sectional IC +0.021 (se 0.006, t 3.4, 480 dates), rank IC +0.018 (t 2.9)"
    )
    assert [line for line in printed if "IC +" in line] == [printed[0]]  # once, first
    headline = headline_section(panel_summary(30))
    assert headline[0] == "## Headline"
    assert "**Cross-sectional IC +0.021 (se 0.006, t 3.4, 480 dates)" in headline[2]
    # without a cross-section (instruments that do not share dates): the loss first, as before
    printed = console_summary(panel_summary(30, cross_section=False))
    assert printed[0].startswith("test loss 0.2500")
    pooled = "pooled over dates and names, not by date (too few names a date): "
    assert pooled + "IC +0.021 (se 0.006, t 3.4), rank IC +0.018 (t 2.9)" in printed
    assert headline_section(panel_summary(30, cross_section=False)) == []


def test_a_panel_with_a_book_leads_with_it_and_the_strategy_says_its_lag():
    summary = panel_summary(30)
    summary["strategy"] = {"rule": "sign", "cost_bps": 5.0, "execution_lag": 1, "sharpe": 0.5}
    summary["strategy"] |= {"buy_and_hold": {"sharpe": 0.2}}
    sharpe = {"sharpe": 0.69}
    summary["book"] = {"top": 0.2, "rank": "score", "cost_bps": 5.0, "execution_lag": 1}
    summary["book"] |= {"horizon": 2, "model": sharpe, "best_baseline": sharpe, "market": sharpe}
    printed = console_summary(summary)
    assert printed[0] == (
        "cross-sectional book (top 20% long and short by score, 5 bp costs, traded 1 bar(s) "
        "later on the horizon-2 forecast): Sharpe 0.69 after costs, best baseline's 0.69, the "
        "market 0.69"
    )
    assert printed[1].startswith("cross-sectional IC")
    assert "strategy (sign, 5 bp costs, traded 1 bar(s) later): Sharpe 0.50" in "\n".join(printed)
    summary["book"] = {"skipped": "eval.book=cross_section needs at least 2 instruments"}
    assert console_summary(summary)[0] == (
        "no cross-sectional book: eval.book=cross_section needs at least 2 instruments"
    )


def test_a_panel_leads_with_rank_ic_by_date_beside_the_strongest_baseline_s():
    # what no target transform moves first, the model's beside the baseline's on the same
    # dates; the pinball skill after, labelled with the target it was measured on
    summary = panel_summary(30)
    summary["target"] = {"transform": "xs_demean"}
    summary["metrics"] |= {"calibrated_skill": -0.004}
    sharpe = {"sharpe": 1.44}
    summary["book"] = {"top": 0.2, "rank": "forecast", "cost_bps": 10.0, "execution_lag": 1}
    summary["book"] |= {"horizon": 2, "model": sharpe, "best_baseline": sharpe, "market": sharpe}

    def ic(h, mean, icir, t):
        return {"horizon": h, "rank_ic": mean, "icir": icir, "rank_ic_t": t, "dates": 414}

    summary["book"]["ic_by_horizon"] = [
        ic(1, 0.215, 2.17, 9.1),
        ic(2, 0.1, 1.0, 4.0),
        ic(3, 0, 0, 0),
    ]
    summary["book"]["best_baseline_ic_by_horizon"] = [ic(1, 0.247, 3.03, 12.2)]
    printed = console_summary(summary)
    assert printed[:2] == [
        "rank IC by date (raw returns), horizon 1: model +0.215 (ICIR 2.17, t 9.1), best "
        "baseline +0.247 (ICIR 3.03, t 12.2), over 414 dates",
        "rank IC by date (raw returns), horizon 2: model +0.100 (ICIR 1.00, t 4.0), best "
        "baseline n/a, over 414 dates",
    ]
    assert printed[2].startswith("cross-sectional book (top 20%")
    (loss,) = [line for line in printed if line.startswith("test loss")]
    assert "(quantile loss on the xs_demean target, normalized)" in loss
    assert ", -0.4% both calibrated alike against lightgbm" in loss


def test_a_panels_report_leads_with_its_ic_and_lists_its_splits_not_its_instruments(
    trained, tmp_path
):
    # the data of 30 instruments (one row per split), the trained run's figures otherwise
    table = write_table(
        tmp_path / "panel.parquet", make_table({f"S{i:03d}": 120 for i in range(30)})
    )
    dm = ParquetDataModule(OmegaConf.merge(trained["cfg"].data, {"path": str(table)}))
    dm.setup()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = trained["summary"] | {"metrics": panel_summary(30)["metrics"]}
    interpretation = json.loads((trained["run_dir"] / "interpretation.json").read_text())
    report = write_report(run_dir, trained["cfg"], summary, dm, interpretation, plots=False)
    text = report.read_text()
    assert [line for line in text.splitlines() if line.startswith("## ")][0] == "## Headline"
    data = text.split("## Data")[1].split("\n## ")[0]
    assert (
        "- Instruments (30): S000, S001, S002, S003, S004, S005, S006, S007, S008, S009, ..."
        in data
    )
    rows = [line for line in data.splitlines() if line.startswith("| ")][1:]
    windows = {s: len(dm.datasets[s]) for s in ("train", "val", "test")}
    assert [r.split(" | ")[:3] for r in rows] == [
        [f"| {s}", "30", str(n)] for s, n in windows.items()
    ]
    assert "S010" not in data
