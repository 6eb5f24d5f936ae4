"""One HTTP worker process of ``tsfront serve``: attach, load the model, serve with uvicorn.

The worker is a spawned process (its own interpreter and GIL). It attaches to the I/O
process (which returns once every engine registered), loads the model's text layer, binds
the server's port with SO_REUSEPORT and serves the `ServeApp` with uvicorn (httptools
parser, uvloop). It reports ``("ready", index, pid)`` or ``("failed", index, why)`` on the
master's queue. SIGTERM ends it gracefully (uvicorn stops accepting, running requests get
`GRACE_S`, then their handlers are cancelled, which aborts their engine requests); it dies
with the master (PR_SET_PDEATHSIG) and stops by itself if its I/O process goes away, unless
the master restarts I/O processes (``tsfront serve --state-dir``): then it keeps serving (503
meanwhile), waits for the new I/O process's address on its own queue, attaches to it and
reports ``("reattached", index, pid)``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from tsfront.serve.chatsettings import ChatSettings
from tsfront.serve.edge import EdgeSettings

__all__ = ["WorkerOptions", "listening_socket", "worker_main"]

_PR_SET_PDEATHSIG = 1
#: Seconds running requests get to finish when the worker is told to stop.
GRACE_S = 2.0
_WATCH_S = 0.5


@dataclass(frozen=True)
class WorkerOptions:
    """What every worker needs (picklable: it crosses the spawn)."""

    model: str
    model_name: str
    host: str
    port: int
    address: str
    attach_timeout: float
    request_timeout: float | None = None  # every request's deadline (None: none)
    #: The HTTP edge: timeouts, limits, keys, CORS, logs (tsfront.serve.edge).
    edge: EdgeSettings = field(default_factory=EdgeSettings)
    #: Tool-call and reasoning parsers, the chat template (tsfront.serve.chatsettings).
    chat: ChatSettings = field(default_factory=ChatSettings)


def listening_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket bound with SO_REUSEPORT (and SO_REUSEADDR), listening if asked."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
            sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


async def _reattach(
    client: Any,
    service: Any,
    index: int,
    opts: WorkerOptions,
    events: Any,
    addresses: Any,
    server: Any,
) -> Any:
    """The I/O process is gone: attach to the one the master started instead (its address
    comes on ``addresses``); the new client, or None if the worker is stopping."""
    from tsfront.client import EngineClient

    while not server.should_exit:
        address = await asyncio.to_thread(_next_address, addresses)
        if address is None:
            continue
        fresh = await EngineClient.attach(address, timeout=opts.attach_timeout)
        service.client = fresh
        await client.close()
        events.put(("reattached", index, os.getpid()))
        return fresh
    return None


def _next_address(addresses: Any) -> str | None:
    # Bounded, so that a stopping worker never waits on the queue (and the thread ends).
    try:
        return addresses.get(timeout=_WATCH_S)
    except queue.Empty:
        return None


async def _serve(index: int, opts: WorkerOptions, events: Any, addresses: Any = None) -> int:
    import uvicorn

    from tsfront import heap
    from tsfront.client import EngineClient
    from tsfront.serve.api import OpenAIService
    from tsfront.serve.asgi import ServeApp
    from tsfront.serve.edge import setup_worker_edge
    from tsfront.text import TextModel

    protocol, gate, _ = setup_worker_edge(opts.edge)
    text = TextModel.load(opts.model)
    client = await EngineClient.attach(opts.address, timeout=opts.attach_timeout)
    service = OpenAIService(
        client, text, opts.model_name, index, opts.request_timeout, chat=opts.chat
    )
    app = ServeApp(service, gate=gate)
    heap.settle()
    config = uvicorn.Config(
        app,
        http=protocol,  # uvicorn's httptools protocol with the edge's limits
        lifespan="off",
        access_log=False,
        log_level=opts.edge.log_level,
        # uvicorn annotates int; it is only given to call_later, which takes seconds as float.
        timeout_keep_alive=opts.edge.timeout_keep_alive,  # type: ignore[arg-type]
        # uvicorn annotates int, but passes it to asyncio.timeout, which takes seconds as float.
        timeout_graceful_shutdown=GRACE_S,  # type: ignore[arg-type]
        server_header=False,
        date_header=False,
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                events.put(("ready", index, os.getpid()))

    server = Server(config)
    sock = listening_socket(opts.host, opts.port, listen=True)

    async def watch_io() -> None:
        nonlocal client
        while True:
            while not client.closed:
                await asyncio.sleep(_WATCH_S)
            if addresses is None:
                break
            try:
                fresh = await _reattach(client, service, index, opts, events, addresses, server)
            except Exception as exc:  # the master hears of it and stops the server
                events.put(("failed", index, f"re-attaching: {type(exc).__name__}: {exc}"))
                break
            if fresh is None:
                return
            client = fresh
        server.should_exit = True

    watcher = asyncio.ensure_future(watch_io())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        sock.close()
        await client.close()
    return 1 if client.closed and not server.should_exit else 0


def worker_main(index: int, opts: WorkerOptions, events: Any, addresses: Any = None) -> None:
    """Entry point of a spawned worker process."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the master, which stops us
    # uvicorn handles SIGTERM while it serves and re-raises it when done: with this handler
    # the re-raise is harmless and the worker detaches cleanly instead of dying there.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    import uvloop

    try:
        code = uvloop.run(_serve(index, opts, events, addresses))
    except BaseException as exc:
        events.put(("failed", index, f"{type(exc).__name__}: {exc}"))
        code = 1
    sys.exit(code)
