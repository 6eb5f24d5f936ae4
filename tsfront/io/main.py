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


class _Terminate(BaseException):
    """SIGTERM. A BaseException: the handler can interrupt any code, and an ``except
    Exception`` there (logging's ``emit`` among them) would swallow `Stop` and keep serving."""


class _Handover(_Terminate):
    """SIGUSR1: stop, keeping the registrations for a successor."""


_PARENT = os.getppid()


def _stop(signum: int, frame: object) -> None:
    # The death signal of our parent is SIGTERM too, but its death is no decision to stop the
    # engine group (its supervisor may restart it): keep the registrations for a successor.
    # The kernel reparents us before it sends that signal, so getppid() already tells.
    if signum == signal.SIGUSR1 or os.getppid() != _PARENT:
        raise _Handover()
    raise _Terminate()


def main() -> int:
    """Run one I/O process."""
    parent = _PARENT
    _native.set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGUSR1, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches it
    if os.getppid() != parent:
        return 0  # the parent died before the death signal was armed
    logging.basicConfig(
        level=os.environ.get("TSFRONT_LOG", "WARNING").upper(),
        format="tsfront-io[%(process)d] %(levelname)s %(message)s",
    )
    request = json.loads(sys.stdin.readline())
    loop = None
    try:
        config = ClientConfig.from_dict(request["config"])
        loop = IOLoop(config, request["token"])
        addresses = loop.bind()
    except Exception as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # we are exiting anyway: close quietly
        report = {"error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}
        print(json.dumps(report), flush=True)
        if loop is not None:
            loop.close()
        return 2
    print(json.dumps(addresses), flush=True)
    handover = False
    try:
        loop.run()
    except _Handover:
        handover = True
    except (Stop, _Terminate):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        loop.close(keep_state=handover)
    return 0


if __name__ == "__main__":
    sys.exit(main())
