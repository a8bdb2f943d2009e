"""Write the synthetic E-mini S&P 500 futures sample or a daily stock panel (foxhunt.data.samples).

Usage: python scripts/make_sample_data.py [--out data/ES_FUT_small.parquet] [--days 80] [--seed 0]
       python scripts/make_sample_data.py --panel [50] [--out data/stock_panel.parquet]
           [--days 1044] [--sectors 11] [--seed 0]
"""

from __future__ import annotations

import argparse

import pyarrow.parquet as pq

from foxhunt.data.samples import (
    PANEL_DAYS,
    PANEL_SECTORS,
    SAMPLE_PATH,
    make_es_sample,
    make_stock_panel,
)

PANEL_PATH = "data/stock_panel.parquet"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", help=f"output Parquet file (default {SAMPLE_PATH}, with --panel {PANEL_PATH})"
    )
    parser.add_argument(
        "--days", type=int, help=f"business days of bars (default 80, with --panel {PANEL_DAYS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--bar-minutes", type=int, help="bar length in minutes (default 5)")
    parser.add_argument(
        "--panel",
        type=int,
        nargs="?",
        const=50,
        metavar="N",
        help="write daily bars of N synthetic stocks (default 50) instead of the futures sample",
    )
    parser.add_argument(
        "--sectors",
        type=int,
        help=f"with --panel: number of sector codes (default {PANEL_SECTORS})",
    )
    args = parser.parse_args(argv)
    if args.panel is None:
        if args.sectors is not None:
            parser.error("--sectors needs --panel")
        path = make_es_sample(
            args.out or SAMPLE_PATH,
            days=80 if args.days is None else args.days,
            bar_minutes=5 if args.bar_minutes is None else args.bar_minutes,
            seed=args.seed,
        )
    else:
        if args.bar_minutes is not None:
            parser.error("--bar-minutes does not apply to --panel (daily bars)")
        path = make_stock_panel(
            args.out or PANEL_PATH,
            args.panel,
            days=PANEL_DAYS if args.days is None else args.days,
            seed=args.seed,
            sectors=PANEL_SECTORS if args.sectors is None else args.sectors,
        )
    rows = pq.ParquetFile(path).metadata.num_rows
    print(f"{path} {rows} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
