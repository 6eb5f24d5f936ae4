"""``python -m tsfront``: the same as the ``tsfront`` command."""

import sys

from tsfront.cli import main

sys.exit(main())
