"""One HTTP worker process of ``tsfront serve``: attach, load the model, serve with uvicorn.

The worker is a spawned process (its own interpreter and GIL). It loads the model's text
layer, attaches to the I/O process without waiting for the engines, and serves the
`ServeApp` with uvicorn (httptools parser, uvloop) on the listening sockets the master gave
it (its place's socket of the server's port, and of ``--metrics-port``: see
`tsfront.serve.processes.ports`) at once: while the engines load it answers ``/liveness`` 200 and
``/readiness``, ``/health`` and the API routes 503 (`ServeApp`). On the master's queue it
reports ``("listening", index, pid)``, where the engines' handshake stands whenever that
changes (``("engines", index, {...})``), then ``("ready", index, pid)`` once every engine
registered, or ``("handshake", index, why)`` if they did not in time, or ``("failed",
index, why)``; and it stores a heartbeat in the master's shared words (`ServeCounters`)
every `heartbeat_interval` from its event loop: a loop that stops running stops the
heartbeat, and the master kills the worker.

SIGTERM drains it (`Drain`): it closes its listening sockets first (the master closed its
own copies before it sent the signal, so new connections go to the other workers, or are
refused once every worker drains), answers 503 on the connections
it still has, lets running requests finish for up to ``graceful_timeout`` seconds, then
cancels the rest, which aborts their engine requests; a second SIGTERM cuts them at once.
It dies with the master (PR_SET_PDEATHSIG) and stops by itself if its I/O process goes
away, unless the master restarts I/O processes (``tsfront serve --state-dir``): then it keeps
serving (503 meanwhile), waits for the new I/O process's address on its own queue, attaches
to it and reports ``("reattached", index, pid)``.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import queue
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from tsfront.process.sigint import ignore_sigint
from tsfront.process.title import set_title
from tsfront.serve.core.chatsettings import ChatSettings
from tsfront.serve.edge.settings import EdgeSettings

__all__ = ["WorkerOptions", "worker_main"]

_PR_SET_PDEATHSIG = 1
_WATCH_S = 0.5
#: How often a draining worker looks whether its running requests are done.
_DRAIN_POLL_S = 0.05


@dataclass(frozen=True)
class WorkerOptions:
    """What every worker needs (picklable: it crosses the spawn)."""

    model: str
    #: ``--tokenizer``: the tokenizer's folder when it is not the model's.
    tokenizer: str | None
    model_name: str
    host: str
    port: int
    address: str
    attach_timeout: float
    request_timeout: float | None = None  # every request's deadline (None: none)
    #: The HTTP edge: timeouts, limits, keys, CORS, logs (tsfront.serve.edge.settings).
    edge: EdgeSettings = field(default_factory=EdgeSettings)
    graceful_timeout: float = 30.0
    worker_timeout: float = 30.0
    metrics_port: int | None = None
    #: ``--chat-template`` (its source) and ``--default-chat-template-kwargs``.
    chat_template: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: The tool-call and reasoning parsers (tsfront.serve.core.chatsettings).
    chat: ChatSettings = field(default_factory=ChatSettings)
    #: The address of the server's responses store process (None: a store in the worker).
    responses_store: str | None = None
    #: ``--max-model-len`` (None: the engines' and the model's context only).
    max_model_len: int | None = None
    #: The server's seal on reasoning handed to clients (tsfront.serve.core.seal): the
    #: master's, the same for every worker (None: the worker makes its own).
    reasoning_key: bytes | None = field(default=None, repr=False)
    #: ``--encode-cache-mb``: the shared store's `multiprocessing.heap.Arena` (False: none;
    #: None: the worker's own, as an embedded server's).
    encode_cache: Any = None


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
    from tsfront.client.engine_client import EngineClient

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


#: Seconds cut requests get to write their last event before uvicorn cancels them.
_CUT_WAIT_S = 1.0


class Drain:
    """A worker's graceful stop: the first `signal` drains, the second cuts at once.

    Draining closes the listening sockets (so the kernel sends new connections to the other
    workers of the port, or refuses them), makes the app answer 503 (`ServeApp.draining`),
    waits until no request runs or ``grace`` seconds passed, then cuts what still runs
    (`ServeApp.cut`: each response ends with an error event, its engine requests aborted)
    and lets uvicorn stop.
    """

    def __init__(self, server: Any, app: Any, sockets: list[socket.socket], grace: float) -> None:
        self._server = server
        self._app = app
        self._sockets = sockets
        self._grace = grace
        self._now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def signal(self) -> None:
        """SIGTERM (on the loop): drain, or stop at once if draining already."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        else:
            self._now.set()

    async def _run(self) -> None:
        server = self._server
        self._app.draining = True
        for listener in getattr(server, "servers", []):
            listener.close()
        for sock in self._sockets:
            sock.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace
        while server.server_state.tasks and loop.time() < deadline and not self._now.is_set():
            try:
                await asyncio.wait_for(self._now.wait(), _DRAIN_POLL_S)
            except TimeoutError:
                pass
        # What still runs is cut by the app (each response ends with an error event, its engine
        # requests aborted), which takes a turn or two of the loop; uvicorn then waits at most
        # _CUT_WAIT_S for the rest and cancels what is left.
        self._app.cut()
        server.config.timeout_graceful_shutdown = _CUT_WAIT_S
        server.should_exit = True


async def _heartbeat(counters: Any, index: int, interval: float, limits: Any) -> None:
    # With each beat, the edge's counts (on top of what a predecessor in this place left).
    from tsfront.serve.processes.counters import EDGE_EVENTS

    base = counters.edge(index)
    counts = limits.counts
    while True:
        counters.beat(index)
        counters.set_edge(index, [b + counts[e] for b, e in zip(base, EDGE_EVENTS, strict=True)])
        await asyncio.sleep(interval)


def _setup_edge(settings: EdgeSettings) -> tuple[Any, Any, Any]:
    """In a worker: raise the fd limit, configure logging; the protocol class, the gate and the
    connection limits (whose ``counts`` say what was refused)."""
    from tsfront.serve.edge.gate import Gate
    from tsfront.serve.edge.protocol import EdgeLimits, protocol_class
    from tsfront.serve.edge.settings import configure_logging, connection_cap, raise_fd_limit

    soft, _ = raise_fd_limit()
    configure_logging(settings)
    cap = connection_cap(settings.max_connections, soft)
    if cap < settings.max_connections:
        logging.getLogger("tsfront.serve").info(
            "connection cap %d (the fd limit is %d; --max-connections %d)",
            cap,
            soft,
            settings.max_connections,
        )
    limits = EdgeLimits(
        timeout_header=settings.timeout_header,
        timeout_body=settings.timeout_body,
        max_header_bytes=settings.max_header_bytes,
        max_connections=cap,
    )
    return protocol_class(limits), Gate(settings), limits


async def _serve(
    index: int,
    opts: WorkerOptions,
    events: Any,
    addresses: Any,
    counters: Any,
    sockets: list[socket.socket],
) -> int:
    import uvicorn

    from tsfront.client.engine_client import EngineClient
    from tsfront.process import heap
    from tsfront.serve.edge.asgi import ServeApp
    from tsfront.serve.edge.metrics_page import MetricsPage
    from tsfront.serve.openai.completions import OpenAIService
    from tsfront.serve.processes.counters import heartbeat_interval
    from tsfront.serve.processes.store import LocalStore, StoreClient
    from tsfront.serve.responses.endpoints import Responses
    from tsfront.text import TextModel

    protocol, gate, limits = _setup_edge(opts.edge)
    beating = None
    if counters is not None:
        beating = asyncio.ensure_future(
            _heartbeat(counters, index, heartbeat_interval(opts.worker_timeout), limits)
        )
    text = TextModel.load(opts.model, opts.tokenizer)
    # Attached, not waiting for the engines: the worker serves its probes (and 503s) while
    # they load; `_registration` reports their progress and, once they are in, ``ready``.
    client = await EngineClient.attach(opts.address, timeout=opts.attach_timeout, registered=False)
    service = OpenAIService(
        client,
        text,
        opts.model_name,
        index,
        opts.request_timeout,
        chat_template=opts.chat_template,
        template_kwargs=opts.template_kwargs,
        chat=opts.chat,
        max_model_len=opts.max_model_len,
        reasoning_key=opts.reasoning_key,
        encode_cache=opts.encode_cache.buffer if opts.encode_cache else opts.encode_cache,
    )
    page = MetricsPage(lambda: service.client, counters)
    store: Any = LocalStore() if opts.responses_store is None else StoreClient(opts.responses_store)
    app = ServeApp(
        service,
        responses=Responses(service, store),
        gate=gate,
        counters=counters,
        place=index,
        metrics=page.render,
        metrics_port=opts.metrics_port,
        loading=True,
    )
    heap.settle()
    config = uvicorn.Config(
        app,
        http=protocol,  # tsfront's own HTTP/1.1 protocol, with the edge's limits
        lifespan="off",
        access_log=False,
        log_level=opts.edge.log_level,
        # uvicorn annotates int; it is only given to call_later, which takes seconds as float.
        timeout_keep_alive=opts.edge.timeout_keep_alive,  # type: ignore[arg-type]
        # uvicorn annotates int, but passes it to asyncio.timeout, which takes seconds as float.
        timeout_graceful_shutdown=opts.graceful_timeout,  # type: ignore[arg-type]
        server_header=False,
        date_header=False,
        # Nothing reads the client's address or scheme: no X-Forwarded-* rewrite per request
        # (uvicorn's ProxyHeadersMiddleware, another ASGI layer around every request).
        proxy_headers=False,
    )
    drain: Drain | None = None

    listening = asyncio.Event()

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                events.put(("listening", index, os.getpid()))
                listening.set()

        def handle_exit(self, sig: int, frame: Any) -> None:
            # A signal handler (the main thread, between bytecodes): hand it to the loop.
            # uvicorn takes SIGINT too: a Ctrl-C to the process group is the master's to
            # answer (it drains every worker with SIGTERM), as before uvicorn ran.
            if sig != signal.SIGINT and drain is not None:
                loop.call_soon_threadsafe(drain.signal)

    loop = asyncio.get_running_loop()
    server = Server(config)
    for sock in sockets:
        sock.setblocking(False)
    drain = Drain(server, app, sockets, opts.graceful_timeout)

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
    registering = asyncio.ensure_future(
        _registration(client, index, opts.attach_timeout, events, listening, server)
    )
    try:
        await server.serve(sockets=sockets)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # uvicorn restored _stop_starting
        registering.cancel()
        watcher.cancel()
        if beating is not None:
            beating.cancel()
        for sock in sockets:
            sock.close()
        await client.close()
        await store.close()
    if registering.done() and not registering.cancelled() and not registering.result():
        return 1  # the engines never registered (reported)
    return 1 if client.closed and not server.should_exit else 0


async def _registration(
    client: Any,
    index: int,
    timeout: float,
    events: Any,
    listening: asyncio.Event,
    server: Any,
) -> bool:
    """Until every engine registered, report where each rank stands (``("engines", index,
    {...})`` whenever it changes); then, once the worker listens too, ``("ready", index,
    pid)``. A handshake that fails (or times out) is ``("handshake", index, why)`` and stops
    the worker; returns whether the engines registered."""
    from tsfront.errors import ClientClosed, Error

    config = client.attachment.config
    where = {
        "handshake": client.attachment.addresses.get("handshake_address"),
        "first": config.first_engine_index,
        "timeout": config.handshake_timeout,
    }
    waiting = asyncio.ensure_future(client.wait_registered(timeout))
    last = None
    try:
        while not waiting.done():
            try:
                states = client.registration()
            except ClientClosed:
                break
            if states != last:
                last = states
                events.put(("engines", index, {**where, "states": states}))
            await asyncio.wait({waiting}, timeout=_WATCH_S)
        await waiting
    except Error as exc:
        events.put(("handshake", index, str(exc)))
        server.should_exit = True
        return False
    finally:
        waiting.cancel()
    await listening.wait()
    events.put(("ready", index, os.getpid()))
    return True


class _Stopped(BaseException):
    """SIGTERM before the worker serves."""


def _stop_starting(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stopped


def worker_main(
    index: int,
    opts: WorkerOptions,
    events: Any,
    addresses: Any,
    counters: Any,
    sockets: list[socket.socket],
) -> None:
    """Entry point of a spawned worker process; ``sockets``: its place's listening sockets
    (the API port's, then ``--metrics-port``'s), which the master keeps open too."""
    _die_with_parent()
    ignore_sigint()  # Ctrl-C goes to the master, which stops us (held off while we started)
    set_title(f"worker {index}", f"w{index}")
    # The workers are the server's parallelism: the tokenizer's own thread pool would hand a
    # long prompt's pieces to other threads, which then spin; encoded in the calling thread
    # the agent preset's CPU per request is 10-20 % lower (docs/PERFORMANCE.md).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Until it serves, SIGTERM stops it (nothing to drain); while it serves, SIGTERM drains
    # (Server.handle_exit); after, it is ignored, so that the worker detaches and exits
    # cleanly. `_stop_starting` raises at most once (it ignores SIGTERM first), wherever the
    # signal lands; the outer ``try`` catches it even inside the inner handlers, so that no
    # stop is ever a traceback.
    signal.signal(signal.SIGTERM, _stop_starting)
    serving = None
    try:
        try:
            import uvloop

            serving = _serve(index, opts, events, addresses, counters, sockets)
            code = uvloop.run(serving)
        except _Stopped:
            code = 0
        except BaseException as exc:
            events.put(("failed", index, f"{type(exc).__name__}: {exc}"))
            code = 1
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except _Stopped:
        code = 0
    finally:
        if serving is not None:
            # Stopped before the loop ran it: closed, so it is not "never awaited" on stderr
            # (a no-op once it ran).
            serving.close()
    sys.exit(code)
