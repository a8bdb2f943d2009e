"""The int8 export of a trained QAT model, scored on the test windows beside the fake-quant
model it came from: what the export costs in loss and how far its outputs move."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from foxhunt.evaluation.loss import quantile_loss
from foxhunt.models.tft import TemporalFusionTransformer
from foxhunt.quantization.qat import export_int8, load_int8, set_qat_phase


def export_and_score_int8(
    qat_model: TemporalFusionTransformer,
    init: dict[str, Any],
    schema: dict[str, Any],
    test_batches: Iterable[dict[str, torch.Tensor]],
    quantiles: torch.Tensor,
    path: Path,
    calibration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export the (best) QAT model as int8 to `path` (with its calibration) and score it on
    `test_batches`."""
    qat_model = qat_model.eval()
    set_qat_phase(qat_model, observe=False, fake_quant=True)
    int8_bytes = export_int8(qat_model, init, path, schema=schema, calibration=calibration)
    int8_model = load_int8(path)
    quantiles = quantiles.cpu()
    loss_sum = count = 0.0
    diffs, scale = [], []
    with torch.no_grad():
        for batch in test_batches:
            pred = int8_model(batch)
            n = pred.numel()
            loss_sum += float(quantile_loss(pred, batch["target"], quantiles)) * n
            count += n
            reference = qat_model(batch)
            diffs.append((pred - reference).abs().flatten())
            scale.append(reference.flatten())
    diff, ref_std = torch.cat(diffs), float(torch.cat(scale).std())
    return {
        "int8_model": str(path),
        "int8_test_loss": loss_sum / max(count, 1),
        "export_bytes_int8": int8_bytes,
        "int8_vs_fake_quant_max_abs_diff_rel_std": float(diff.max()) / ref_std,
        "int8_vs_fake_quant_mean_abs_diff_rel_std": float(diff.mean()) / ref_std,
    }
