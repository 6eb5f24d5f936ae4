"""Entry point of the I/O process: ``python -m tsfront.io.main`` (started by `IOProcess`).

Reads the config as JSON on stdin, binds every socket, prints one JSON line with the real
addresses (or ``{"error": ...}``) on stdout, then serves until SIGTERM or until its parent dies.
SIGUSR1, or the death of the process that started it, stops it the same way but keeps its
state directory's registrations, for a successor to take the engines over (a handover, e.g.
for an upgrade, or a supervisor restarting a crashed server).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

from tsfront import _native
from tsfront.config import ClientConfig
from tsfront.io.loop import IOLoop, Stop
from tsfront.process import heap
from tsfront.process.sigint import ignore_sigint
from tsfront.process.title import set_title


class _Terminate(BaseException):
    """SIGTERM. A BaseException: the handler can interrupt any code, and an ``except
    Exception`` there (logging's ``emit`` among them) would swallow `Stop` and keep serving."""


class _Handover(_Terminate):
    """SIGUSR1: stop, keeping the registrations for a successor."""


# The signal the kernel sends us when our parent dies: its own, because that death is no
# decision to stop the engine group (a supervisor may restart the server), so it keeps the
# registrations like a handover. (A check of getppid() in a SIGTERM handler cannot tell: when
# the parent is killed, the thread that started us may die first and we are handed to a
# sibling thread of the same process.)
PARENT_DEATH_SIGNAL = signal.SIGUSR2


def _stop(signum: int, frame: object) -> None:
    if signum in (signal.SIGUSR1, PARENT_DEATH_SIGNAL):
        raise _Handover()
    raise _Terminate()


def main() -> int:
    """Run one I/O process."""
    parent = os.getppid()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGUSR1, _stop)
    signal.signal(PARENT_DEATH_SIGNAL, _stop)
    _native.set_parent_death_signal(PARENT_DEATH_SIGNAL)
    ignore_sigint()  # the parent decides; Ctrl-C reaches it
    set_title("io")
    if os.getppid() != parent:
        return 0  # the parent died before the death signal was armed
    level = os.environ.get("TSFRONT_LOG", "WARNING").upper()
    if not isinstance(logging.getLevelName(level), int):
        level = "WARNING"  # a typo in the variable must not keep the I/O process from starting
    logging.basicConfig(
        level=level, format="tsfront-io[%(process)d] %(name)s %(levelname)s %(message)s"
    )
    request = json.loads(sys.stdin.readline())
    loop = None
    try:
        config = ClientConfig.from_dict(request["config"])
        loop = IOLoop(config, request["token"])
        addresses = loop.bind()
    except Exception as exc:
        for signum in (signal.SIGTERM, signal.SIGUSR1, PARENT_DEATH_SIGNAL):
            signal.signal(signum, signal.SIG_IGN)  # we are exiting anyway: close quietly
        report = {"error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}
        print(json.dumps(report), flush=True)
        if loop is not None:
            loop.close()
        return 2
    print(json.dumps(addresses), flush=True)
    handover = False
    try:
        heap.settle()
        loop.run()
    except _Handover:
        handover = True
    except (Stop, _Terminate):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(PARENT_DEATH_SIGNAL, signal.SIG_IGN)
        loop.close(keep_state=handover)
    return 0


def _main() -> int:
    # A stop may land anywhere, also before `main` serves (while it reads its config or binds)
    # or as it closes: it is an orderly end, never a traceback.
    try:
        return main()
    except _Terminate:
        return 0


if __name__ == "__main__":
    sys.exit(_main())
