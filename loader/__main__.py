"""`python -m loader ...` (see loader.cli)."""

import sys

from .cli import main

sys.exit(main(builder_plugins=True))
