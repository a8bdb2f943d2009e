"""python -m foxhunt_serve: the foxhunt-serve command."""

import sys

from foxhunt_serve.cli import main

sys.exit(main())
