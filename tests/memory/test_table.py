"""The memory breakdown table that estimate_memory.py and the benchmarks print."""

from __future__ import annotations

from foxhunt.memory.table import breakdown_rows, format_table


def test_breakdown_rows_name_each_part_once_and_mark_missing_columns():
    rows = breakdown_rows([{"optimizer_state": 2.0, "activations": 80.25}, None, {"inputs": 1}])
    assert rows == [
        ["optimizer state", "2.0", "-", "-"],
        ["activations", "80.2", "-", "-"],
        ["inputs", "-", "-", "1.0"],
    ]
    assert breakdown_rows([{"gradients": 1.0}], indent="  ")[0][0] == "  gradients"


def test_format_table_aligns_columns():
    text = format_table(["part", "MB", ""], [["activations", "80.1", "x"], ["inputs", "0.2", ""]])
    assert text.splitlines() == [
        "part           MB",
        "activations  80.1  x",
        "inputs        0.2",
    ]
