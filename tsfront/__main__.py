"""``python -m tsfront``: the same as the ``tsfront`` command."""

import sys

from tsfront.commands import main

sys.exit(main())
