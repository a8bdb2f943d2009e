"""End to end: train, restore from a checkpoint alone, resume, and the CLI's error contract."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from foxhunt.app.train.phases import SUMMARY_METRICS, train
from foxhunt.data.datamodule import ParquetDataModule
from foxhunt.data.splits import iso_time
from foxhunt.errors import CheckpointError, ConfigError
from foxhunt.evaluation.loss import quantile_loss
from foxhunt.training.checkpoint_io import read_checkpoint_hparams
from foxhunt.training.module import TFTModule
from tests.helpers import FIVE_MIN, T0, compose_train, printed_summary, run_cli, tiny_overrides


def epoch_losses(run_dir: Path) -> list[float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return [float(r["train_loss_epoch"]) for r in csv.DictReader(f) if r["train_loss_epoch"]]


@pytest.mark.slow  # 4 CPU-s: the full tier
def test_train_two_epochs_then_restore_from_checkpoint_alone(tmp_path, table_path):
    summary = train(compose_train(*tiny_overrides(table_path)), tmp_path / "run")

    assert summary["epochs"] == 2 and summary["num_features"] == 3
    losses = epoch_losses(tmp_path / "run")
    assert len(losses) == 2 and losses[1] < losses[0]
    assert Path(summary["last_checkpoint"]).name == "last.ckpt"
    for key in SUMMARY_METRICS:
        assert summary["metrics"][key] is not None, key
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    # one calendar for both: the cuts leave 15% and 15% of the 300 distinct times (AAA's) to
    # validation and test; BBB's 200 bars end before the test period
    cuts = dict(summary["splits"]["cuts"])
    # data.calibration_share=0.5: the later half of validation's target times calibrates
    held = cuts.pop("calibration_start")
    assert iso_time(T0 + 210 * FIVE_MIN) < held < iso_time(T0 + 251 * FIVE_MIN)
    assert cuts == {
        "val_start": iso_time(T0 + 210 * FIVE_MIN),
        "test_start": iso_time(T0 + 255 * FIVE_MIN),
        "embargo": 4,  # data.prediction_length
        "train_end": iso_time(T0 + 206 * FIVE_MIN),
        "val_end": iso_time(T0 + 251 * FIVE_MIN),
        "train_start": None,
        "test_end": None,
    }
    assert summary["splits"]["instruments"]["BBB"]["test"] is None
    assert summary["splits"]["instruments"]["AAA"]["test"] == [
        iso_time(T0 + 255 * FIVE_MIN),
        iso_time(T0 + 299 * FIVE_MIN),
    ]

    # the checkpoint alone (no config) rebuilds the model and reproduces the test loss
    restored = TFTModule.load_from_checkpoint(summary["best_checkpoint"], map_location="cpu")
    restored.eval()
    cfg = compose_train(*tiny_overrides(table_path)).data
    dm = ParquetDataModule(cfg, schema=restored.schema)
    dm.setup()
    with torch.no_grad():
        losses, counts = [], []
        for batch in dm.test_dataloader():
            pred = restored(batch)
            losses.append(quantile_loss(pred, batch["target"], restored.quantiles) * pred.numel())
            counts.append(pred.numel())
    assert float(sum(losses) / sum(counts)) == pytest.approx(
        summary["metrics"]["test_loss"], rel=1e-5
    )


@pytest.mark.slow  # two trainings: the full tier (#70)
def test_resume_continues_from_last_checkpoint(tmp_path, table_path):
    first = train(
        compose_train(*tiny_overrides(table_path, "trainer.max_epochs=1")), tmp_path / "a"
    )
    last = Path(first["last_checkpoint"])
    digest = hashlib.sha256(last.read_bytes()).hexdigest()

    resumed = train(
        compose_train(*tiny_overrides(table_path, "trainer.max_epochs=2", f"ckpt_path={last}")),
        tmp_path / "b",
    )
    assert resumed["epochs"] == 2
    assert resumed["global_step"] == 2 * first["global_step"]
    assert hashlib.sha256(last.read_bytes()).hexdigest() == digest  # the original is untouched
    assert Path(resumed["last_checkpoint"]).parent == tmp_path / "b" / "checkpoints"


def test_resume_from_missing_checkpoint_fails_loudly(tmp_path, table_path):
    missing = tmp_path / "gone" / "last.ckpt"
    with pytest.raises(CheckpointError, match=f"checkpoint not found: {missing}"):
        train(compose_train(*tiny_overrides(table_path, f"ckpt_path={missing}")), tmp_path / "r")


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_resume_with_other_model_is_refused(tmp_path, table_path):
    first = train(
        compose_train(*tiny_overrides(table_path, "trainer.max_epochs=1")), tmp_path / "a"
    )
    overrides = tiny_overrides(
        table_path, "model.hidden_dim=32", f"ckpt_path={first['last_checkpoint']}"
    )
    with pytest.raises(ConfigError, match="model.hidden_dim=64"):
        train(compose_train(*overrides), tmp_path / "b")


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, table_path):
    result = run_cli(*tiny_overrides(tmp_path / "missing.parquet"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: data file not found: {tmp_path / 'missing.parquet'}"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_trainer_and_callback_arguments_are_passed_through(tmp_path, table_path):
    overrides = tiny_overrides(
        table_path,
        "trainer.check_val_every_n_epoch=2",  # any lightning.Trainer argument
        "+callbacks.lr_monitor._target_=lightning.pytorch.callbacks.LearningRateMonitor",
        "data.target_kind=level",
    )
    summary = train(compose_train(*overrides), tmp_path / "run")
    # the config's enums reach the checkpoint as plain strings: it loads weights-only
    _, hparams, _ = read_checkpoint_hparams(summary["best_checkpoint"])
    assert type(hparams["schema"]["target_kind"]) is str
    assert type(hparams["optim"]["schedule"]) is str
    assert hparams["optim"]["xs_weight"] == 0.0  # auto: no cross-sectional target on 2 names
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sum(bool(r["val_loss"]) for r in rows) == 1  # validated after epoch 2 only
    assert any(r.get("lr-AdamW") for r in rows)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "trainer.max_epoch=2",
            "error: Could not override 'trainer.max_epoch': Key 'max_epoch' not in "
            "'TrainerConfig' (full_key: trainer.max_epoch)",
        ),
        (
            "data.nan_policy=zero",
            "error: Error merging override data.nan_policy=zero: Invalid value 'zero', "
            "expected one of [error, ffill, drop] (full_key: data.nan_policy)",
        ),
        (
            "model.hidden_dim=abc",
            "error: Error merging override model.hidden_dim=abc: Value 'abc' of type 'str' "
            "could not be converted to Integer (full_key: model.hidden_dim)",
        ),
    ],
)
def test_cli_wrong_override_is_one_line_at_composition(tmp_path, override, message):
    result = run_cli(override, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "outputs").exists()  # refused before the run directory


def test_cli_trainer_setting_lightning_refuses_is_one_line_before_the_data(tmp_path):
    missing = tmp_path / "missing.parquet"  # never read: the trainer is refused first
    result = run_cli(*tiny_overrides(missing, "trainer.accumulate_grad_batches=2"), cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: trainer.accumulate_grad_batches=2 does not work with foxhunt's manual "
            "optimization (Lightning refuses it)"
        )
    )
    assert "Traceback" not in result.stderr


def test_a_value_lightning_refuses_is_one_config_error_before_the_data(tmp_path):
    cfg = compose_train(*tiny_overrides(tmp_path / "missing.parquet", "trainer.devices=foo"))
    with pytest.raises(ConfigError, match="^invalid trainer setting: `devices` selected with"):
        train(cfg, tmp_path / "run")


def test_cli_semantic_error_exits_2(tmp_path):
    result = run_cli("model.num_heads=3", cwd=tmp_path)
    assert result.returncode == 2
    assert "error: model.hidden_dim=64 is not divisible by model.num_heads=3" in result.stderr


@pytest.mark.slow
def test_cli_trains_and_ends_with_a_short_line_naming_its_summary(tmp_path, table_path):
    result = run_cli(*tiny_overrides(table_path, "trainer.max_epochs=1"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    *person, last = result.stdout.strip().splitlines()
    summary = printed_summary(result.stdout)
    # the last line: the run directory, the headline and summary.json's path, not its content
    m = summary["metrics"]
    assert last.startswith(
        f"run {summary['run_dir']}: skill {m['skill']:+.1%} against {m['best_baseline']}, "
        f"test loss {m['test_loss']:.4f}, "
    )
    assert last.endswith(f"; every figure in {Path(summary['run_dir']) / 'summary.json'}")
    assert len(last) < 200 + 2 * len(summary["run_dir"])
    # before the last line, what a person reads: the loss and the skill against the strongest
    first = next(i for i, line in enumerate(person) if line.startswith("test loss "))
    assert person[first].startswith(f"test loss {summary['metrics']['test_loss']:.4f}")
    assert f"against {summary['metrics']['best_baseline']}, the strongest" in person[first]
    cal = summary["calibration"]
    assert person[-1].startswith("calibration (aci): the 0.1-0.9 interval held ")
    assert person[-1].endswith(f": {cal['verdict']}")  # before -> after, and whether it helped
    assert Path(summary["run_dir"]).resolve().is_relative_to(tmp_path.resolve() / "outputs")
    assert Path(summary["best_checkpoint"]).is_file()
    assert (Path(summary["run_dir"]) / "summary.json").is_file()


@pytest.mark.slow
def test_trains_on_ohlcv_features_of_the_es_sample(tmp_path, es_sample):
    overrides = [
        f"data.path={es_sample}",
        "data.encoder_length=32",
        "data.prediction_length=4",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=20",
        "trainer.limit_val_batches=5",
        "trainer.limit_test_batches=5",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.accelerator=cpu",
    ]
    summary = train(compose_train(*overrides), tmp_path / "run")
    assert summary["num_features"] == 24 and summary["global_step"] == 20  # 18 + gap_1 + 5
    assert summary["metrics"]["baseline_test_loss"] > 0
    # a return's MAE is logged in basis points too (the progress bar shows that one)
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("val_mae")]
    assert float(row["val_mae_bps"]) == pytest.approx(float(row["val_mae"]) * 1e4, rel=1e-5)
    assert 1 < float(row["val_mae_bps"]) < 100  # 5-minute returns: a few basis points
    # what a quant reads: the IC with its error, the probabilistic scores, a costed strategy
    m, strategy = summary["metrics"], summary["strategy"]
    for key in ("ic", "rank_ic"):
        assert -1 <= m[key] <= 1 and m[f"{key}_se"] > 0
        assert m[f"{key}_t"] == pytest.approx(m[key] / m[f"{key}_se"])
    assert m["crps"] > 0 and m["winkler"] > 0
    assert summary["evaluation"]["stride"] == 4  # the prediction length: no overlap
    assert len(summary["evaluation"]["by_horizon"]) == 4
    assert strategy["rule"] == "sign" and strategy["cost_bps"] == 5.0
    assert {"sharpe", "max_drawdown", "turnover", "net_return"} <= set(strategy)
    assert set(strategy["by_instrument"]) == set(m["by_instrument"])
    assert strategy["best_baseline"]["name"] == m["best_baseline"]


@pytest.mark.slow
def test_compiled_model_trains_and_resumes_eager(tmp_path, table_path):
    failures = torch._dynamo.utils.guard_failures  # code -> why each of its graphs was redone
    before = {code: len(reasons) for code, reasons in failures.items()}
    overrides = tiny_overrides(
        table_path,
        "model.compile=true",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
    )
    # inductor's C++ kernels without SIMD: what is tested here is the same, and a cold compile
    # (every CI run's) takes 20% less of its ~150 s on a CPU
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        first = train(compose_train(*overrides), tmp_path / "a")
    assert first["global_step"] > 0
    redone = [r for code, reasons in failures.items() for r in reasons[before.get(code, 0) :]]
    assert redone  # training and validation (grad mode), a smaller last batch
    # the test stage and forecasts run under no_grad like the validation (inference_mode's
    # tensors fail a graph's guards), and the selection's chunks do not depend on the batch
    assert not [r for r in redone if "dispatch key" in r or "//" in r], redone
    resumed = train(
        compose_train(
            *tiny_overrides(
                table_path, "trainer.max_epochs=2", f"ckpt_path={first['last_checkpoint']}"
            )
        ),
        tmp_path / "b",
    )
    assert resumed["epochs"] == 2


@pytest.mark.slow  # 6 CPU-s: the full tier
def test_early_stopping_ends_on_the_best_epochs_weights(tmp_path, table_path):
    # y is a random walk of noise: the validation loss soon stops improving
    overrides = tiny_overrides(
        table_path, "trainer.max_epochs=12", "callbacks.early_stopping_patience=2", "optim.lr=1e-2"
    )
    summary = train(compose_train(*overrides), tmp_path / "run")

    training = summary["training"]
    scores = training["val_loss"]
    assert training["stopped"] == "early_stopping" and not training["still_improving"]
    assert summary["epochs"] < 12 and len(scores) == summary["epochs"]
    best = training["best_epoch"]
    assert scores[best] == min(scores) and best == summary["epochs"] - 1 - 2  # patience 2
    assert f"best-epoch{best}-" in Path(summary["best_checkpoint"]).name
    # the model the run ends with (tested and exported) is that epoch's, bit for bit
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)
    exported = load_file(summary["export"])
    own = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    assert exported.keys() <= own.keys() and exported
    assert all(torch.equal(v, own[k]) for k, v in exported.items())
    last = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)
    assert any(not torch.equal(v, last["state_dict"]["model." + k]) for k, v in exported.items())


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_a_run_stopped_at_the_ceiling_while_improving_says_so(tmp_path, table_path):
    summary = train(compose_train(*tiny_overrides(table_path)), tmp_path / "run")
    training = summary["training"]
    scores = training["val_loss"]
    assert training["stopped"] == "max_epochs" and len(scores) == 2
    assert training["still_improving"] == (scores[1] < scores[0])


@pytest.mark.slow  # 2 CPU-s: the full tier
def test_the_schedule_sized_in_steps_ends_the_training(tmp_path, table_path):
    overrides = tiny_overrides(
        table_path,
        "trainer.max_epochs=50",
        "optim.schedule_steps=45",
        "+callbacks.lr_monitor._target_=lightning.pytorch.callbacks.LearningRateMonitor",
    )
    summary = train(compose_train(*overrides), tmp_path / "run")
    # rounded up to whole epochs, so the schedule's end is validated
    batches = summary["global_step"] // summary["epochs"]
    assert summary["epochs"] == -(-45 // batches) > 1
    assert summary["training"]["stopped"] == "schedule" and len(summary["training"]["val_loss"])
    # the cosine reached its end there: the last step's learning rate is (nearly) zero
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        rates = [float(r["lr-AdamW"]) for r in csv.DictReader(f) if r.get("lr-AdamW")]
    assert rates and rates[-1] < 0.02 * max(rates)
