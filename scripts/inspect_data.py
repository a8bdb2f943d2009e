"""What foxhunt will make of a data file, before training on it.

    python scripts/inspect_data.py data.path=/abs/stocks.parquet
    python scripts/inspect_data.py data=parquet data.path=/abs/bars.parquet data.target=y

Takes the same overrides as train.py. Prints the instruments (spans, gaps, listings and
delistings), bars and calendars, futures rolls, the feature plan, the windows per split with
the calendar cuts, a training step's memory estimate and a measured time per batch, then every
problem train.py would refuse (`problem: ...`, exit 2), and as its last line one JSON object.
"""

import json
import sys

from omegaconf import DictConfig

from foxhunt.app import cli
from foxhunt.app.inspect import inspect_data


@cli.main("inspect_data")
def main(cfg: DictConfig) -> None:
    found = inspect_data(cfg, time_batches=bool(cfg.get("time_batches", True)))
    for line in found.lines:
        print(line)
    print(f"problems: {len(found.problems) or 'none'}")
    for problem in found.problems:
        print(f"problem: {problem}")
    print(json.dumps(found.facts | {"problems": found.problems}))
    if found.problems:
        sys.exit(cli.EXIT_USER_ERROR)


if __name__ == "__main__":
    cli.run(main)
