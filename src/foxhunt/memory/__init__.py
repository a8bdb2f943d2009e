"""Memory as a first-class feature: predict a step's peak before allocating it."""

from foxhunt.memory.estimator import (
    MemoryEstimate,
    StepMemory,
    estimate,
    max_batch_size,
    measure,
    onednn_lstm_workspace_bytes,
)

__all__ = [
    "MemoryEstimate",
    "StepMemory",
    "estimate",
    "max_batch_size",
    "measure",
    "onednn_lstm_workspace_bytes",
]
