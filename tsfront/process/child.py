"""The command line of a tsfront process started as a child (`subprocess`)."""

from __future__ import annotations

import sys


def python_module(module: str, *args: str) -> list[str]:
    """``python -P -m module args`` with this interpreter. ``-P``: the working directory is not
    put on ``sys.path``, so a ``tsfront/`` there (a source checkout, another version) never
    shadows the installed package and its compiled native extension."""
    return [sys.executable, "-P", "-m", module, *args]
