"""The HTTP connection of a worker: uvicorn's httptools protocol, bounded against hostile clients.

uvicorn's `HttpToolsProtocol` parses requests and runs the ASGI app; `EdgeProtocol` adds what a
public port needs and uvicorn does not have (its ``timeout_keep_alive`` runs only after a
response and any byte cancels it; its ``limit_concurrency`` answers 503 only once headers are
complete, so idle connections still hold their fds):

* **Header deadline**: a connection has ``timeout_header`` seconds, from its accept or from the
  end of its previous response, to send a request's complete headers, else it is closed (before
  the first byte, trickled headers, between keep-alive requests alike). uvicorn's keep-alive
  deadline (``timeout_keep_alive`` after a response, ended by any byte; then closed, not
  counted) is kept by the same timer, not a timer armed and cancelled per response.
* **Header size**: the bytes of a request's headers are held by this class until the blank line
  that ends them arrives, then fed to the parser in one piece; more than ``max_header_bytes``
  before it is answered 431 and closed. (httptools joins a header's pieces with ``+=``: fed as
  it arrives, a 128 MiB header cost 20 s of CPU.)
* **Body deadline**: a body must be complete ``timeout_body`` seconds after its headers, else
  the request is answered 408 (or, once its response has begun, the connection is closed); the
  app's ``receive`` then says ``http.disconnect`` and what it held of the body is released.
* **Connection cap**: past ``max_connections`` open connections of this worker, a new one takes
  the place of the oldest that is waiting for request headers (it is closed); with none
  waiting, the new one is closed at once. Both are logged, at most every `CAP_LOG_S`.
* **Disconnects**: a closed connection ends every request of it (uvicorn tells only the newest,
  so a request with another pipelined behind it ran to its end), and reading goes on while a
  request runs with others queued behind it, so that the client's EOF is seen; at most
  `MAX_PIPELINED` queued requests per connection, past that the connection is closed.
  Each request's cycle has a ``tsfront_on_lost`` attribute
  (`tsfront.serve.transport.LOST_HOOK`), None until the app puts a callable there: when the
  connection is lost while the request runs, it is called once, in ``connection_lost``
  (`tsfront.serve.asgi` hears of the client leaving that way instead of waiting on
  ``receive()`` for ``http.disconnect``: no future and no step per request).

* **The connection's write state**: uvicorn gets the connection's transport wrapped in a
  `tsfront.serve.transport.ConnectionTransport`, whose clean flag every write, close and abort
  clears, as do ``pause_writing`` and ``connection_lost`` here; the drain's native pass sends
  a token's event with fewer checks while it is set (see that module).
* **One write for a response's head and its first bytes**: a request's cycle writes through a
  `_HeadWriter`, which holds the status line and headers until the next write of the same
  loop turn (the first body bytes, sent right after the start by every route) and sends both
  in one ``write``; a head with nothing after it in that turn goes out at the next turn. Then
  the cycle writes to the transport itself again.

Nothing else here is on the response path: sends (the per-token writes) are uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tsfront.serve.transport import LOST_HOOK, ConnectionTransport

__all__ = ["CAP_LOG_S", "MAX_PIPELINED", "EdgeLimits", "EdgeProtocol", "protocol_class"]

log = logging.getLogger("tsfront.serve")

#: Requests one connection may have queued behind the one running (HTTP pipelining).
MAX_PIPELINED = 16
#: Seconds between two log lines about refused or evicted connections.
CAP_LOG_S = 10.0

_HEADERS_END = (b"\r\n\r\n", b"\n\n")


def _headers_end(buf: bytes | bytearray, start: int) -> int:
    """The index just past the first blank line in ``buf`` at or after ``start``, or -1."""
    end = -1
    for mark in _HEADERS_END:
        found = buf.find(mark, start)
        if found >= 0 and (end < 0 or found + len(mark) < end):
            end = found + len(mark)
    return end


class _HeadWriter:
    """The transport a request's cycle writes through until its response's head is out (see
    the module's doc); everything but ``write`` and ``close`` is the transport's."""

    __slots__ = ("_cycle", "_head", "_loop", "_transport")

    def __init__(self, cycle: Any, transport: asyncio.Transport, loop: Any) -> None:
        self._cycle = cycle
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:  # the first bytes after the head: both in one write
            self._head = None
            self._cycle.transport = self._transport
            self._transport.write(head + data)
        elif self._cycle.response_started:  # uvicorn marks the start, then writes the head
            self._head = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)  # before the response (100 Continue)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._cycle.transport = self._transport
            self._transport.write(head)

    @property
    def connection_transport(self) -> asyncio.Transport:
        """The connection's own transport, which this writer stands in front of."""
        return self._transport

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _error_response(status: int, reason: str, message: str, kind: str) -> bytes:
    body = (
        b'{"error":{"message":"' + message.encode() + b'","type":"' + kind.encode() + b'",'
        b'"param":null,"code":null}}'
    )
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class EdgeLimits:
    """The limits of one worker's connections, and the worker's count of what they refused."""

    def __init__(
        self,
        *,
        timeout_header: float,
        timeout_body: float,
        max_header_bytes: int,
        max_connections: int,
    ) -> None:
        self.timeout_header = timeout_header
        self.timeout_body = timeout_body
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.too_large = _error_response(
            431,
            "Request Header Fields Too Large",
            f"request headers over {max_header_bytes} bytes; send smaller headers",
            "invalid_request_error",
        )
        self.timed_out = _error_response(
            408,
            "Request Timeout",
            f"the request body did not arrive within {timeout_body:g} s; send it faster",
            "invalid_request_error",
        )
        #: Open connections of the worker, and those waiting for request headers (oldest first).
        self.open: set[EdgeProtocol] = set()
        self.waiting: dict[EdgeProtocol, None] = {}
        #: Counts since the worker started: connections refused at the cap, idle ones evicted
        #: for a new one, header and body deadlines hit, 431s.
        self.counts = {"refused": 0, "evicted": 0, "header_timeout": 0, "body_timeout": 0}
        self.counts["too_large"] = 0
        self._logged_at = 0.0
        self._unlogged = {"refused": 0, "evicted": 0}

    def note_cap(self, what: str) -> None:
        """Count a refused or evicted connection; log at most every `CAP_LOG_S` seconds."""
        self.counts[what] += 1
        self._unlogged[what] += 1
        now = time.monotonic()
        if now - self._logged_at >= CAP_LOG_S:
            self._logged_at = now
            refused, evicted = self._unlogged["refused"], self._unlogged["evicted"]
            self._unlogged = {"refused": 0, "evicted": 0}
            log.warning(
                "connection cap (%d per worker) reached: %d new connection(s) refused, %d idle "
                "one(s) closed to make room (--max-connections)",
                self.max_connections,
                refused,
                evicted,
            )


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the worker's `EdgeLimits` (see the module's doc).

    Made by `protocol_class`, which binds the limits.
    """

    limits: ClassVar[EdgeLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending = bytearray()  # request-header bytes not yet fed to the parser
        self._tail = b""  # the last bytes fed, for a blank line split across reads
        self._in_body = False  # the parser is past a request's headers, before its end
        # Each deadline is a time (0.0: none running) and at most one armed timer, which
        # looks at the time when it fires and re-arms for a later one: a request moves the
        # times, it does not cancel and re-make timers (two a request, ~5 us, measured).
        self._header_due = 0.0
        self._body_due = 0.0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # uvicorn's keep-alive deadline (``timeout_keep_alive`` after a response, cancelled by
        # any byte), kept by the header timer too: uvicorn would arm and cancel a timer per
        # response. The header timer fires by the earlier of the two (``_header_at``).
        self._idle_due = 0.0
        self._header_at = 0.0
        self._cycles: list[Any] = []  # this connection's requests without a complete response

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self.limits
        if len(limits.open) >= limits.max_connections:
            oldest = next(iter(limits.waiting), None)
            if oldest is None:
                limits.note_cap("refused")
                transport.abort()
                return
            limits.note_cap("evicted")
            oldest.transport.abort()
            oldest._forget()  # aborted transports report their loss later, in a callback
        # Every write of uvicorn's and of the app's on this connection goes through it: the
        # drain's native pass reads its clean flag (tsfront.serve.transport).
        super().connection_made(cast(asyncio.Transport, ConnectionTransport(transport)))
        limits.open.add(self)
        self._wait_headers()

    def pause_writing(self) -> None:
        cast(ConnectionTransport, self.transport).unclean()
        super().pause_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused at the cap: never made
            return
        # First: the event loop closes the socket once this returns.
        cast(ConnectionTransport, self.transport).lost()
        self._forget()
        # uvicorn tells only the newest request; every one still running must hear of it.
        cycles, self._cycles = self._cycles, []
        for cycle in cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                hook = getattr(cycle, LOST_HOOK, None)
                if hook is not None:  # the app's handler: cancelled (scheduled, not run here)
                    setattr(cycle, LOST_HOOK, None)
                    hook()
            cycle.message_event.set()
        self._pending = bytearray()
        super().connection_lost(exc)

    def _forget(self) -> None:
        limits = self.limits
        limits.open.discard(self)
        limits.waiting.pop(self, None)
        self._cancel_timers()

    def _cancel_timers(self) -> None:
        self._header_due = self._body_due = self._idle_due = 0.0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ headers

    def _wait_headers(self, idle: bool = False) -> None:
        """The connection now waits for a request's headers: start its deadline (``idle``:
        after a response, and the keep-alive deadline too)."""
        limits = self.limits
        limits.waiting[self] = None
        now = self.loop.time()
        self._header_due = due = now + limits.timeout_header
        if idle:
            self._idle_due = idle_due = now + self.timeout_keep_alive
            due = min(due, idle_due)
        if self._header_timer is None:
            self._arm_header(due)
        elif due < self._header_at:  # rare: once per connection and keep-alive period
            self._header_timer.cancel()
            self._arm_header(due)

    def _arm_header(self, due: float) -> None:
        self._header_at = due
        self._header_timer = self.loop.call_at(due, self._header_check)

    def _header_check(self) -> None:
        self._header_timer = None
        now = self.loop.time()
        idle = self._idle_due
        if idle and now >= idle:
            # Idle since its last response for timeout_keep_alive: closed (as uvicorn does).
            self._header_due = self._idle_due = 0.0
            self._close()
            return
        due = self._header_due
        if due and now >= due:
            self._header_due = self._idle_due = 0.0
            self.limits.counts["header_timeout"] += 1
            self._close()
            return
        # Moved since the timer was armed, or none running now: arm for the earlier, if any.
        if due or idle:
            self._arm_header(min(due or idle, idle or due))

    def data_received(self, data: bytes) -> None:
        if self._in_body:  # body bytes: straight to the parser
            super().data_received(data)
            return
        # The keep-alive deadline ends with any byte (as uvicorn's timer); these are held,
        # not fed.
        self._idle_due = 0.0
        pending = self._pending
        if pending:
            start = max(0, len(pending) - 3)
            pending += data
            end = _headers_end(pending, start)
        else:
            # The blank line may begin in the bytes fed last (a request pipelined in part).
            skip = len(self._tail)
            end = _headers_end(self._tail + data if skip else data, 0)
            if end >= 0:
                end = max(0, end - skip)
            else:
                pending += data
        limit = self.limits.max_header_bytes
        if end < 0:
            if len(pending) > limit:
                self._headers_too_large()
            return
        if end > limit:
            self._headers_too_large()
            return
        chunk = bytes(pending) if pending else data
        self._pending = bytearray()
        self._tail = b""
        super().data_received(chunk)
        if not self._in_body:
            self._tail = chunk[-3:]

    def _headers_too_large(self) -> None:
        limits = self.limits
        limits.counts["too_large"] += 1
        self._pending = bytearray()
        self.limits.waiting.pop(self, None)
        if any(not c.response_complete for c in self._cycles):
            # A response is being written on this connection: no room for another.
            self.transport.abort()
            return
        self.transport.write(limits.too_large)
        self._close()

    def on_headers_complete(self) -> None:
        self._header_due = 0.0
        self.limits.waiting.pop(self, None)
        busy = any(not c.response_complete for c in self._cycles)
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before:  # a new request's cycle (not an upgrade)
            cycle.transport = _HeadWriter(cycle, self.transport, self.loop)  # type: ignore[assignment]
            setattr(cycle, LOST_HOOK, None)  # the app may hook the connection's loss
        self._cycles.append(cycle)
        self._in_body = True
        if not busy:
            self._start_body_deadline()
        elif self.pipeline:
            if len(self.pipeline) > MAX_PIPELINED:
                log.warning(
                    "a client pipelined over %d requests on one connection; closing it",
                    MAX_PIPELINED,
                )
                self.transport.abort()
                return
            # uvicorn stops reading here; keep reading, so that the client's EOF is seen.
            self.flow.resume_reading()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        self._body_due = 0.0

    # ------------------------------------------------------------------ body

    def _start_body_deadline(self) -> None:
        self._body_due = due = self.loop.time() + self.limits.timeout_body
        if self._body_timer is None:
            self._body_timer = self.loop.call_at(due, self._body_check)

    def _body_check(self) -> None:
        self._body_timer = None
        due = self._body_due
        if not due:
            return  # the body came: no deadline now
        if self.loop.time() < due:
            self._body_timer = self.loop.call_at(due, self._body_check)
            return
        self._body_due = 0.0
        self.limits.counts["body_timeout"] += 1
        running = next((c for c in self._cycles if not c.response_complete), None)
        if running is not None and not running.response_started:
            self.transport.write(self.limits.timed_out)
        self._close()

    # ------------------------------------------------------------------ responses

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)
        self._cycles = [c for c in self._cycles if not c.response_complete]
        if queued:
            super().on_response_complete()  # starts the next request (no keep-alive timer)
        else:
            # uvicorn's steps without arming its keep-alive timer (`_wait_headers` keeps
            # that deadline, so uvicorn's timer is never armed): the count, reading resumed.
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
        if self.transport.is_closing():
            return
        if not queued:
            self._wait_headers(idle=True)
        elif self._in_body and self._cycles and self._cycles[0] is self.cycle:
            # The queued request now runs and its body is still arriving: its deadline starts.
            self._start_body_deadline()


def protocol_class(limits: EdgeLimits) -> type[EdgeProtocol]:
    """An `EdgeProtocol` class bound to one worker's ``limits`` (uvicorn's ``http=``)."""
    return type("BoundEdgeProtocol", (EdgeProtocol,), {"limits": limits})
