"""The ONNX export: ONNX Runtime against the PyTorch model, the reference consumer against
predict.py, and bad input as one line. Two tiny models, each trained and exported once: one on
columns of the file (a level target, a known input given in the rows to forecast), one on the
ES futures sample (derived OHLCV features, calendar inputs, contracts rolled into one root)."""

from __future__ import annotations

import importlib
import io
import json
import runpy
import shutil
import subprocess
import sys
import venv
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import needs

pytest.importorskip("onnxruntime")
needs("onnxscript")

from foxhunt_serve import cli, forecast  # noqa: E402
from foxhunt_serve.errors import InputError  # noqa: E402

import foxhunt  # noqa: E402
from foxhunt.app.predict.export import JSON_FILE, ONNX_FILE, export_dir, export_onnx  # noqa: E402
from foxhunt.app.predict.windows import build_windows  # noqa: E402
from foxhunt.app.train.phases import train  # noqa: E402
from foxhunt.config import DataConfig  # noqa: E402
from foxhunt.data.datamodule import ParquetDataModule  # noqa: E402
from foxhunt.data.futures import continuous_table  # noqa: E402
from foxhunt.data.schema import footer_schema  # noqa: E402
from foxhunt.data.section import DataSection  # noqa: E402
from foxhunt.data.serving import features, target_section, trained_section  # noqa: E402
from foxhunt.models import fused_vsn  # noqa: E402
from foxhunt.models.tft import TemporalFusionTransformer  # noqa: E402
from foxhunt.precision.onnx import (  # noqa: E402
    ExportError,
    Int8Grid,
    difference,
    exportable,
    onnx_feed,
    onnx_inputs,
    onnx_session,
)
from foxhunt.quantization.qat import (  # noqa: E402
    _QuantizeInput,
    export_int8,
    prepare_qat,
    set_qat_phase,
)
from foxhunt.training.module import TFTModule, model_init  # noqa: E402
from tests.helpers import (  # noqa: E402
    DAY,
    PREDICT_BATCH,
    ROOT,
    build_wheels,
    checked_run,
    compose_train,
    contracts_table,
    listing,
    make_table,
    ns,
    pip_env,
    run_script,
    session_bars,
    session_times,
    shared_dir,
    tiny_overrides,
    walked_from_the_run_s_start,
    write_table,
)

H = 4  # both models' forecast steps
TAIL = 30  # rows per instrument in the plain model's prediction file, the last H to forecast
EXAMPLE = ROOT / "examples" / "onnx_predict.py"
QUANTILE_COLUMNS = ("q0.1", "q0.5", "q0.9")
SMALL = ("model.hidden_dim=16", "model.num_heads=2", "model.variable_dim=4")
BRIEF = ("trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1")


def _last_rows(symbols: np.ndarray, k: int) -> np.ndarray:
    """Mask of each instrument's last k rows (rows grouped by instrument, in time order)."""
    mask = np.zeros(len(symbols), dtype=bool)
    for s in np.unique(symbols):
        mask[np.flatnonzero(symbols == s)[-k:]] = True
    return mask


def _trained(cfg, run: Path) -> Path:
    """Train `cfg` into `run`, leaving its config where train.py's Hydra run leaves it."""
    summary = train(cfg, run)
    (run / ".hydra").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    return Path(summary["best_checkpoint"])


def consumer(*args: str) -> tuple[int, str, str]:
    """The foxhunt-serve command, in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _build_plain(root: Path) -> None:
    cols = make_table({"AAA": 300, "BBB": 200})
    cols["w"] = np.where(cols["symbol"] == "AAA", 1.5, -2.0)  # a static real per instrument
    train_path = write_table(
        root / "train.parquet", {k: v[~_last_rows(cols["symbol"], H)] for k, v in cols.items()}
    )
    # with the instrument embedding (not the default): its ONNX input and its unseen row
    embedded = ("data.static_features=[w]", "model.instrument_embedding=true")
    cfg = compose_train(*tiny_overrides(train_path, *BRIEF, *embedded), *SMALL)
    ckpt = _trained(cfg, root / "run")
    tail = {k: v[_last_rows(cols["symbol"], TAIL)] for k, v in cols.items()}
    future = _last_rows(tail["symbol"], H)
    for k in ("y", "f1", "f2"):
        tail[k] = np.where(future, np.nan, tail[k])
    code, stdout, stderr = run_script(
        "export.py",
        f"ckpt_path={ckpt}",
        f"export.out={root / 'onnx'}",
        f"hydra.run.dir={root / 'export_run'}",
    )
    assert code == 0, stderr
    write_table(root / "tail.parquet", tail)
    (root / "export_stdout.txt").write_text(stdout)
    (root / "ckpt.txt").write_text(str(ckpt))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Trained on all but each instrument's last H rows, exported with `foxhunt export` (once
    per session, shared by the workers: read only); the prediction file is the last TAIL rows,
    target and observed inputs of the last H emptied."""
    with shared_dir(tmp_path_factory, "plain") as (root, fresh):
        if fresh:
            _build_plain(root)
    return SimpleNamespace(
        root=root,
        ckpt=Path((root / "ckpt.txt").read_text()),
        export=root / "onnx",
        stdout=(root / "export_stdout.txt").read_text(),
        data=root / "tail.parquet",
    )


@pytest.fixture(scope="module")
def futures(tmp_path_factory: pytest.TempPathFactory, es_sample: Path) -> SimpleNamespace:
    """Trained on the ES sample (contracts ESH6 and ESM6, rolled into ES), exported."""
    root = tmp_path_factory.mktemp("futures")
    cfg = compose_train(
        "data=es_fut_small",
        f"data.path={es_sample}",
        "data.generate_if_missing=false",
        "data.encoder_length=32",
        f"data.prediction_length={H}",
        "data.batch_size=16",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.accelerator=cpu",
        "report=false",
        *BRIEF,
        *SMALL,
    )
    ckpt = _trained(cfg, root / "run")
    result = export_onnx(ckpt, root / "onnx")
    return SimpleNamespace(root=root, ckpt=ckpt, export=root / "onnx", data=es_sample, **result)


@pytest.fixture(scope="module")
def int8(plain: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The plain model's int8 export (QAT ranges observed on the tail's windows), exported."""
    module = TFTModule.load_from_checkpoint(plain.ckpt, map_location="cpu")
    predictor = foxhunt.load(plain.ckpt, batch_size=64)
    cfg = predictor.data_cfg.copy()
    cfg.path = str(plain.data)
    dataset = build_windows(pq.read_table(plain.data), cfg, module.schema, True).dataset
    model = prepare_qat(module.model).eval()
    set_qat_phase(model, observe=True, fake_quant=True)
    with torch.no_grad():
        model(dataset.__getitems__(list(range(len(dataset)))))
    set_qat_phase(model, observe=False, fake_quant=True)
    root = tmp_path_factory.mktemp("int8")  # plain's run is shared by the workers: a copy
    run = Path(shutil.copytree(plain.ckpt.parents[1], root / "run"))
    path = run / "checkpoints" / "model_int8.safetensors"  # beside the checkpoints: config found
    export_int8(
        model, model_init(module.hparams.model, module.schema), path, module.schema.to_dict()
    )
    result = export_onnx(path, root / "onnx")
    return SimpleNamespace(path=path, export=root / "onnx", dataset=dataset, **result)


def _windows(predictor, path: Path, split: str) -> object:
    """The `split` windows of the data at `path`, normalized with the model's schema."""
    cfg = predictor.data_cfg.copy()
    cfg.path = str(path)
    datamodule = ParquetDataModule(cfg, schema=predictor.schema)
    datamodule.setup()
    return datamodule.datasets[split]


def _parity(session, model, dataset, schema, batch: int) -> tuple[float, float]:
    """(largest absolute, relative) difference of ONNX Runtime against `model` on `batch`
    windows of `dataset` (cycled through when it holds fewer)."""
    windows = dataset.__getitems__([i % len(dataset) for i in range(batch)])
    got = session.run(["quantiles"], onnx_feed(windows, schema, model.instrument_rows))[0]
    with torch.no_grad():
        want = model(windows).numpy()
    return difference(got, want)


def _same_forecasts(got: pa.Table, want: pa.Table) -> None:
    """The same rows, times, horizons and actuals; quantiles within 1e-4 relative."""
    assert got.schema.equals(want.schema)
    quantiles = [c for c in want.column_names if c.startswith("q")]
    others = [c for c in want.column_names if c not in quantiles]
    assert got.num_rows == want.num_rows > 0
    assert got.select(others).equals(want.select(others))
    a, b = (np.column_stack([t[c].to_numpy() for c in quantiles]) for t in (got, want))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


# --- the export ------------------------------------------------------------------------------


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_export_writes_the_model_and_its_description(plain):
    meta = json.loads((plain.export / JSON_FILE).read_text())
    assert meta["format"] == "foxhunt-onnx" and meta["foxhunt_version"]
    assert meta["instruments"] == ["AAA", "BBB"] and meta["quantiles"] == [0.1, 0.5, 0.9]
    assert (meta["encoder_length"], meta["prediction_length"]) == (16, H)
    assert [(i["name"], i["dtype"], i["shape"]) for i in meta["inputs"]] == [
        ("encoder_observed", "float32", ["batch", 16, 3]),
        ("encoder_known", "float32", ["batch", 16, 1]),
        ("decoder_known", "float32", ["batch", H, 1]),
        ("static_real", "float32", ["batch", 2]),  # w, then the target's scale
        ("instrument", "int64", ["batch"]),
    ]
    assert meta["inputs"][0]["features"] == ["y", "f1", "f2"]
    schema = foxhunt.load(plain.ckpt).schema
    assert meta["target"] == {
        "name": "y",
        "kind": "level",
        "mean": schema.target_center,
        "std": schema.target_scale,
        "means": schema.target_centres,  # AAA's and BBB's own
        "stds": schema.target_scales,
        "anchored": True,
    }
    assert len(schema.target_scales) == 2 and schema.target_scales[0] != schema.target_scales[1]
    assert meta["features"]["f2"]["mean"] == schema.input_mean[2]
    assert meta["features"]["w"] == {
        "role": "static",
        "source": "column",
        "column": "w",
        "mean": schema.static_mean[0],
        "std": schema.static_std[0],
    }
    assert meta["features"]["target_scale"] == {
        "role": "static",
        "source": "target_scale",
        "mean": schema.static_mean[1],
        "std": schema.static_std[1],
    }
    assert meta["data"]["columns_read"] == ["k1", "w", "y", "f1", "f2"]
    # ONNX Runtime reads the inputs and output model.json names, the batch dimension dynamic
    session = onnx_session(plain.export / ONNX_FILE)
    found = [(i.name, i.type, i.shape) for i in session.get_inputs()]
    assert [(n, t, s[1:]) for n, t, s in found] == [
        (i["name"], f"tensor({'float' if i['dtype'] == 'float32' else 'int64'})", i["shape"][1:])
        for i in meta["inputs"]
    ]
    assert all(isinstance(s[0], str) for _, _, s in found)
    assert [o.name for o in session.get_outputs()] == ["quantiles"]
    # the command's last line is the result as JSON, the parity measured before writing
    result = json.loads(plain.stdout.splitlines()[-1])
    assert result["verification"]["batch_sizes"] == [1, 7]
    assert result["verification"]["max_rel_diff"] <= 1e-4


@pytest.mark.slow  # 12 CPU-s: the full tier
@pytest.mark.parametrize("batch", [1, 7, 1024])
def test_onnx_runtime_matches_the_model_on_the_test_windows(futures, batch):
    predictor = foxhunt.load(futures.ckpt)
    dataset = _windows(predictor, futures.data, "test")
    session = onnx_session(futures.export / ONNX_FILE)
    _, rel = _parity(session, predictor.model, dataset, predictor.schema, batch)
    print(f"fp32 batch {batch}: max relative difference {rel:.2g}")
    assert rel <= 1e-4


@pytest.mark.slow  # 13 CPU-s: the full tier
def test_the_int8_export_exports(int8):
    """ONNX Runtime against the model it was exported from (int8 weights, inputs rounded to
    their int8 grid, LSTMs float of their int8 weights), and against foxhunt.load's int8 model
    (whose LSTMs also quantize their activations): close, not equal."""
    assert int8.precision == "int8" and int8.verification["max_rel_diff"] <= 1e-2
    predictor = foxhunt.load(int8.path)
    loaded = foxhunt.load(int8.path)
    model, _ = exportable(loaded.model, loaded.schema, loaded.precision, int8.path)
    session = onnx_session(int8.export / ONNX_FILE)
    for batch in (1, 7, 1024):
        windows = int8.dataset.__getitems__([i % len(int8.dataset) for i in range(batch)])
        got = session.run(["quantiles"], onnx_feed(windows, predictor.schema))[0]
        with torch.no_grad():
            same = model.model(windows).numpy()
            dynamic = predictor.model(windows).numpy()
        # a layer's input on an int8 rounding step can round the other way after float
        # rounding upstream: then its window moves by up to a few 1e-3, so the mean is bounded
        rel = difference(got, same)[1]
        mean_rel = np.abs(got - same).mean() / np.abs(same).max()
        within = np.mean(np.abs(got - same) <= 1e-4 * np.abs(same).max())
        against = np.abs(got - dynamic).mean() / dynamic.std()
        print(
            f"int8 batch {batch}: max relative difference {rel:.2g}, mean {mean_rel:.1g} "
            f"({within:.1%} of the quantiles within 1e-4); against foxhunt.load's int8 mean "
            f"|diff| / std {against:.2g}"
        )
        assert rel <= 1e-2 and mean_rel <= 1e-3 and against < 0.05
    # each layer's input rounded to its int8 grid as torch's fake quantization rounds it
    hooks = [h for m in predictor.model.modules() for h in m._forward_pre_hooks.values()]
    grids = [h for h in hooks if isinstance(h, _QuantizeInput)]
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 5
    for hook in grids:
        want = torch.fake_quantize_per_tensor_affine(x, hook.scale, hook.zero_point, 0, 255)
        assert torch.equal(Int8Grid(hook.scale, hook.zero_point)(None, (x,))[0], want)
    assert len(grids) > 10


# --- the reference consumer ------------------------------------------------------------------


@pytest.mark.slow  # 15 CPU-s: the full tier
@pytest.mark.parametrize("model", ["plain", "futures"])
@pytest.mark.parametrize("all_windows", [False, True])
def test_the_consumer_forecasts_as_predict_py(model, all_windows, request, tmp_path):
    m = request.getfixturevalue(model)
    extra = ["predict.all_windows=true"] if all_windows else []
    code, _, stderr = run_script(
        "predict.py",
        f"ckpt_path={m.ckpt}",
        f"data.path={m.data}",
        f"predict.out={tmp_path / 'predict.parquet'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        *extra,
    )
    assert code == 0, stderr
    flag = ["--all-windows"] if all_windows else []
    code, stdout, stderr = consumer(m.export, m.data, tmp_path / "onnx.parquet", *flag)
    assert code == 0, stderr
    assert stdout.strip().endswith(str(tmp_path / "onnx.parquet"))
    _same_forecasts(
        pq.read_table(tmp_path / "onnx.parquet"), pq.read_table(tmp_path / "predict.parquet")
    )


@pytest.mark.slow  # 25 CPU-s: the full tier
@pytest.mark.parametrize(
    "all_windows",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # the fast tier < 120 s
)
@pytest.mark.parametrize("method", ["cqr", "aci"])
def test_the_consumer_calibrates_as_predict_py(plain, method, all_windows, tmp_path):
    """model.json's calibration applied by the consumer: predict.py's forecasts within 1e-5
    relative, CQR's static offsets or ACI's, which follow the realized targets in the data."""
    export = tmp_path / "onnx"
    shutil.copytree(plain.export, export)
    meta = json.loads((export / JSON_FILE).read_text())
    assert meta["calibration"]["method"] == "aci" and meta["calibration"]["offsets"]["*"]
    meta["calibration"]["method"] = method  # what an export of a method=<method> run holds
    (export / JSON_FILE).write_text(json.dumps(meta))
    flag = ["--all-windows"] if all_windows else []
    found = {}
    for name in (method, "none"):
        code, _, stderr = run_script(
            "predict.py",
            f"ckpt_path={plain.ckpt}",
            f"data.path={plain.data}",
            f"predict.out={tmp_path / name}.parquet",
            f"predict.calibration={name}",
            f"predict.all_windows={all_windows}",
            f"hydra.run.dir={tmp_path / name}",
        )
        assert code == 0, stderr
        found[name] = pq.read_table(tmp_path / f"{name}.parquet")
    code, _, stderr = consumer(export, plain.data, tmp_path / "onnx.parquet", *flag)
    assert code == 0, stderr
    got, want = pq.read_table(tmp_path / "onnx.parquet"), found[method]
    assert got.select(["instrument", "origin_time", "horizon"]).equals(
        want.select(["instrument", "origin_time", "horizon"])
    )
    a, b = (np.column_stack([t[c].to_numpy() for c in QUANTILE_COLUMNS]) for t in (got, want))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
    uncalibrated = np.column_stack([found["none"][c].to_numpy() for c in QUANTILE_COLUMNS])
    assert not np.allclose(b, uncalibrated)  # the calibration moved the intervals
    np.testing.assert_allclose(b[:, 1], uncalibrated[:, 1], atol=1e-5 * np.abs(b).max())  # median


@pytest.mark.slow  # 20 CPU-s: the full tier
def test_the_consumer_needs_neither_torch_nor_foxhunt(futures, tmp_path):
    """Run where importing torch or foxhunt fails: the same forecasts."""
    blocked = (
        "import importlib.abc, runpy, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'foxhunt'):\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "runpy.run_module('foxhunt_serve', run_name='__main__')\n"
    )
    out = tmp_path / "blocked.parquet"
    args = [str(futures.export), str(futures.data), str(out), "--all-windows"]
    done = subprocess.run(
        [sys.executable, "-c", blocked, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    code, _, stderr = consumer(
        futures.export, futures.data, tmp_path / "here.parquet", "--all-windows"
    )
    assert code == 0, stderr
    assert pq.read_table(out).equals(pq.read_table(tmp_path / "here.parquet"))


@pytest.mark.slow  # 30 CPU-s, and pip installs numpy, pyarrow and onnxruntime: the full tier
def test_the_serving_package_alone_forecasts_as_predict_without_torch(futures, tmp_path):
    """foxhunt-serve's wheel in a fresh virtualenv, with its dependencies and nothing else:
    torch and foxhunt do not import there, and its forecasts are predict's."""
    _, serve_wheel = build_wheels(tmp_path / "dist")
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python, env = fresh / "bin" / "python", pip_env()
    checked_run(sys.executable, "-m", "pip", "--python", python, "install", "-q", serve_wheel,
                cwd=tmp_path, env=env)  # fmt: skip
    for absent in ("torch", "foxhunt"):
        probe = subprocess.run([python, "-c", f"import {absent}"], capture_output=True, env=env)
        assert probe.returncode == 1 and b"ModuleNotFoundError" in probe.stderr, absent
    served = tmp_path / "served.parquet"
    args = (futures.export, futures.data, served, "--all-windows")
    checked_run(fresh / "bin" / "foxhunt-serve", *args, cwd=tmp_path, env=env)
    code, _, stderr = run_script(
        "predict.py",
        f"ckpt_path={futures.ckpt}",
        f"data.path={futures.data}",
        f"predict.out={tmp_path / 'predict.parquet'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "predict.all_windows=true",
    )
    assert code == 0, stderr
    _same_forecasts(pq.read_table(served), pq.read_table(tmp_path / "predict.parquet"))


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_a_name_listed_after_training_is_forecast_by_predict_and_the_consumer_alike(
    plain, tmp_path
):
    """BBB's bars renamed CCC: a name the model has not seen, forecast through the embedding's
    unseen row on the pooled scale by both, within the parity tolerance; AAA as before."""
    tail = pq.read_table(plain.data)
    names = np.array(tail["symbol"].to_pylist())
    renamed = tail.set_column(
        tail.schema.get_field_index("symbol"),
        "symbol",
        pa.array(np.where(names == "BBB", "CCC", names)),
    )
    path = tmp_path / "renamed.parquet"
    pq.write_table(renamed, path)
    meta = json.loads((plain.export / JSON_FILE).read_text())
    assert meta["unseen_instruments"] and meta["instruments"] == ["AAA", "BBB"]
    predictor = foxhunt.load(plain.ckpt, device="cpu", batch_size=PREDICT_BATCH)
    want = predictor.predict(path)
    code, _, stderr = consumer(plain.export, path, tmp_path / "onnx.parquet")
    assert code == 0, stderr
    _same_forecasts(pq.read_table(tmp_path / "onnx.parquet"), want)
    assert sorted(set(want["instrument"].to_pylist())) == ["AAA", "CCC"]
    before = predictor.predict(plain.data)
    aaa = [t.filter(pc.equal(t["instrument"], "AAA")) for t in (want, before)]
    assert aaa[0].equals(aaa[1])
    bbb, ccc = (t.filter(pc.equal(t["instrument"], n)) for t, n in ((before, "BBB"), (want, "CCC")))
    assert not np.allclose(bbb["q0.5"].to_numpy(), ccc["q0.5"].to_numpy())  # not BBB's row


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_a_name_too_short_for_the_encoder_is_left_out_with_one_warning(plain, tmp_path, caplog):
    """AAA listed days ago (18 rows, 4 of them to forecast): predict and the consumer forecast
    BBB alike, each with one warning naming AAA, where they refused the whole file."""
    tail = pq.read_table(plain.data)
    names = np.array(tail["symbol"].to_pylist())
    path = tmp_path / "listed.parquet"
    pq.write_table(tail.filter(_last_rows(names, 18) | (names == "BBB")), path)
    with caplog.at_level("WARNING"):
        want = foxhunt.load(plain.ckpt, device="cpu", batch_size=PREDICT_BATCH).predict(path)
        code, _, stderr = consumer(plain.export, path, tmp_path / "onnx.parquet")
    assert code == 0, stderr
    said = [r.getMessage() for r in caplog.records if "too short a history" in r.getMessage()]
    assert len(said) == 2, said  # once each
    assert all("AAA has 14 (of 14 in the data)" in s and "BBB" not in s for s in said)
    assert set(want["instrument"].to_pylist()) == {"BBB"}
    _same_forecasts(pq.read_table(tmp_path / "onnx.parquet"), want)


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_consumer_bad_input_is_one_line(plain, tmp_path):
    tail = pq.read_table(plain.data)
    renamed = tail.set_column(
        tail.schema.get_field_index("symbol"),
        "symbol",
        pa.array(["CCC" if s == "BBB" else s for s in tail["symbol"].to_pylist()]),
    )
    # a model.json written before names listed after training were forecast
    before = Path(shutil.copytree(plain.export, tmp_path / "before"))
    meta = json.loads((before / "model.json").read_text())
    del meta["unseen_instruments"]
    (before / "model.json").write_text(json.dumps(meta))
    cases = {
        "unknown instruments": (renamed, "instruments unknown to the model: CCC", before),
        "a missing column": (tail.drop_columns(["f2"]), "missing column(s) f2", plain.export),
    }
    for name, (table, message, export) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        code, _, stderr = consumer(export, path, tmp_path / "out.parquet")
        assert code == 2 and stderr.count("\n") == 1 and message in stderr, (name, stderr)
    code, _, stderr = consumer(plain.export, plain.data, plain.data)
    assert code == 2 and "is the input data" in stderr
    changed = Path(shutil.copytree(plain.export, tmp_path / "changed"))
    (changed / ONNX_FILE).write_bytes(b"")
    code, _, stderr = consumer(changed, plain.data, tmp_path / "out.parquet")
    assert code == 2 and "is not the one model.json describes" in stderr


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_the_example_prints_each_instruments_latest_forecast(plain, capsys):
    """examples/onnx_predict.py: one line per instrument and step, its quantiles in order, the
    median foxhunt-serve's."""
    main = runpy.run_path(str(EXAMPLE))["main"]
    assert main(str(plain.export), str(plain.data)) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert sorted({r[0] for r in rows}) == ["AAA", "BBB"] and len(rows) == 2 * H
    low, median, high = (np.array([float(r[k]) for r in rows]) for k in (2, 3, 4))
    assert (low <= median).all() and (median <= high).all()
    served = forecast.predict(plain.export, plain.data)
    np.testing.assert_array_equal(median, served.column("q0.5").to_numpy())


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_a_forecaster_keeps_its_session_open_across_tables(plain, tmp_path):
    """foxhunt_serve.Forecaster opens ONNX Runtime once; each table of bars it is given (a live
    loop's) gets the forecasts foxhunt-serve writes for that table's file."""
    served = forecast.Forecaster(plain.export)
    session = served.session
    full = pq.read_table(plain.data)
    for k, table in enumerate((full.slice(3), full, full.slice(3))):
        got = served.predict(table)
        assert served.session is session
        pq.write_table(table, tmp_path / f"{k}.parquet")
        assert got.equals(forecast.predict(plain.export, tmp_path / f"{k}.parquet"))
        assert sorted(set(got["instrument"].to_pylist())) == ["AAA", "BBB"]


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_a_forecaster_runs_the_model_on_the_new_bar_s_windows_alone(plain, tmp_path):
    """In a live loop a call a bar later runs the model on the window that bar made, each
    name's; the others' outputs are kept from the call before (by what the model reads of
    them). Its forecasts are a fresh session's; the same table again runs nothing."""
    tail = pq.read_table(plain.data)
    cols = {c: tail[c].to_numpy(zero_copy_only=False) for c in tail.column_names}
    symbol = cols["symbol"]
    last_bar = _last_rows(symbol, H + 1) & ~_last_rows(symbol, H)  # each name's last target
    for k in ("y", "f1", "f2"):
        cols[k] = np.where(last_bar, np.nan, cols[k])
    earlier = write_table(
        tmp_path / "earlier.parquet", {k: v[~_last_rows(symbol, 1)] for k, v in cols.items()}
    )
    served, ran = forecast.Forecaster(plain.export), []
    session = served.session
    served.session = SimpleNamespace(
        run=lambda names, feed: (
            ran.append(len(feed["encoder_observed"])) or session.run(names, feed)
        )
    )
    served.predict(earlier)
    assert sum(ran) > 2
    ran.clear()
    got = served.predict(tail)
    assert sum(ran) == 2  # AAA's and BBB's new latest window
    want = forecast.predict(plain.export, plain.data)
    for column in want.column_names:
        if column.startswith("q"):
            np.testing.assert_allclose(got[column], want[column], rtol=1e-6, atol=1e-7)
        else:
            assert got[column].equals(want[column]), column
    ran.clear()
    served.predict(tail)
    assert ran == []


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.slow  # the shared export, 13 s to build: the full tier (#70)
def test_export_errors_are_one_line(plain, tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / JSON_FILE).write_text("{}")
    cases = [
        ([f"ckpt_path={tmp_path / 'missing.ckpt'}"], "checkpoint not found"),
        ([f"ckpt_path={garbage}"], "refused to load"),
        ([], "ckpt_path is required"),
        ([f"ckpt_path={plain.ckpt}", "export.opset=17"], "export.opset must be 18 or later"),
        ([f"ckpt_path={plain.ckpt}", "export.opset=x"], "could not be converted to Integer"),
        ([f"ckpt_path={plain.ckpt}", f"export.out={taken}"], "holds model.json already"),
    ]
    for args, message in cases:
        code, _, stderr = run_script("export.py", *args, f"hydra.run.dir={tmp_path / 'run'}")
        assert code == 2 and stderr.count("\n") == 1, (args, stderr)
        assert stderr.startswith("error: ") and message in stderr, (args, stderr)
    assert (taken / JSON_FILE).read_text() == "{}"  # not overwritten
    assert export_dir(taken, overwrite=True) == taken.resolve()
    qat = SimpleNamespace(precision={"name": "int8"}, model=torch.nn.Linear(1, 1))
    with pytest.raises(ExportError, match="export the int8 export its run wrote beside it"):
        exportable(qat.model, None, qat.precision, plain.ckpt)


@torch.library.custom_op("foxhunt_test::opaque", mutates_args=())
def _opaque(x: torch.Tensor) -> torch.Tensor:
    """An op torch.export captures and no ONNX translation exists for."""
    return x.clone()


@_opaque.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@pytest.mark.slow  # 10 CPU-s: the full tier
def test_a_model_that_cannot_export_names_the_op(plain, tmp_path, monkeypatch):
    forward = TemporalFusionTransformer.forward
    monkeypatch.setattr(
        TemporalFusionTransformer, "forward", lambda self, x: _opaque(forward(self, x))
    )
    code, _, stderr = run_script(
        "export.py",
        f"ckpt_path={plain.ckpt}",
        f"export.out={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "op foxhunt_test.opaque.default has no ONNX translation" in stderr
    assert not (tmp_path / "out" / ONNX_FILE).exists()


@pytest.mark.slow  # 43 CPU-s: the full tier
def test_an_export_onnx_runtime_disagrees_with_is_refused(plain, tmp_path, monkeypatch):
    """What went wrong in other TFT exports: a graph that runs, and forecasts wrong. Here the
    exported variable selection misses its last chunk of variables."""
    chunks = fused_vsn._export_chunks
    monkeypatch.setattr(fused_vsn, "_export_chunks", lambda n, h: chunks(n, h)[:-1] or chunks(n, h))
    monkeypatch.setattr(fused_vsn, "EXPORT_ROW_ELEMENTS", 2)  # one variable a chunk
    with pytest.raises(ExportError, match="differ from the PyTorch model's by"):
        export_onnx(plain.ckpt, tmp_path / "out")
    assert not (tmp_path / "out" / JSON_FILE).exists()


def test_the_inference_path_of_the_fused_vsn():
    """Without gradients the fused variable selection runs its forward without the autograd
    Function: the same numbers; under torch.export its chunks follow from the weights alone."""
    g = torch.Generator().manual_seed(0)
    n, dh, h, rows = 6, 3, 4, 10

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    s = torch.softmax(r(rows, n), -1)
    args = [r(rows, n), s, r(n, dh), r(n, dh), r(n, dh, dh), r(n, dh), r(n, dh, 2 * h)]
    args += [r(n, 2 * h), r(n, h), r(n, h), (r(n, h), r(n, h)), (r(n, h), r(n, h))]
    weights = [a for a in args[2:] if isinstance(a, torch.Tensor)]
    with torch.no_grad():
        plain_out = fused_vsn.selected_grns(*args, dropout=0.0)
    for w in weights:
        w.requires_grad_()
    function_out = fused_vsn.selected_grns(*args, dropout=0.0)  # through _SelectedGRNs
    assert torch.equal(plain_out, function_out.detach())
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.compiler, "is_exporting", lambda: True)
        mp.setattr(fused_vsn, "EXPORT_ROW_ELEMENTS", 16)  # two variables a chunk
        exported = fused_vsn.selected_grns(*args, dropout=0.0)
        assert fused_vsn._export_chunks(n, h) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    torch.testing.assert_close(exported, plain_out, rtol=1e-12, atol=1e-12)


# --- the exchange's clock: the consumer's times and calendar are predict's ------------------

NEW_YORK = {"time_zone": "America/New_York", "close": "16:00"}
RTH = ("09:30", "16:00")


def _rth_config(path: Path, calendar: dict) -> object:
    """A data config on `session_bars` at `path` with the clock `calendar`."""
    cfg = OmegaConf.structured(
        DataConfig(
            path=str(path),
            group_column="symbol",
            features="ohlcv",
            encoder_length=16,
            prediction_length=H,
            lazy=False,
        )
    )
    cfg.calendar = OmegaConf.merge(cfg.calendar, calendar)
    return cfg


def _consumer_meta(cfg, schema) -> dict:
    """model.json's sections that the consumer's windows read (export_onnx writes them so)."""
    return {
        "encoder_length": schema.encoder_length,
        "prediction_length": schema.prediction_length,
        "instruments": list(schema.groups),
        "inputs": onnx_inputs(schema),
        "features": features(schema, cfg),
        "data": trained_section(cfg, schema).as_dict(),
        "target": target_section(schema),
    }


def _consumer_feed(w, meta: dict) -> dict[str, np.ndarray]:
    """The consumer's windows as the ONNX inputs (as `foxhunt_serve.forecast` feeds them)."""
    e, h = meta["encoder_length"], meta["prediction_length"]
    n = len(meta["inputs"][0]["features"])
    enc = w.rows[w.starts[:, None] + np.arange(e)]
    dec = w.rows[w.starts[:, None] + np.arange(e, e + h)][..., n:]
    return {"encoder_observed": enc[..., :n], "encoder_known": enc[..., n:], "decoder_known": dec}


@pytest.mark.parametrize("change", ["2026-03-08", "2026-11-01"])
@pytest.mark.parametrize("end", ["before", "after"])
def test_the_consumer_reads_the_exchange_clock_as_predict(port, tmp_path, change, end):
    """5-minute cash-session bars in New York time to the Friday before a change (the steps
    after the data cross it) or after it (the history crosses it): the consumer's windows,
    from model.json's data.calendar, are predict's: the same times, the steps after the data
    Monday's first bars, and the same calendar inputs, in local time, every window."""
    sunday = np.datetime64(change, "D")
    last = sunday - (2 if end == "before" else -5)
    times = session_times("America/New_York", str(sunday - 26), str(last), RTH)
    path = write_table(tmp_path / "rth.parquet", session_bars(times))
    cfg = _rth_config(path, NEW_YORK)
    datamodule = ParquetDataModule(cfg)
    datamodule.setup()
    schema, table = datamodule.schema, pq.read_table(path)
    meta = json.loads(json.dumps(_consumer_meta(cfg, schema)))  # as model.json holds it
    clock = {k: v for k, v in meta["data"]["calendar"].items() if k != "sessions"}
    assert clock == {**NEW_YORK, "session": "bars", "holidays": [], "exchange": None}
    assert meta["data"]["calendar"]["sessions"]["weeks"]  # learned in training, carried
    monday = session_times("America/New_York", str(last + 3), str(last + 3), RTH)[:H]
    for all_windows in (False, True):
        want = build_windows(table, cfg, schema, all_windows)
        got = port["build_windows"](table, meta, all_windows, str(path))
        assert want.target_ns[-1].tolist() == got.target_ns[-1].tolist() == monday.tolist()
        for fact in ("origin_ns", "target_ns", "target_time_known"):
            np.testing.assert_array_equal(getattr(got, fact), getattr(want, fact), err_msg=fact)
        batch = want.dataset.__getitems__(list(range(len(want.dataset))))
        theirs, ours = onnx_feed(batch, schema), _consumer_feed(got, meta)
        for name, value in ours.items():
            np.testing.assert_array_equal(value, theirs[name], err_msg=name)


@pytest.mark.slow  # 25 CPU-s: the full tier
def test_a_model_on_the_exchange_clock_forecasts_the_next_session(tmp_path):
    """Trained and exported on cash-session bars in New York time up to the Friday before the
    spring change: predict.py and the consumer forecast Monday's first bars, after the change,
    the same forecasts; model.json carries the clock."""
    times = session_times("America/New_York", "2026-02-09", "2026-03-06", RTH)
    path = write_table(tmp_path / "rth.parquet", session_bars(times))
    cfg = compose_train(
        "data=parquet",
        f"data.path={path}",
        "data.group_column=symbol",
        "data.features=ohlcv",
        "data.encoder_length=16",
        f"data.prediction_length={H}",
        "data.batch_size=16",
        "data.calendar.time_zone=America/New_York",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.accelerator=cpu",
        "report=false",
        *BRIEF,
        *SMALL,
    )
    ckpt = _trained(cfg, tmp_path / "run")
    export_onnx(ckpt, tmp_path / "onnx")
    meta = json.loads((tmp_path / "onnx" / JSON_FILE).read_text())
    clock = {k: v for k, v in meta["data"]["calendar"].items() if k != "sessions"}
    assert clock == {**NEW_YORK, "session": "bars", "holidays": [], "exchange": None}
    assert meta["data"]["calendar"]["sessions"]["weeks"]  # learned in training, carried
    code, _, stderr = run_script(
        "predict.py",
        f"ckpt_path={ckpt}",
        f"data.path={path}",
        f"predict.out={tmp_path / 'predict.parquet'}",
        f"hydra.run.dir={tmp_path / 'predict_run'}",
    )
    assert code == 0, stderr
    want = pq.read_table(tmp_path / "predict.parquet")
    monday = session_times("America/New_York", "2026-03-09", "2026-03-09", RTH)[:H]
    assert want["target_time"].cast(pa.int64()).to_pylist() == monday.tolist()
    assert want["target_time_continued"].to_pylist() == [True] * H
    code, _, stderr = consumer(tmp_path / "onnx", path, tmp_path / "onnx.parquet")
    assert code == 0, stderr
    _same_forecasts(pq.read_table(tmp_path / "onnx.parquet"), want)
    windows = build_windows(pq.read_table(path), foxhunt.load(ckpt).data_cfg, _schema(ckpt), False)
    assert windows.target_ns[0].tolist() == monday.tolist()


def _schema(ckpt: Path):
    return TFTModule.load_from_checkpoint(ckpt, map_location="cpu").schema


# --- the consumer's port of foxhunt's data path ----------------------------------------------


@pytest.fixture(scope="module")
def port() -> dict:
    """foxhunt_serve's functions by name."""
    names = ("calibration", "features", "futures", "read", "series", "windows")
    modules = [importlib.import_module(f"foxhunt_serve.{name}") for name in names]
    return {k: v for m in modules for k, v in vars(m).items()} | {"InputError": InputError}


@pytest.mark.parametrize(
    ("rule", "adjust"),
    [("volume", "ratio"), ("days_before_expiry", "difference"), ("fixed", "none")],
)
def test_the_consumer_rolls_futures_as_foxhunt(port, es_sample, rule, adjust):
    cfg = OmegaConf.structured(
        DataConfig(path=str(es_sample), group_column="symbol", features="ohlcv")
    )
    cfg.futures.enabled = True
    cfg.futures.roll.rule, cfg.futures.roll.adjust = rule, adjust
    cfg.futures.roll.dates = ["2026-03-12T14:00"]
    table = pq.read_table(es_sample)
    want, rolls = continuous_table(table, DataSection.of(cfg))
    assert len(rolls) == 1
    got, _ = port["continuous"](table, trained_section(cfg, footer_schema(cfg)).as_dict())
    assert got.equals(want)


@pytest.mark.parametrize(
    ("rule", "confirm", "adjust"),
    [
        ("volume", 3, "ratio"),  # the others in the full tier (#70)
        # never confirmed: each front rolls at its expiry
        pytest.param("volume", 400, "difference", marks=pytest.mark.slow),
        pytest.param("days_before_expiry", 1, "ratio", marks=pytest.mark.slow),
        pytest.param("fixed", 1, "none", marks=pytest.mark.slow),
    ],
)
def test_the_consumer_follows_the_roll_schedule_on_a_full_listing_cut_anywhere(
    port, tmp_path, rule, confirm, adjust
):
    """3-4 listed months at once, the file cut every 5 days across a quarter: the consumer's
    continuous series is continuous_table's (the front still trading at the cut held, months
    never held left out, an expired front rolled at its last bar; strict: an error line)."""
    table = contracts_table(listing()[0])
    pq.write_table(table, tmp_path / "es.parquet")
    cfg = OmegaConf.structured(
        DataConfig(path=str(tmp_path / "es.parquet"), group_column="symbol", features="ohlcv")
    )
    cfg.futures.enabled = True
    cfg.futures.roll.rule, cfg.futures.roll.confirm_bars = rule, confirm
    cfg.futures.roll.adjust = adjust
    cfg.futures.roll.dates = [f"{y}-{m:02d}-10" for y in (2026, 2027) for m in (3, 6, 9, 12)]
    t = table["timestamp"].cast(pa.int64())
    cuts = ns("2027-08-01") + DAY * np.arange(0, 95, 5)  # across the September 2027 roll
    held = set()
    for cut in cuts:
        part = table.filter(pc.less_equal(t, cut))
        want, rolls = continuous_table(part, DataSection.of(cfg))
        got, _ = port["continuous"](part, trained_section(cfg, footer_schema(cfg)).as_dict())
        assert got.equals(want), cut
        held.add(rolls[-1].to_id)
    assert held == {"ESU7", "ESZ7"}
    if confirm == 400:
        cfg.futures.roll.strict = True
        with pytest.raises(port["InputError"], match="contracts ESH6 and ESM6 overlap on"):
            port["continuous"](table, trained_section(cfg, footer_schema(cfg)).as_dict())


@pytest.mark.slow  # two predicts of the sample: the full tier
def test_the_sample_s_latest_forecasts_from_the_state_are_aci_walked_from_where_the_run_began(
    futures,
):
    """#68's parity on the ES sample (tests.helpers.walked_from_the_run_s_start): ES's latest
    forecasts from ACI's stored state are ACI walked from the run's test split."""
    got, _ = walked_from_the_run_s_start(futures.ckpt, futures.data, futures.root / "run")
    assert got["instrument"].to_pylist() == ["ES"] * H


@pytest.mark.slow  # 6 CPU-s: the full tier
def test_a_file_cut_mid_quarter_forecasts_from_the_contract_held_at_the_cut(futures, tmp_path):
    """The sample cut while the front still trades and the next month is thin (before the
    volume crossover), and after it: predict forecasts ES from the contract held at the cut's
    last bar, the consumer alike."""
    table = pq.read_table(futures.data)
    t = table["timestamp"].cast(pa.int64())
    predictor = foxhunt.load(futures.ckpt)
    (roll,) = continuous_table(table, DataSection.of(predictor.data_cfg))[1]
    hour = 3600 * 10**9
    for cut, held in ((roll.time_ns - 12 * hour, "ESH6"), (roll.time_ns + 6 * hour, "ESM6")):
        part = table.filter(pc.less(t, cut))
        assert {"ESH6", "ESM6"} <= set(part["symbol"].to_pylist())  # both listed at the cut
        rolls = continuous_table(part, DataSection.of(predictor.data_cfg))[1]
        assert [r.to_id for r in rolls] == ([] if held == "ESH6" else ["ESM6"])
        data = tmp_path / f"cut-{held}.parquet"
        pq.write_table(part, data)
        want = predictor.predict(data)
        last = pc.max(part.filter(pc.equal(part["symbol"], held))["timestamp"])
        assert want["instrument"].to_pylist() == ["ES"] * H
        assert want["origin_time"].cast(pa.int64()).to_pylist() == [last.value] * H
        code, _, stderr = consumer(futures.export, data, tmp_path / f"onnx-{held}.parquet")
        assert code == 0, stderr
        _same_forecasts(pq.read_table(tmp_path / f"onnx-{held}.parquet"), want)


@pytest.mark.slow  # 6 CPU-s: the full tier
def test_rows_to_forecast_of_a_contract_forecast_its_root_as_predict_py(futures, tmp_path):
    """Bars to forecast after the last contract's last bar (an empty close): ES's forecast at
    their times, from the consumer as from predict.py."""
    table = pq.read_table(futures.data)
    t = table["timestamp"].cast(pa.int64()).to_numpy()
    last = int(t.max())
    contract = table["symbol"][int(np.argmax(t))].as_py()
    times = last + 300 * 10**9 * np.arange(1, H + 1)
    ahead = {field.name: pa.nulls(H, field.type) for field in table.schema}
    ahead["timestamp"] = pa.array(times).cast(table.schema.field("timestamp").type)
    ahead["symbol"] = pa.array([contract] * H).cast(table.schema.field("symbol").type)
    data = tmp_path / "ahead.parquet"
    pq.write_table(pa.concat_tables([table, pa.table(ahead, schema=table.schema)]), data)
    code, _, stderr = run_script(
        "predict.py",
        f"ckpt_path={futures.ckpt}",
        f"data.path={data}",
        f"predict.out={tmp_path / 'predict.parquet'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert code == 0, stderr
    want = pq.read_table(tmp_path / "predict.parquet")
    assert want["instrument"].to_pylist() == ["ES"] * H
    assert want["target_time"].cast(pa.int64()).to_pylist() == times.tolist()
    code, _, stderr = consumer(futures.export, data, tmp_path / "onnx.parquet")
    assert code == 0, stderr
    _same_forecasts(pq.read_table(tmp_path / "onnx.parquet"), want)


@pytest.mark.slow  # the futures model, 25 s to train: the full tier (#70)
def test_a_short_or_doubled_futures_file_is_one_line_naming_its_contracts(futures, tmp_path):
    """100 rows of ESM6 (4 past the feature warm-up, the encoder needs 32) count as the user
    sees them, by contract; a contract's row given twice names the contract and the time: in
    predict.py and the consumer alike, exit 2 and one line."""
    table = pq.read_table(futures.data)
    esm6 = table.filter(pc.equal(table["symbol"], "ESM6"))
    at = esm6["timestamp"][500].as_py().strftime("%Y-%m-%dT%H:%M:%SZ")
    cases = {
        "short": (esm6.slice(0, 100), "ES has 4 (of 100 in the data: 100 of ESM6)"),
        "twice": (
            pa.concat_tables([table, esm6.slice(500, 1)]),
            f"contract ESM6 has two rows at {at}: one bar per contract and time",
        ),
    }
    for name, (rows, message) in cases.items():
        data = tmp_path / f"{name}.parquet"
        pq.write_table(rows, data)
        out = tmp_path / f"{name}-out.parquet"
        run = (f"ckpt_path={futures.ckpt}", f"data.path={data}", f"predict.out={out}")
        code, _, stderr = run_script("predict.py", *run, f"hydra.run.dir={tmp_path / 'run'}")
        assert code == 2 and stderr.count("\n") == 1 and message in stderr, (name, stderr)
        code, _, stderr = consumer(futures.export, data, out)
        assert code == 2 and stderr.count("\n") == 1 and message in stderr, (name, stderr)
        assert not out.exists()
