"""Forecast with a foxhunt TFT exported to ONNX, on a machine with foxhunt-serve and no torch.

    pip install ./serve
    python examples/onnx_predict.py EXPORT_DIR DATA.parquet

EXPORT_DIR holds model.onnx and model.json (`foxhunt export ckpt_path=...`). This prints each
instrument's latest forecast: the median and the outer quantiles at every horizon step. The
`foxhunt-serve` command writes the whole table; `foxhunt_serve`'s docstring lists the steps.
"""

import sys
from pathlib import Path

from foxhunt_serve.errors import InputError
from foxhunt_serve.forecast import predict


def main(export_dir: str, data: str) -> int:
    try:
        table = predict(Path(export_dir), Path(data))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    quantiles = [c for c in table.column_names if c.startswith("q")]
    low, median, high = quantiles[0], quantiles[len(quantiles) // 2], quantiles[-1]
    for row in table.select(["instrument", "target_time", low, median, high]).to_pylist():
        print(*row.values(), sep="\t")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
