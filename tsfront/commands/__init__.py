"""The ``tsfront`` commands: the command line on top of the library, never imported by it.

* :mod:`~tsfront.commands.main` — `main`, the entry point (``tsfront``, ``python -m tsfront``);
* :mod:`~tsfront.commands.registry` — the commands, each a `Command` (name, help, arguments,
  run) defined by its module: :mod:`~tsfront.commands.demo`,
  :mod:`~tsfront.commands.generate`, :mod:`~tsfront.commands.io`,
  :mod:`~tsfront.commands.sim`, :mod:`~tsfront.commands.bench`,
  :mod:`~tsfront.commands.serve`;
* :mod:`~tsfront.commands.options` — the engine-group options and their checks, shared by
  ``generate``, ``io`` and ``serve``;
* :mod:`~tsfront.commands.base` — errors, exit statuses and progress lines.
"""

from tsfront.commands.main import main

__all__ = ["main"]
