"""The HTTP/1.1 connection of a worker: tsfront's own protocol, bounded against hostile clients.

`EdgeProtocol` parses requests with httptools (llhttp) and runs the ASGI app for each in a
`tsfront.serve.edge.cycle.RequestCycle`, under uvicorn's `Server` (which accepts, shuts down and
counts; ``http=`` takes this class). It is HTTP/1.1 as uvicorn's httptools protocol speaks it
(keep-alive, pipelining, ``Expect: 100-continue``, HEAD, chunked and sized responses, a JSON
400 for a request the parser refuses), with less work per request (see the cycle's doc and
docs/PERFORMANCE.md, "tsfront's own HTTP/1.1 connection"), no WebSocket upgrade (the API has no
WebSocket route: a request asking for one is answered as plain HTTP and its connection closed
after the answer), and what a public port needs that uvicorn does not have (its
``timeout_keep_alive`` runs only after a response and any byte cancels it; its
``limit_concurrency`` answers 503 only once headers are complete, so idle connections still
hold their fds):

* **Header deadline**: a connection has ``timeout_header`` seconds, from its accept or from the
  end of its previous response, to send a request's complete headers, else it is closed (before
  the first byte, trickled headers, between keep-alive requests alike). The keep-alive
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
* **Disconnects**: a closed connection ends every request of it, the running one and those
  queued behind it, and reading goes on while a request runs with others queued behind it, so
  that the client's EOF is seen; at most `MAX_PIPELINED` queued requests per connection, past
  that the connection is closed. Each request's cycle has a ``tsfront_on_lost`` attribute
  (`tsfront.serve.edge.transport.LOST_HOOK`), None until the app puts a callable there: when the
  connection is lost while the request runs, it is called once, in ``connection_lost``
  (`tsfront.serve.edge.asgi` hears of the client leaving that way instead of waiting on
  ``receive()`` for ``http.disconnect``: no future and no step per request).
* **The connection's write state**: the cycles get the connection's transport wrapped in a
  `tsfront.serve.edge.transport.ConnectionTransport`, whose clean flag every write, close and abort
  clears, as do ``pause_writing`` and ``connection_lost`` here; the drain's native pass sends
  a token's event with fewer checks while it is set (see that module).

The connection's requests are a list, oldest first (``_cycles``): the first runs, the rest wait
for it (pipelined), and a request leaves the list when its response is complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from typing import Any, ClassVar

import httptools

from tsfront.serve.core.reply import ApiError
from tsfront.serve.edge.cycle import STATUS_LINES, RequestCycle
from tsfront.serve.edge.transport import LOST_HOOK, ConnectionTransport, FlowControl

__all__ = ["CAP_LOG_S", "MAX_PIPELINED", "EdgeLimits", "EdgeProtocol", "protocol_class"]

log = logging.getLogger("tsfront.serve")

#: Requests one connection may have queued behind the one running (HTTP pipelining).
MAX_PIPELINED = 16
#: Seconds between two log lines about refused or evicted connections.
CAP_LOG_S = 10.0
#: A request body held past this many bytes (the app not reading it yet) pauses reading.
BODY_HIGH_WATER = 65536

_HEADERS_END = (b"\r\n\r\n", b"\n\n")
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "DELETE", "PUT", "OPTIONS", "PATCH")}


def _headers_end(buf: bytes | bytearray, start: int) -> int:
    """The index just past the first blank line in ``buf`` at or after ``start``, or -1."""
    end = -1
    for mark in _HEADERS_END:
        found = buf.find(mark, start)
        if found >= 0 and (end < 0 or found + len(mark) < end):
            end = found + len(mark)
    return end


def _error_response(status: int, message: str, kind: str = "invalid_request_error") -> bytes:
    """A whole answer that closes its connection, carrying the app's own error object
    (`tsfront.serve.core.reply.ApiError`'s body and headers), for what the edge refuses itself."""
    reply = ApiError(status, message, kind=kind).reply()
    head = [STATUS_LINES[status], *(b"%b: %b\r\n" % header for header in reply.headers)]
    head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(reply.body))
    return b"".join(head) + reply.body


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
            431, f"request headers over {max_header_bytes} bytes; send smaller headers"
        )
        self.timed_out = _error_response(
            408, f"the request body did not arrive within {timeout_body:g} s; send it faster"
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


class EdgeProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection with the worker's `EdgeLimits` (see the module's doc).

    Made by uvicorn's `Server` with its ``config`` (the app, ``root_path``,
    ``timeout_keep_alive``) and ``server_state`` (the open connections, the running tasks, the
    request count and the default headers); `protocol_class` binds the limits. uvicorn's
    ``limit_concurrency`` is not applied: the edge's connection cap bounds a worker.
    """

    limits: ClassVar[EdgeLimits]

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.root_path: str = config.root_path
        self.timeout_keep_alive: float = config.timeout_keep_alive
        self.server_state = server_state
        self.app_state = app_state
        self.parser = httptools.HttpRequestParser(self)
        # Answer a request whose client half-closed after sending it (a pipelined last one).
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: ConnectionTransport = None  # type: ignore[assignment]
        self.flow: FlowControl = None  # type: ignore[assignment]
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        # The request being parsed: its URL, headers and Expect, then its cycle.
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False
        self.cycle: RequestCycle | None = None
        self._cycles: list[RequestCycle] = []  # without a complete response; [0] runs
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
        # The keep-alive deadline (``timeout_keep_alive`` after a response, cancelled by any
        # byte), kept by the header timer too. It fires by the earlier of the two
        # (``_header_at``).
        self._idle_due = 0.0
        self._header_at = 0.0

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self.limits
        if len(limits.open) >= limits.max_connections:
            oldest = next(iter(limits.waiting), None)
            if oldest is None:
                limits.note_cap("refused")
                transport.abort()  # type: ignore[attr-defined]
                return
            limits.note_cap("evicted")
            oldest.transport.abort()
            oldest._forget()  # aborted transports report their loss later, in a callback
        inner: Any = transport
        # Every write on this connection goes through it: the drain's native pass reads its
        # clean flag (tsfront.serve.edge.transport).
        self.transport = ConnectionTransport(inner)
        self.flow = FlowControl(inner)
        self.server = _address(inner.get_extra_info("sockname"))
        self.client = _address(inner.get_extra_info("peername"))
        if inner.get_extra_info("sslcontext"):
            self.scheme = "https"
        self.server_state.connections.add(self)
        limits.open.add(self)
        self._wait_headers()

    def pause_writing(self) -> None:
        self.transport.unclean()
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def eof_received(self) -> None:
        return None  # the transport closes; connection_lost ends what runs

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused at the cap: never made
            return
        # First: the event loop closes the socket once this returns.
        self.transport.lost()
        self.server_state.connections.discard(self)
        self._forget()
        # Every request of the connection hears of it: the running one and those queued.
        cycles, self._cycles = self._cycles, []
        for cycle in cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                hook = getattr(cycle, LOST_HOOK, None)
                if hook is not None:  # the app's handler: cancelled (scheduled, not run here)
                    setattr(cycle, LOST_HOOK, None)
                    hook()
            cycle.wake()
        self._pending = bytearray()
        self.flow.resume_writing()
        if exc is None:
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: close now if no response is being written, else after it."""
        if not self._cycles:
            self.transport.close()
        else:  # the connection closes after it; requests queued behind it are not started
            self._cycles[0].keep_alive = False

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
            # Idle since its last response for timeout_keep_alive: closed, not counted.
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
            self._feed(data)
            return
        # The keep-alive deadline ends with any byte; these are held, not fed.
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
        self._feed(chunk)
        if not self._in_body:
            self._tail = chunk[-3:]

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No upgrades here: the request is answered as plain HTTP, and the connection
            # closed after it (the parser reads nothing past an upgrade).
            if self.cycle is not None:
                self.cycle.keep_alive = False
        except httptools.HttpParserError as exc:
            self._bad_request(str(exc))

    def _bad_request(self, detail: str) -> None:
        if self.transport.is_closing():  # answered already (the parser stays broken)
            return
        self.limits.waiting.pop(self, None)
        self._pending = bytearray()
        cycles = self._cycles
        # The 400 is the answer of the request being read only if it is the one running and
        # its answer has not begun (its own body is bad); with another's answer being
        # written on the connection there is no room for one: closed without it.
        if cycles and not (self._in_body and len(cycles) == 1 and not cycles[0].response_started):
            self.transport.abort()
            return
        self.transport.write(
            _error_response(
                400, f"invalid HTTP request ({detail}); send a well-formed HTTP/1.1 request"
            )
        )
        self._close()

    def _headers_too_large(self) -> None:
        limits = self.limits
        limits.counts["too_large"] += 1
        self._pending = bytearray()
        limits.waiting.pop(self, None)
        if self._cycles:
            # A response is being written on this connection: no room for another.
            self.transport.abort()
            return
        self.transport.write(limits.too_large)
        self._close()

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        # llhttp keeps a value's trailing whitespace, which RFC 9110 §5.5 excludes.
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._header_due = 0.0
        self.limits.waiting.pop(self, None)
        parser = self.parser
        method = parser.get_method()
        version = parser.get_http_version()
        url = self._url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url and b"#" not in url:
            raw_path, query = url, b""  # what parse_url would find, found without it
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path or b"", parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root,
            "headers": self._headers,
            "state": self.app_state.copy(),
            "method": _METHODS.get(method) or method.decode("ascii"),
            "path": root + path if root else path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": query,
        }
        cycle = self.cycle = RequestCycle(
            scope,
            self.transport,
            self.flow,
            version != "1.0" and parser.should_keep_alive(),
            self._expect,
            self._response_done,
            self._default_headers,
            self.loop,
        )
        cycles = self._cycles
        busy = bool(cycles)
        cycles.append(cycle)
        self._in_body = True
        if not busy:
            self._start_body_deadline()
            self._run(cycle)
        elif len(cycles) > MAX_PIPELINED + 1:
            log.warning(
                "a client pipelined over %d requests on one connection; closing it",
                MAX_PIPELINED,
            )
            self.transport.abort()
        # else: queued behind the one running; reading goes on, so that the client's EOF is
        # seen (uvicorn would stop reading here).

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.disconnected:
            return
        if cycle.add_body(body) > BODY_HIGH_WATER:
            self.flow.pause_reading()  # the cycle's receive() resumes it

    def on_message_complete(self) -> None:
        self._in_body = False
        self._body_due = 0.0
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.more_body = False
            cycle.wake()

    # ------------------------------------------------------------------ requests

    def _run(self, cycle: RequestCycle) -> None:
        tasks = self.server_state.tasks
        task = self.loop.create_task(cycle.run(self.app))
        task.add_done_callback(tasks.discard)
        tasks.add(task)

    def _default_headers(self) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = self.server_state.default_headers
        return headers

    def _response_done(self, cycle: RequestCycle) -> None:
        # The response of the running request is complete (from its send).
        self.server_state.total_requests += 1
        cycles = self._cycles
        if cycles and cycles[0] is cycle:
            del cycles[0]
        else:  # not the running one (the connection was lost): nothing follows
            return
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if not cycles:
            self._wait_headers(idle=True)
            return
        following = cycles[0]
        self._run(following)
        if self._in_body and following is self.cycle:
            # The queued request now runs and its body is still arriving: its deadline starts.
            self._start_body_deadline()

    # ------------------------------------------------------------------ body

    def _start_body_deadline(self) -> None:
        if not self._in_body:
            return
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
        running = self._cycles[0] if self._cycles else None
        if running is not None and not running.response_started:
            self.transport.write(self.limits.timed_out)
        self._close()


_ASGI = {"version": "3.0", "spec_version": "2.3"}


def _address(name: Any) -> Any:
    """A socket's address as ASGI's ``server``/``client`` (host, port), or None."""
    if isinstance(name, (list, tuple)) and len(name) >= 2:
        return (str(name[0]), int(name[1]))
    return None


def protocol_class(limits: EdgeLimits) -> type[EdgeProtocol]:
    """An `EdgeProtocol` class bound to one worker's ``limits`` (uvicorn's ``http=``)."""
    return type("BoundEdgeProtocol", (EdgeProtocol,), {"limits": limits})
