"""What every command's report draws with: markdown tables and matplotlib figures (the run
report, the backtest's, the tuning study's, the sweep summary and the interpretation plots)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def markdown_table(head: list[str], rows: list[list[Any]], missing: str = "") -> list[str]:
    """The lines of a markdown table; floats to 4 significant digits, None as `missing`."""

    def cell(v: Any) -> str:
        if v is None:
            return missing
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]


def have_matplotlib() -> bool:
    """Whether plots can be drawn; says so in one log line when they cannot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("matplotlib is not installed: no plots (pip install matplotlib)")
        return False
    return True


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib Figure with constrained layout, made without pyplot (no global backend or
    figure state is touched, so it works headless and inside other programs)."""
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)
