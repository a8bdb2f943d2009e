"""How a summary's strategy and book traded, read in one place (the console, the run report and
the backtest's read them here, never with their own defaults).

A summary written before a fact existed reads as its run traded: before `eval.execution_lag`
the strategy traded the bar it forecast (lag 0); before #57 the book ranked by the median
forecast of the next bar (horizon 1) and traded every date with two names or more."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Traded:
    """What a strategy or a book traded: its rule (the strategy's `eval.strategy`, the book's
    ranking), its costs, how many bars after the forecast, and the forecast step held then."""

    rule: str
    cost_bps: float
    execution_lag: int
    horizon: int
    min_names: int = 1  # a book's: a date with fewer names is flat
    hedged: bool = False  # a strategy's on a relative target: each name against the market

    @property
    def legs(self) -> str:
        """How the trade is said: a hedged one names its two costed legs."""
        return ", each name against the market, both legs costed" if self.hedged else ""

    @classmethod
    def strategy(cls, s: Mapping[str, Any]) -> Traded:
        lag = int(s.get("execution_lag", 0))
        hedged = bool(s.get("hedged", False))  # a summary from before #67 traded unhedged
        return cls(str(s["rule"]), float(s["cost_bps"]), lag, lag + 1, hedged=hedged)

    @classmethod
    def book(cls, b: Mapping[str, Any]) -> Traded:
        return cls(
            str(b.get("rank", "forecast")),
            float(b["cost_bps"]),
            int(b["execution_lag"]),
            int(b.get("horizon", 1)),
            int(b.get("min_names", 2)),
        )
