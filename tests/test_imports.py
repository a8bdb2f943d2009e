"""Imports run one way: data and models at the bottom, training above them, the memory plug-in
above training, the commands on top and the entry points above them; no cycle between packages
or modules. docs/architecture.md's table is this module's LAYERS."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from tests.helpers import ROOT

SRC = ROOT / "src"
# a module may import from its own layer and the layers below it, never from above; a layer is
# named by its packages (foxhunt.data, ...) or modules (foxhunt.app.cli, ...); "" is the
# foxhunt package itself (foxhunt.load)
LAYERS = [
    ("bottom", {"errors", "files", "config", "checks", "conf", "threads", "run"}),
    ("data and models", {"data", "models"}),
    ("evaluation", {"evaluation"}),  # pure functions over forecasts
    ("quantization", {"quantization"}),
    ("precision", {"precision"}),
    ("training", {"training"}),
    ("memory", {"memory"}),
    # the commands, one package each (app/<command>/, its command line in command.py), above
    # what they share (app/render.py); each package may use the ones listed before it
    ("shared by the commands", {"app", "app.render"}),
    ("predict, export, interpret", {"app.predict"}),
    ("inspect", {"app.inspect_data"}),
    ("report", {"app.report"}),
    ("train", {"app.train"}),
    ("backtest", {"app.backtest"}),
    ("tune", {"app.tune"}),
    # the foxhunt command, what scripts/*.py and python -m foxhunt run, and foxhunt.load
    ("entry points", {"app.cli", "app.commands", "__main__", ""}),
]
LAYER = {name: n for n, (_, names) in enumerate(LAYERS) for name in names}


def _module(path: Path, root: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph(root: Path = SRC, package: str = "foxhunt") -> dict[str, set[str]]:
    """module of `package` (under `root`) -> the package's modules it imports, at any depth of
    its code (an import inside a function, or for type checking, is an edge too: moving it there
    does not remove a cycle)."""
    modules = {_module(p, root): p for p in (root / package).rglob("*.py")}
    graph = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
                found = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {m for m in found if m in modules and m != name}
        graph[name]  # noqa: B018 - every module is a node
    return graph


def _package(module: str) -> str:
    """The layer name of a foxhunt module: its module or package under app, else its
    package."""
    parts = module.split(".")[1:]
    if parts[:1] == ["app"]:
        return ".".join(parts[:2])
    return parts[0] if parts else ""


def test_every_package_has_a_layer():
    assert {_package(m) for m in import_graph()} <= set(LAYER)


def test_no_import_goes_up_a_layer():
    upward = [
        f"{m} -> {t}"
        for m, targets in import_graph().items()
        for t in targets
        if LAYER[_package(t)] > LAYER[_package(m)]
    ]
    assert upward == []


def test_no_cycle_between_modules_or_packages():
    graph = import_graph()
    packages = defaultdict(set)
    for m, targets in graph.items():
        packages[_package(m)] |= {_package(t) for t in targets} - {_package(m)}
    for g in (graph, packages):
        try:
            TopologicalSorter(g).prepare()
        except CycleError as exc:
            raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_gpu_check_has_no_import_cycle():
    """benchmarks/gpu_check's sections import what they share from `common`, never the runner
    that imports them (its `Check` lives in `common`)."""
    graph = import_graph(ROOT, "benchmarks")
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def _file(name: str) -> str:
    """A layer entry as docs/architecture.md names it: `data/`, `errors.py`, `app/cli.py`."""
    path = SRC / "foxhunt" / name.replace(".", "/")
    if not name or name == "app":
        return f"{name}/__init__.py".lstrip("/")
    return f"{name.replace('.', '/')}/" if path.is_dir() else f"{name.replace('.', '/')}.py"


def test_the_architecture_doc_is_these_layers():
    text = (ROOT / "docs" / "architecture.md").read_text()
    text = text.split("## What each layer may import")[1].split("\n## ")[0]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| ")][1:]
    table = [(layer.strip(), set(re.findall(r"`([^`]+)`", files))) for layer, files in rows]
    assert table == [(layer, {_file(n) for n in names}) for layer, names in LAYERS]


# serve/pyproject.toml's; exchange_calendars: its [calendars] extra, imported only when a model
# names an exchange (foxhunt_serve.exchange)
SERVING = {"numpy", "pyarrow", "onnxruntime", "foxhunt_serve", "exchange_calendars"}


def test_the_serving_core_imports_its_own_dependencies_alone():
    """foxhunt_serve (serve/) imports the standard library, numpy, pyarrow and onnxruntime:
    nothing of foxhunt or torch, which a serving machine does not install."""
    imported = set()
    for path in (ROOT / "serve" / "src" / "foxhunt_serve").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
    assert imported - sys.stdlib_module_names - {"__future__"} == SERVING


@pytest.mark.slow  # 11-13 s of a fresh interpreter's imports: the full tier (#70)
def test_predict_imports_onnxruntime_only_to_make_a_session():
    """foxhunt's predict uses the serving core's windows and tables, never its sessions."""
    code = "import sys, foxhunt.app.predict.predictor; print('onnxruntime' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


def test_foxhunt_takes_the_serving_core_through_its_public_api_alone():
    """foxhunt imports `from foxhunt_serve import ...` (its __init__'s __all__), never one of
    its modules: those may change without foxhunt knowing."""
    import foxhunt_serve

    inside = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("foxhunt_serve"):
                if node.module != "foxhunt_serve":
                    inside.append(f"{path.relative_to(SRC)}: {node.module}")
                inside += [
                    f"{path.relative_to(SRC)}: {a.name}"
                    for a in node.names
                    if a.name not in foxhunt_serve.__all__
                ]
            elif isinstance(node, ast.Import):
                inside += [a.name for a in node.names if a.name.startswith("foxhunt_serve.")]
    assert inside == []
