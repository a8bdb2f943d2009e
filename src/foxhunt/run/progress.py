"""How a run's long phases show their progress (a backtest's folds, the baselines, the report):
step n of N, the time elapsed and an estimate of the time left, drawn by tqdm on stderr when it
is a terminal. Nothing is written anywhere else: a log file, a pipe or a CI job's output gets
the phases' own INFO lines, never a bar."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def on_terminal() -> bool:
    """Whether progress is shown: stderr is a terminal (not a file, a pipe or a test's capture)."""
    return sys.stderr.isatty()


def steps(
    items: Sequence[T],
    desc: str,
    unit: str = "step",
    label: Callable[[T], str] | None = None,
    lines: bool = False,
) -> Iterator[T]:
    """Each of `items`, its progress shown on a terminal: a tqdm bar with `label(item)`, the
    step under way, beside it, gone when the last step ends; or with `lines` one line as each
    step starts and one at the end, for steps that draw bars of their own (a backtest's folds
    train under Lightning's)."""
    shown = on_terminal()
    if not lines:
        # leave=False: the bar goes when its phase ends (the phase's INFO line says how long)
        bar = tqdm(items, desc=desc, unit=unit, disable=not shown, leave=False, dynamic_ncols=True)
        with bar:
            for item in bar:
                if label is not None:
                    bar.set_postfix_str(label(item))
                yield item
        return
    started = time.perf_counter()

    def line(n: int, prefix: str) -> None:
        if shown:
            elapsed = time.perf_counter() - started
            meter = tqdm.format_meter(n, len(items), elapsed, prefix=prefix, unit=unit)
            print(meter, file=sys.stderr, flush=True)

    for n, item in enumerate(items):
        line(n, desc if label is None else f"{desc} ({label(item)})")
        yield item
    line(len(items), desc)
