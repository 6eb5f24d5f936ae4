"""Garbage-collector settings for tsfront's own long-running processes.

CPython's cyclic collector runs a young-generation pass every 700 container allocations and,
now and then, a full pass over every tracked object. A serving process allocates a few
containers per token and holds a large, never-changing heap from start-up (the token table,
imported modules, the engine table): the young passes are frequent and the full passes walk
that heap for nothing. Measured in ``tsfront serve``'s worker, collection was 5 to 13 % of its CPU
(py-spy, docs/PERFORMANCE.md).

`settle` is called once a process has built everything it keeps (after the model is loaded
and the client attached; after the I/O process has bound its sockets): it collects once,
moves every object alive then to the permanent generation (`gc.freeze`: never scanned again)
and spaces the young passes out. Cycles made while serving are still collected, only less
often. Only tsfront's own processes call it (the I/O process, ``tsfront serve``'s workers):
a library never changes the collector of the application that embeds it.
"""

from __future__ import annotations

import gc
import os

__all__ = ["YOUNG_THRESHOLD", "settle"]

#: Container allocations between young-generation passes (CPython's default: 700).
YOUNG_THRESHOLD = 20_000


def settle() -> bool:
    """Freeze what this process has built and space out collections; False (and nothing
    changed) when ``TSFRONT_GC=default`` asks for CPython's own settings."""
    if os.environ.get("TSFRONT_GC", "").lower() == "default":
        return False
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return True
