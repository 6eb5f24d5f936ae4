"""Lazy imports of the optional text dependencies.

``import tsfront`` and ``import tsfront.text`` work without ``tokenizers`` and ``jinja2``; the
first use that needs one of them raises :class:`TextDependencyMissing` naming the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from tsfront.install import install_line
from tsfront.text.errors import TextDependencyMissing


def require(module: str) -> ModuleType:
    """Import ``module`` (``"tokenizers"``, ``"jinja2"``, ...) or raise a typed error."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise TextDependencyMissing(
            f"tsfront.text needs the {top!r} package, which is not installed: "
            + install_line("text")
        ) from e
