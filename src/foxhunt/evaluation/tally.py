"""A forecast's quantile loss and directional accuracy per instrument, as the baselines and the
model are scored side by side (`foxhunt.evaluation.baselines.score`)."""

from __future__ import annotations

import numpy as np


class Tally:
    """A forecast's quantile loss and directional accuracy, summed per instrument: the model's
    metrics (`foxhunt.training.metrics`: the mean pinball loss over windows, steps and
    quantiles; the sign hits over the steps that moved), kept per instrument here because
    torchmetrics' metrics hold one total."""

    def __init__(self, groups: int, quantiles: np.ndarray) -> None:
        self.q = quantiles
        self.loss, self.windows = np.zeros(groups), np.zeros(groups)
        self.hits, self.calls = np.zeros(groups), np.zeros(groups)

    def update(self, pred: np.ndarray, move: np.ndarray, group: np.ndarray) -> None:
        """pred [n, H, Q] forecast moves, move [n, H] actual moves, group [n]."""
        errors = move[..., None] - pred
        pinball = np.maximum(self.q * errors, (self.q - 1) * errors).mean(axis=(1, 2))
        size = len(self.loss)
        self.loss += np.bincount(group, pinball, size)
        self.windows += np.bincount(group, minlength=size)
        # only the steps where the median calls a move and the target moved: a seasonal median
        # of exactly zero (a tick grid's flat buckets) abstains, it is not a wrong call
        median = pred[..., int(np.argmin(np.abs(self.q - 0.5)))]
        counted = (median != 0) & (move != 0)
        hit = counted & (np.sign(median) == np.sign(move))
        self.hits += np.bincount(group, hit.sum(axis=1), size)
        self.calls += np.bincount(group, counted.sum(axis=1), size)

    def scores(self, keep: np.ndarray | slice = slice(None)) -> dict[str, float | None]:
        """{loss, directional_accuracy} over the instruments `keep` (all by default); None
        where there is nothing to score (a forecast whose median never moves has no direction)."""
        windows, calls = self.windows[keep].sum(), self.calls[keep].sum()
        return {
            "loss": float(self.loss[keep].sum() / windows) if windows else None,
            "directional_accuracy": float(self.hits[keep].sum() / calls) if calls else None,
        }
