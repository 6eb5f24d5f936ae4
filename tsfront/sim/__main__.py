"""``python -m tsfront.sim``: the same as ``tsfront sim`` (an entry point, like
``python -m tsfront``: the one place of tsfront.sim that imports the commands)."""

import sys

from tsfront.commands import main

sys.exit(main(["sim", *sys.argv[1:]]))
