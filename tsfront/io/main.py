"""Entry point of the I/O process: ``python -m tsfront.io.main`` (started by `IOProcess`).

Reads the config as JSON on stdin, binds every socket, prints one JSON line with the real
addresses (or ``{"error": ...}``) on stdout, then serves until SIGTERM or until its parent dies.
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
from tsfront.io.process import ignore_sigint


class _Terminate(BaseException):
    """SIGTERM. A BaseException: the handler can interrupt any code, and an ``except
    Exception`` there (logging's ``emit`` among them) would swallow `Stop` and keep serving."""


def _stop(signum: int, frame: object) -> None:
    raise _Terminate()


def main() -> int:
    """Run one I/O process."""
    parent = os.getppid()
    _native.set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _stop)
    ignore_sigint()  # the parent decides; Ctrl-C reaches it
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
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # we are exiting anyway: close quietly
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        if loop is not None:
            loop.close()
        return 2
    print(json.dumps(addresses), flush=True)
    try:
        loop.run()
    except (Stop, _Terminate):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
