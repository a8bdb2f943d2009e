"""foxhunt: Temporal Fusion Transformers on Parquet market data."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from foxhunt.app.predict.predictor import Predictor


def load(path: str | Path, data: dict[str, Any] | None = None, **options: Any) -> Predictor:
    """A trained model, a checkpoint or an int8 export, ready to `.predict(table_or_path)`
    (`foxhunt.app.predict.predictor.load`; imported on first use, so `import foxhunt` stays
    light)."""
    from foxhunt.app.predict.predictor import load as load_predictor

    return load_predictor(path, data, **options)
