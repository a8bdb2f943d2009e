"""Reduced-precision training and export (precision=int8 and precision=bf16)."""

from foxhunt.quantization.qat import (
    explain_deprecation,
    export_int8,
    load_int8,
    prepare_qat,
    set_qat_phase,
)

__all__ = ["explain_deprecation", "export_int8", "load_int8", "prepare_qat", "set_qat_phase"]
