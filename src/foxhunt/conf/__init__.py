"""foxhunt's Hydra configs, shipped inside the package (`pkg://foxhunt.conf`): a wheel or an
sdist composes them from any directory, and a user's `--config-dir` or `hydra.searchpath` adds
groups and files beside them."""

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent  # for code that composes them itself (tests, benches)
