"""Print pip constraints that pin every dependency of pyproject.toml to its floor.

`pip install -c <(python .ci/floors.py) -e ".[...]"` then installs the oldest versions foxhunt
claims to work with, so a floor that is too low fails CI instead of a user's install.
"""

import re
import tomllib
from pathlib import Path

project = tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())["project"]
requirements = project["dependencies"] + sum(project["optional-dependencies"].values(), [])
for requirement in requirements:
    floor = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([^,;\s]+).*", requirement)
    if floor:
        print(f"{floor[1]}=={floor[3]}")
