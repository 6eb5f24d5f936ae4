"""The ``pip install`` line for one of tsfront's extras, as this copy of tsfront was installed.

tsfront is installed from its checkout (``pip install .``), not from a package index, so
the index form (the package name with the extra in brackets) cannot work. `install_line`
names what can: the checkout this copy came from (pip records it, PEP 610
``direct_url.json``), with the interpreter that runs tsfront, e.g.
``/srv/.venv/bin/python -m pip install '/src/tsfront[serve]'``; when the source is not
known, ``pip install '.[serve]'`` run in tsfront's checkout.
"""

from __future__ import annotations

import json
import shlex
import sys
from urllib.parse import unquote, urlparse

__all__ = ["install_line", "source_dir"]


def source_dir() -> str | None:
    """The local directory this copy of tsfront was installed from, if pip recorded one."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution("tsfront").read_text("direct_url.json")
    except (ImportError, PackageNotFoundError, OSError):
        return None
    if not text:
        return None
    try:
        url = json.loads(text).get("url", "")
    except (ValueError, AttributeError):
        return None
    parsed = urlparse(url)
    if parsed.scheme != "file" or "dir_info" not in text:
        return None
    return unquote(parsed.path) or None


def install_line(extra: str) -> str:
    """A command that installs tsfront's ``extra`` into the running interpreter."""
    source = source_dir()
    if source is None:
        return f"pip install '.[{extra}]' (in tsfront's checkout)"
    python = shlex.quote(sys.executable)
    return f"{python} -m pip install {shlex.quote(f'{source}[{extra}]')}"
