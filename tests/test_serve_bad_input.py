"""Bad input to foxhunt-serve, and to predict's output path: one line, exit 2, and where the
input is wrong before any work, the line comes before the data is read or the model is run
(model.json's schema and its graph, output paths, the export's own files, --threads), with no
ONNX Runtime warnings around it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import needs

pytest.importorskip("onnxruntime")
needs("onnxscript")

# every test reads test_export's shared export (13 s to build): the full tier (#70)
pytestmark = pytest.mark.slow

from foxhunt_serve import files, forecast  # noqa: E402
from foxhunt_serve.errors import InputError  # noqa: E402

from foxhunt.app.predict.predictor import Predictor  # noqa: E402
from tests import test_export  # noqa: E402
from tests.helpers import ROOT, run_script  # noqa: E402
from tests.test_export import consumer  # noqa: E402

plain = test_export.plain  # the trained export test_export shares (built once a session)


def _refuse(*args, **kwargs):
    raise AssertionError("the data was read or the model run before the error")


@pytest.fixture
def no_work(monkeypatch):
    """The test fails if foxhunt-serve reads the data or runs the model."""
    monkeypatch.setattr(forecast.pq, "read_table", _refuse)
    monkeypatch.setattr(forecast, "forecast", _refuse)


def _one_line(code: int, stderr: str, message: str) -> None:
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith("error: ") and message in stderr, stderr


def _damaged(plain, tmp_path: Path, change) -> Path:
    """A copy of the plain export with model.json changed by `change(meta)`."""
    export = Path(shutil.copytree(plain.export, tmp_path / "export"))
    meta = json.loads((export / "model.json").read_text())
    change(meta)
    (export / "model.json").write_text(json.dumps(meta))
    return export


CASES = {
    "no calibration": (lambda m: m.pop("calibration"), "field calibration is missing"),
    "a field missing": (lambda m: m["data"].pop("time_column"), "data.time_column is missing"),
    "a length as text": (
        lambda m: m.update(encoder_length="64"),
        "field encoder_length must be an integer above 0, not '64'",
    ),
    "quantiles as text": (
        lambda m: m.update(quantiles="abc"),
        "field quantiles must be a list of numbers between 0 and 1, not 'abc'",
    ),
    "a length the graph disagrees with": (
        lambda m: m.update(prediction_length=5),
        "prediction_length is 5, but model.onnx's input decoder_known has 4",
    ),
    "aci without its grids": (
        lambda m: m["calibration"].pop("grids"),
        "field calibration.grids is missing",
    ),
    "aci's state as a number": (
        lambda m: m["calibration"].update(state=3),
        "field calibration.state must be an object, not 3",
    ),
    "a name's state without its miscoverage": (
        lambda m: m["calibration"].update(state={"AAA": {"seen_ns": [0]}}),
        "field calibration.state.AAA must hold miscoverage and seen_ns",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_model_json_is_one_line_before_the_data(plain, tmp_path, no_work, case):
    change, message = CASES[case]
    export = _damaged(plain, tmp_path, change)
    code, _, stderr = consumer(export, plain.data, tmp_path / "out.parquet")
    _one_line(code, stderr, message)
    assert f"{export}/model.json: " in stderr


def test_an_earlier_versions_model_json_still_loads(plain, tmp_path):
    """Without the fields later versions added, and with no calibration fitted (null)."""

    def earlier(meta):
        del meta["data"]["calendar"], meta["feature_code"]
        for name in ("means", "stds", "anchored"):
            del meta["target"][name]
        meta["calibration"] = None

    code, _, stderr = consumer(_damaged(plain, tmp_path, earlier), plain.data, tmp_path / "o")
    assert code == 0 and stderr == ""


def test_an_aci_model_json_without_its_state_replays_every_window(plain, tmp_path):
    """An export from before ACI's state: every window replayed from the nominal level."""
    assert json.loads((plain.export / "model.json").read_text())["calibration"]["state"]
    export = _damaged(plain, tmp_path, lambda m: m["calibration"].pop("state"))
    code, _, stderr = consumer(export, plain.data, tmp_path / "o.parquet")
    assert code == 0 and stderr == ""
    replayed = forecast.predict(export, plain.data)
    every = forecast.predict(export, plain.data, all_windows=True)  # from the nominal level
    names, origin = (np.array(every[c].to_pylist()) for c in ("instrument", "origin_time"))
    last = np.array([origin[names == n].max() == o for n, o in zip(names, origin, strict=True)])
    assert replayed.equals(every.filter(pa.array(last)))


def test_output_paths_are_checked_before_the_data(plain, tmp_path, no_work):
    missing = tmp_path / "missing"
    code, _, stderr = consumer(plain.export, plain.data, missing / "out.parquet")
    _one_line(code, stderr, f"directory {missing} does not exist")
    code, _, stderr = consumer(plain.export, plain.data, tmp_path)
    _one_line(code, stderr, f"{tmp_path} is a directory")


def test_a_failed_write_names_the_output_not_a_temp_file(plain, tmp_path):
    table = pq.read_table(plain.data)
    out = tmp_path / "gone" / "out.parquet"
    with pytest.raises(InputError, match=f"^cannot write {out}: No such file") as caught:
        files.write_atomic(out, lambda f: pq.write_table(table, f))
    assert "foxhunt-tmp" not in str(caught.value)


@pytest.mark.parametrize("name", ["model.json", "model.onnx"])
def test_overwrite_never_replaces_the_exports_own_files(plain, tmp_path, no_work, name):
    export = Path(shutil.copytree(plain.export, tmp_path / "export"))
    before = (export / name).read_bytes()
    code, _, stderr = consumer(export, plain.data, export / name, "--overwrite")
    _one_line(code, stderr, f"is the export's own {name}; give another path")
    assert (export / name).read_bytes() == before


def test_threads_are_checked_and_documented(plain, tmp_path, no_work):
    code, _, stderr = consumer(plain.export, plain.data, tmp_path / "o.parquet", "--threads", -3)
    _one_line(code, stderr, "--threads must be 0 (ONNX Runtime's choice) or more, got -3")
    for doc in ("docs/export.md", "serve/README.md"):
        text = (ROOT / doc).read_text()
        assert "--threads" in text and "--overwrite" in text, doc


def test_onnx_runtime_prints_no_warnings(plain, tmp_path, capfd):
    """Its CastLike warnings (written by its C++ logger, to the process's stderr) are off."""
    code, stdout, stderr = consumer(plain.export, plain.data, tmp_path / "o.parquet")
    assert code == 0 and stderr == "" and stdout.startswith("wrote ")
    assert capfd.readouterr().err == ""


def test_predict_checks_its_output_path_before_the_forecast(plain, tmp_path, monkeypatch):
    monkeypatch.setattr(Predictor, "predict", _refuse)
    missing = tmp_path / "missing"

    def predict(out, *extra):
        return run_script(
            "predict.py",
            f"ckpt_path='{plain.ckpt}'",
            f"data.path={plain.data}",
            f"predict.out={out}",
            *extra,
            f"hydra.run.dir={tmp_path / 'run'}",
        )

    for out in (missing / "p.parquet", f"{missing}/"):
        code, _, stderr = predict(out)
        _one_line(code, stderr, f"directory {missing} does not exist")
    before = plain.ckpt.read_bytes()
    code, _, stderr = predict(plain.ckpt, "predict.overwrite=true")
    _one_line(code, stderr, "is the model (ckpt_path); give another path")
    assert plain.ckpt.read_bytes() == before
