"""The largest batch size that fits: a galloping search over a monotone test, shared by the
estimator (over traced steps) and the batch-size search (over real trial steps)."""

from __future__ import annotations

from collections.abc import Callable


def largest_fitting(fits: Callable[[int], bool], guess: int, limit: int) -> int:
    """The largest n in [1, limit] with fits(n), for a monotone `fits` that holds at 1: gallop
    from `guess` to bracket the answer (steps 1, 2, 4, ...), then bisect."""
    n, step = max(1, min(guess, limit)), 1
    if fits(n):
        lo, hi = n, limit + 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(lo + step, limit + 1)
    else:
        lo, hi = 0, n
        while hi - step >= 1 and not fits(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(hi - step, 1)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
