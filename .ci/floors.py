"""Print pip constraints that pin every dependency of pyproject.toml and serve/pyproject.toml
to its floor.

`pip install -c <(python .ci/floors.py) -e ".[...]"` then installs the oldest
versions foxhunt claims to work with, so a floor that is too low fails CI instead of a user's
install.
"""

import re
import tomllib
from pathlib import Path

requirements = []
for path in ("pyproject.toml", "serve/pyproject.toml"):
    project = tomllib.loads((Path(__file__).parents[1] / path).read_text())["project"]
    requirements += project["dependencies"]
    requirements += sum(project.get("optional-dependencies", {}).values(), [])
for requirement in dict.fromkeys(requirements):
    floor = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([^,;\s]+).*", requirement)
    if floor:
        print(f"{floor[1]}=={floor[3]}")
