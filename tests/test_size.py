"""Each module has room for one job: none in src/ or serve/ over 500 lines, no function over 60
unless a comment in its first lines (`# long: ...`) says why its one job needs the length."""

from __future__ import annotations

import ast

from tests.helpers import ROOT

MODULE_LINES, FUNCTION_LINES = 500, 60
SOURCES = [ROOT / "src" / "foxhunt", ROOT / "serve" / "src" / "foxhunt_serve"]


def _files() -> list:
    return sorted(p for root in SOURCES for p in root.rglob("*.py"))


def _reason(lines: list[str], node: ast.FunctionDef) -> bool:
    """A `# long:` comment within the first lines of the function's body."""
    body = node.body[1:] if ast.get_docstring(node) else node.body
    first = body[0].lineno if body else node.lineno
    return any("# long:" in line for line in lines[node.lineno - 1 : first + 2])


def test_no_module_over_500_lines():
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in _files()}
    assert {str(p): n for p, n in sizes.items() if n > MODULE_LINES} == {}


def test_no_function_over_60_lines_without_a_reason():
    long = []
    for path in _files():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES and not _reason(lines, node):
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert long == []
