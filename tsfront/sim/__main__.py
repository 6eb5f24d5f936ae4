"""``python -m tsfront.sim``: the same as ``tsfront sim``."""

import sys

from tsfront.sim.cli import cli_main

sys.exit(cli_main())
