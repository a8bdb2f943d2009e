"""model.json and model.onnx: a foxhunt ONNX export, read and checked before any data is read.

model.json is checked against `SCHEMA`: every field the serving core reads, what it must be,
and whether it may be null or absent. A field missing, or of the wrong kind, is one InputError
naming it; `calibration` is required (null: none was fitted), so a file that lost it is refused
rather than forecast uncalibrated. The fields later versions added (`target.means`, `stds`,
`anchored`, `data.calendar`) may be absent: every export since the serving core was split out
loads. Then the graph is checked against model.json: the inputs by name, and each one's and the
output's shape (the window lengths, the features, the quantiles).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from foxhunt_serve.errors import InputError

FORMAT, FORMAT_VERSION = "foxhunt-onnx", 1
NULL, ABSENT = "null", "absent"  # what a field may be besides its kind (SCHEMA)
# the inputs with a time axis: the model.json field that sets its length
STEPS = {
    "encoder_observed": "encoder_length",
    "encoder_known": "encoder_length",
    "decoder_known": "prediction_length",
}


class Kind(NamedTuple):
    what: str  # in the error: "must be {what}"
    test: Callable[[Any], bool]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _list(test: Callable[[Any], bool], empty: bool = True) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and (empty or bool(v)) and all(test(x) for x in v)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _input(v: Any) -> bool:
    named = isinstance(v, dict) and isinstance(v.get("name"), str)
    return named and _list(lambda f: isinstance(f, str))(v.get("features", []))


TEXT = Kind("a string", lambda v: isinstance(v, str))
TEXTS = Kind("a list of strings", _list(lambda v: isinstance(v, str)))
COUNT = Kind("an integer above 0", _count)
NUMBER = Kind("a number", _number)
NUMBERS = Kind("a list of numbers", _list(_number))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
QUANTILES = Kind(
    "a list of numbers between 0 and 1", _list(lambda q: _number(q) and 0 < q < 1, False)
)
INPUTS = Kind("a list of inputs, each a name and its features", _list(_input, False))
PAIRS = Kind(
    "a list of pairs of quantile indices", _list(lambda p: _list(_index)(p) and len(p) == 2)
)
METHOD = Kind("one of none, cqr, aci", lambda v: v in ("none", "cqr", "aci"))

# field (dotted: inside its parent, checked only where the parent is there): kind, and NULL
# where it may be null, ABSENT where an earlier version's model.json lacks it
SCHEMA: dict[str, tuple[Any, ...]] = {
    "model_file": (TEXT,),
    "sha256": (TEXT,),
    "encoder_length": (COUNT,),
    "prediction_length": (COUNT,),
    "quantiles": (QUANTILES,),
    "instruments": (TEXTS,),
    "inputs": (INPUTS,),
    "output": (OBJECT,),
    "output.name": (TEXT,),
    "output.columns": (TEXTS,),
    "target": (OBJECT,),
    "target.name": (TEXT,),
    "target.mean": (NUMBER,),
    "target.std": (NUMBER,),
    "target.means": (NUMBERS, NULL, ABSENT),
    "target.stds": (NUMBERS, NULL, ABSENT),
    "calibration": (OBJECT, NULL),
    "calibration.method": (METHOD,),
    "calibration.pairs": (PAIRS,),
    "calibration.offsets": (OBJECT,),
    "calibration.quantiles": (QUANTILES, ABSENT),  # these five: aci's, required for it
    "calibration.gamma": (NUMBER, ABSENT),
    "calibration.windows": (OBJECT, ABSENT),
    "calibration.grids": (OBJECT, ABSENT),
    "calibration.grid_levels": (COUNT, ABSENT),
    "calibration.state": (OBJECT, ABSENT),  # ACI's where the run ended (an export before: none)
    "features": (OBJECT,),
    "data": (OBJECT,),
    "data.time_column": (TEXT,),
    "data.time_unit": (TEXT, NULL),
    "data.group_column": (TEXT, NULL),
    "data.target_column": (TEXT, NULL),
    "data.known_columns": (TEXTS,),
    "data.nan_policy": (TEXT,),
    "data.columns_read": (TEXTS,),
    "data.ohlcv": (OBJECT, NULL),
    "data.futures": (OBJECT, NULL),
    "data.calendar": (OBJECT, NULL, ABSENT),
}


def read_export(export_dir: Path) -> tuple[dict[str, Any], bytes]:
    """model.json, checked against its schema, and the model.onnx it describes (checked by its
    SHA-256)."""
    where = export_dir / "model.json"
    try:
        meta = json.loads(where.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{export_dir} holds no foxhunt ONNX export: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{where} is not a {FORMAT} export")
    if not _count(meta.get("format_version")) or meta["format_version"] > FORMAT_VERSION:
        raise InputError(
            f"{where} is not a {FORMAT} export of version {FORMAT_VERSION} or earlier "
            f"(version {meta.get('format_version')!r}): a newer foxhunt-serve reads it"
        )
    check_schema(meta, where)
    try:
        model = (export_dir / meta["model_file"]).read_bytes()
    except OSError as exc:
        raise InputError(f"{export_dir} holds no foxhunt ONNX export: {exc}") from None
    if hashlib.sha256(model).hexdigest() != meta["sha256"]:
        raise InputError(f"{export_dir}/{meta['model_file']} is not the one model.json describes")
    return meta, model


def check_schema(meta: dict[str, Any], where: Path | str) -> None:
    """InputError naming the first field of `SCHEMA` that `meta` lacks or holds wrongly, or the
    first pair of fields that disagree."""
    for field, (kind, *allowed) in SCHEMA.items():
        *parents, name = field.split(".")
        parent: Any = meta
        for p in parents:
            parent = parent.get(p) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue  # a parent null where it may be (the parent's own check holds)
        if name not in parent:
            if ABSENT in allowed:
                continue
            raise InputError(f"{where}: field {field} is missing; export the model again")
        value = parent[name]
        if not (value is None and NULL in allowed) and not kind.test(value):
            raise InputError(f"{where}: field {field} must be {kind.what}, not {value!r:.60}")
    cal = meta["calibration"]
    if cal and cal["method"] == "aci":
        for name in ("quantiles", "gamma", "windows", "grids", "grid_levels"):
            if name not in cal:
                raise InputError(
                    f"{where}: field calibration.{name} is missing; export the model again"
                )
        for name, held in (cal.get("state") or {}).items():
            if not (isinstance(held, dict) and {"miscoverage", "seen_ns"} <= set(held)):
                raise InputError(
                    f"{where}: field calibration.state.{name} must hold miscoverage and "
                    "seen_ns; export the model again"
                )
    quantiles, columns = len(meta["quantiles"]), len(meta["output"]["columns"])
    if columns != quantiles:
        raise InputError(
            f"{where}: output.columns names {columns} quantiles, quantiles holds {quantiles}"
        )


def open_session(model: bytes, meta: dict[str, Any], where: Path | str, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session of `model` (`threads`: intra-op, 0: its own), which prints
    errors only, checked to take the inputs and give the output model.json describes.
    onnxruntime is imported here, where a session is made: predict's helpers need none."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: its warnings (CastLike not folded) are noise
    try:
        made = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors share no base class
        raise InputError(f"{where}: ONNX Runtime cannot load its model: {exc}") from None
    check_graph(made, meta, where)
    return made


def check_graph(made: Any, meta: dict[str, Any], where: Path | str) -> None:
    """InputError where the graph's inputs or output disagree with model.json."""
    graph = {i.name: i.shape[1:] for i in made.get_inputs()}
    described = {spec["name"]: spec for spec in meta["inputs"]}
    if set(graph) != set(described):
        raise InputError(
            f"{where}: inputs names {sorted(described)}, model.onnx takes {sorted(graph)}"
        )
    for name, spec in described.items():
        dims = [(STEPS[name], meta[STEPS[name]])] if name in STEPS else []
        if "features" in spec:
            dims.append((f"the features of input {name}", len(spec["features"])))
        _same_shape(f"input {name}", graph[name], dims, where)
    output = {o.name: o.shape[1:] for o in made.get_outputs()}
    name = meta["output"]["name"]
    if name not in output:
        raise InputError(f"{where}: output.name is {name!r}, model.onnx gives {sorted(output)}")
    dims = [("prediction_length", meta["prediction_length"]), ("quantiles", len(meta["quantiles"]))]
    _same_shape(f"output {name}", output[name], dims, where)


def _same_shape(what: str, got: list, dims: list[tuple[str, int]], where: Path | str) -> None:
    """InputError naming the first of model.json's `dims` (field, size) the graph's shape `got`
    (after the batch) disagrees with."""
    if len(got) != len(dims):
        raise InputError(
            f"{where}: model.onnx's {what} has {len(got)} dimensions after the batch, "
            f"model.json describes {len(dims)}; export the model again"
        )
    for size, (field, want) in zip(got, dims, strict=True):
        if isinstance(size, int) and size != want:
            raise InputError(
                f"{where}: {field} is {want}, but model.onnx's {what} has {size}; "
                "export the model again"
            )
