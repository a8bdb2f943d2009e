"""Memory as a first-class feature: predict a step's peak before allocating it."""

from foxhunt.memory.budget import MB
from foxhunt.memory.estimator import MemoryEstimate, estimate, max_batch_size, measure
from foxhunt.memory.trace import PART_NAMES, PARTS, StepMemory, onednn_lstm_workspace_bytes

__all__ = [
    "MB",
    "PARTS",
    "PART_NAMES",
    "MemoryEstimate",
    "StepMemory",
    "estimate",
    "max_batch_size",
    "measure",
    "onednn_lstm_workspace_bytes",
]
