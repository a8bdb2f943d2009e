"""precision=bf16: Lightning's bf16-mixed (bfloat16 autocast, float32 master weights, gradients
and optimizer state); exported and predicted in float32.

On a CPU whose oneDNN has no bfloat16 (no AVX-512: a 2-core AMD EPYC with AVX2), autocast would
give oneDNN a bfloat16 LSTM it cannot build; the model runs its LSTMs in float32 there
(`foxhunt.models.tft.lstm_leaves_autocast`), the rest in bfloat16."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager

import torch

from foxhunt.models.tft import cpu_lstms_need_float32
from foxhunt.precision.fp32 import FP32

log = logging.getLogger(__name__)
NO_ONEDNN_BF16 = (
    "oneDNN has no bfloat16 on this CPU (it needs AVX-512 or AVX2-VNNI-2): the LSTMs run in "
    "float32 under autocast, the rest in bfloat16"
)


def _float32_lstms(device_type: str) -> bool:
    return device_type == "cpu" and cpu_lstms_need_float32()


class BF16(FP32):
    name = "bf16"

    def check_device(self, device: torch.device) -> None:
        if _float32_lstms(device.type):
            log.warning("precision=bf16: %s", NO_ONEDNN_BF16)

    def autocast(self, device_type: str) -> AbstractContextManager:
        # as Lightning's bf16-mixed runs its steps: without autocast's cache of cast weights
        # (each op casts its weight again). With the cache the memory trace held every cast
        # weight through the step: tft_small's estimates were 2-3% (train) and 7.7% (val) high.
        return torch.autocast(device_type, torch.bfloat16, cache_enabled=False)

    def memory_note(self, device: str) -> str:
        note = (
            "precision bf16: traced under bfloat16 autocast; fp32 master weights, gradients and "
            "optimizer state"
        )
        if _float32_lstms(device):
            note += "; the LSTMs in float32 (oneDNN has no bfloat16 on this CPU)"
        return note


PRECISION = BF16
