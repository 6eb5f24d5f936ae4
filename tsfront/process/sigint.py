"""Ctrl-C around starting a child process: held off in the parent, ignored in the child.

A process that starts children (the server's master starting the I/O process, the demo, the
bench) holds SIGINT while it forks (`hold_sigint`), and the child ignores it once it runs
(`ignore_sigint`): the parent alone answers Ctrl-C, and stops its children in order.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

_SIGINT = {signal.SIGINT}


class SigintHold:
    """SIGINT held off while a child process is started (`hold_sigint`); `release` ends it.

    SIGINT is blocked in this thread, and a child inherits the blocked mask through fork and
    exec, so a Ctrl-C to the process group cannot interrupt the child before it has called
    `ignore_sigint` (no KeyboardInterrupt traceback from a half-started child). In the main
    thread the Python handler is also swapped for one that only records the signal, since the
    kernel may deliver SIGINT to any other thread (numpy's BLAS threads, say) and Python then
    runs the handler in the main thread whatever its mask. `release` restores both and then
    answers a Ctrl-C that came meanwhile with the original handler, so none is lost.
    """

    def __init__(self) -> None:
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
        self._pending = False
        self._swapped = threading.current_thread() is threading.main_thread()
        self._handler: Any = None
        if self._swapped:
            self._handler = signal.signal(signal.SIGINT, self._defer)

    def _defer(self, signum: int, frame: object) -> None:
        self._pending = True

    def release(self) -> None:
        """Unblock SIGINT and restore its handler; raise a Ctrl-C that came meanwhile."""
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)  # a pending one: `_defer`
        if not self._swapped:
            return  # not the main thread: Python raises it there, not here
        handler = self._handler if self._handler is not None else signal.SIG_DFL
        signal.signal(signal.SIGINT, handler)
        if not self._pending:
            return
        if callable(handler):
            handler(signal.SIGINT, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def hold_sigint() -> SigintHold:
    """Hold SIGINT off while starting a child process; call ``release()`` once it started."""
    return SigintHold()


def ignore_sigint() -> None:
    """In a child started under `hold_sigint`: ignore SIGINT (its parent answers Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # also drops a Ctrl-C pending since start
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGINT)


__all__ = ["SigintHold", "hold_sigint", "ignore_sigint"]
