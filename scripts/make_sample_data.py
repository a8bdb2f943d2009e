"""Write the synthetic E-mini S&P 500 futures sample (see foxhunt.data.sample).

Usage: python scripts/make_sample_data.py [--out data/ES_FUT_small.parquet] [--days 80] [--seed 0]
"""

from __future__ import annotations

import argparse

import pyarrow.parquet as pq

from foxhunt.data.sample import make_es_sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/ES_FUT_small.parquet", help="output Parquet file")
    parser.add_argument("--days", type=int, default=80, help="business days of bars")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--bar-minutes", type=int, default=5, help="bar length in minutes")
    args = parser.parse_args(argv)
    path = make_es_sample(args.out, days=args.days, bar_minutes=args.bar_minutes, seed=args.seed)
    rows = pq.ParquetFile(path).metadata.num_rows
    print(f"{path} {rows} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
