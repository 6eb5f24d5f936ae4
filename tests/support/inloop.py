"""A uvicorn `Server` in the test's own event loop, on a loopback port: for tests that drive
an HTTP protocol class (tsfront serve's, or uvicorn's) with raw sockets from the same loop."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import uvicorn

DEADLINE = 10.0


async def start_uvicorn(app: Any, http: Any, **config: Any) -> tuple[uvicorn.Server, Any, int]:
    """Serve ``app`` with the protocol ``http`` (a class or uvicorn's name for one) and the
    rest of ``config``; returns the server, its task and its port once it has started."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=http, lifespan="off", **config))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    deadline = time.monotonic() + DEADLINE
    while not server.started:
        assert time.monotonic() < deadline and not task.done(), "the server did not start"
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]
