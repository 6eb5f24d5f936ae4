"""Process titles: how tsfront's processes show in ``ps``, ``top`` and /proc.

Each process of a server names itself with `set_title` as it starts, in two places:

* its **command line** (``ps -o args``, ``ps aux``, /proc/PID/cmdline) becomes ``tsfront:
  ROLE``, written over the memory of its original arguments by ``tsfront._native`` (see
  native/title.c: the kernel shows whatever that memory holds; a title longer than the
  original command line is cut to its length);
* its **name** (``ps -e``, ``top``, ``pgrep``, /proc/PID/comm) becomes ``tsfront: NAME``, at
  most 15 bytes (the kernel's limit), hence the short names:

- ``tsfront serve``'s master: ``tsfront: master serve --model ...``, named ``tsfront: master``;
- the I/O process: ``tsfront: io``, named the same;
- HTTP worker N: ``tsfront: worker N``, named ``tsfront: wN``;
- the responses store: ``tsfront: store``, named the same;
- simulated rank R of engine index I (``tsfront sim --processes``): ``tsfront: sim rank R
  (engine I)``, named ``tsfront: sim R``.

The master keeps its arguments after its title (as far as the original command line's length
allows), so ``ps`` still says what it serves. A leaf: it imports only ``tsfront._native``.
"""

from __future__ import annotations

from tsfront import _native

__all__ = ["PREFIX", "set_title"]

#: What every title starts with (``pgrep -f '^tsfront: '`` finds a server's processes).
PREFIX = "tsfront: "


def set_title(role: str, name: str | None = None, detail: str = "") -> str:
    """Name this process ``tsfront: ROLE`` (with ``detail`` after it on the command line) and
    ``tsfront: NAME`` (``name``, default ``role``, cut to 15 bytes); returns the command line
    ps will show. Never fails: a process whose title cannot be set keeps its old one."""
    line = PREFIX + role + (" " + detail if detail else "")
    try:
        shown = _native.set_process_title(line, PREFIX + (name or role))
    except (OSError, ValueError):  # ValueError: a NUL in the text
        return ""
    return line.encode()[:shown].decode(errors="ignore")
