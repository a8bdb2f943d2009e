"""A step's peak memory by part as a text table, one column per step or model.

foxhunt estimate-memory prints the estimate with it and the benchmarks their measurements,
so a part (`foxhunt.memory.PART_NAMES`, plus the CUDA reserve and context of a plan) reads the
same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def part_label(name: str) -> str:
    """How a part reads in a table: `optimizer_state` -> `optimizer state`."""
    return name.replace("_", " ")


def breakdown_rows(
    columns: Sequence[Mapping[str, float] | None], indent: str = "", fmt: str = ".1f"
) -> list[list[str]]:
    """One row per part, in the order the columns first name them: its label, then its value
    in each column ('-' where a column lacks it or is None)."""
    names = dict.fromkeys(name for column in columns if column for name in column)
    return [
        [indent + part_label(name)]
        + ["-" if not c or name not in c else format(c[name], fmt) for c in columns]
        for name in names
    ]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "l") -> str:
    """Rows of cells as aligned text, two spaces apart, each column as wide as its widest cell;
    column i is left-aligned where align[i] is 'l' (default: the first only), else right."""
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if align[i : i + 1] == "l" else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )
