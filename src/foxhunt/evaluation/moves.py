"""What the baselines see of a dataset's windows, indexed straight from its rows, and the
quantile tables they are built from (`foxhunt.evaluation.baselines`, `foxhunt.evaluation.gbm`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from foxhunt.data.windows import WindowDataset

EWMA_DECAY = 0.94  # RiskMetrics' lambda


@dataclass
class Windows:
    """What the baselines see of some windows (normalized target units)."""

    target: torch.Tensor  # [n, H] float32, what the model is scored against
    reference: torch.Tensor  # [n, H] the naive forecast: zero, or the last observed value
    history: np.ndarray  # [n, E (returns) or E - 1 (a level's differences)] the encoder's moves
    last_step: np.ndarray  # [n, inputs] the encoder's last row
    known: np.ndarray  # [n, H, known] the decoder's known inputs
    static: np.ndarray  # [n, static reals]
    group: np.ndarray  # [n] instrument index
    time_ns: np.ndarray | None  # [n, H] the targets' times (None: the windows carry none)
    index: np.ndarray  # [n] the windows' indices in their dataset
    origin_ns: np.ndarray  # [n] the encoder's last time (int64 ns; the window index where none)
    source: WindowDataset  # the dataset they come from (a forecast across its dates: `gbm`)

    @property
    def move(self) -> np.ndarray:
        """[n, H] the target's move from the reference: what the baselines forecast."""
        return (self.target - self.reference).double().numpy()


def gather(ds: WindowDataset, indices: np.ndarray, target_kind: str) -> Windows:
    """The windows `indices` of `ds`, indexed straight from its rows (no [n, E, inputs] batch)."""
    starts = ds.starts[torch.as_tensor(indices, dtype=torch.int64)]
    enc = starts[:, None] + ds.enc_offsets
    dec = starts[:, None] + ds.dec_offsets
    target = ds.target[dec]
    history = ds.target[enc].double().numpy()
    if target_kind == "return":  # normalized returns keep zero at zero (splits: mean 0)
        reference = torch.zeros_like(target)
    else:
        reference = ds.target[enc[:, -1]][:, None].expand_as(target)
        history = np.diff(history, axis=1)
    group = ds.group[starts]
    return Windows(
        target=target,
        reference=reference,
        history=history,
        last_step=ds.inputs[enc[:, -1]].double().numpy(),
        known=ds.known[dec].double().numpy(),
        static=ds.static_real[group].double().numpy(),
        group=group.numpy(),
        time_ns=None if ds.time_ns is None else ds.target_times(indices),
        index=indices,
        origin_ns=np.asarray(indices) if ds.time_ns is None else ds.time_ns[enc[:, -1]].numpy(),
        source=ds,
    )


class QuantileTable:
    """Quantiles of training values by cell (an integer key for every value)."""

    def __init__(
        self, keys: np.ndarray, values: np.ndarray, quantiles: np.ndarray, min_count: int = 1
    ) -> None:
        keys, values = keys.ravel(), values.ravel()
        order = np.argsort(keys, kind="stable")
        cells, first, counts = np.unique(keys[order], return_index=True, return_counts=True)
        keep = counts >= min_count  # a thinner cell is looked up as missing
        parts = np.split(values[order], first[1:])
        self.cells = cells[keep]
        self.table = np.array(
            [np.quantile(v, quantiles) for v, k in zip(parts, keep, strict=True) if k]
        ).reshape(-1, len(quantiles))

    def __call__(self, keys: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """[*keys.shape, Q]: each key's quantiles, `fallback`'s where its cell is missing."""
        if len(self.cells) == 0:
            return fallback
        i = np.searchsorted(self.cells, keys).clip(max=len(self.cells) - 1)
        return np.where((self.cells[i] == keys)[..., None], self.table[i], fallback)


def by_instrument(
    group: np.ndarray, values: np.ndarray, quantiles: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """The quantiles of `values` [n, H] per instrument and step, as a function of the windows'
    instruments; an instrument without training windows gets all instruments' quantiles."""
    steps = np.arange(values.shape[1])
    pooled = QuantileTable(np.broadcast_to(steps, values.shape), values, quantiles)
    own = QuantileTable(group[:, None] * len(steps) + steps, values, quantiles)
    everyone = pooled(steps, np.zeros((len(steps), len(quantiles))))  # [H, Q]

    def lookup(g: np.ndarray) -> np.ndarray:
        return own(
            g[:, None] * len(steps) + steps, np.broadcast_to(everyone, (len(g), *everyone.shape))
        )

    return lookup


def ewma_volatility(history: np.ndarray) -> np.ndarray:
    """[n] the square root of the exponentially weighted mean of the squared moves [n, E]
    (decay EWMA_DECAY, the latest weighted most; weights summing to one over the encoder)."""
    weights = EWMA_DECAY ** np.arange(history.shape[1] - 1, -1, -1)
    return np.sqrt(history**2 @ (weights / weights.sum()))
