"""One request on a `tsfront serve` connection: its ASGI ``receive`` and ``send``, and the task
that runs the app for it.

`RequestCycle` is what `tsfront.serve.edge.protocol.EdgeProtocol` makes for each request whose
headers are complete. It speaks ASGI 3 (HTTP spec 2.3) toward the app and HTTP/1.1 toward the
connection, as uvicorn's httptools cycle does, with the same answers to an app that breaks the
protocol (a 500 if it raised or returned before its response's start, the connection closed if
after), but with less per request:

* no ``asyncio.Event`` per request: ``receive`` makes a future only when it has to wait (the
  body is not all there yet, or the app waits for the client to leave);
* the response's head (status line and headers) is held until the next write of the same loop
  turn (the first body bytes, sent right after the start by every route) and sent with it in
  one ``write``, through a `HeldHead` that stands as the cycle's ``transport`` until then; a
  head with nothing after it in that turn goes out at the next turn;
* a chunk of a chunked body, and the body's end with its last chunk, in one formatted write;
* an HTTP/1.0 client, which has no chunked encoding, gets a body with no length as it comes,
  ended by the connection's close (uvicorn sends it chunks).

What the drain's native pass (native/push.c, `tsfront.serve.core.push`) reads of a cycle, by name:
``transport`` (the connection's `tsfront.serve.edge.transport.ConnectionTransport`, or the held
head in front of it), ``flow.write_paused``, ``disconnected``, ``response_complete``,
``chunked_encoding`` and ``scope["method"]``. The `LOST_HOOK` slot is where the app puts
what to call if the connection is lost while the request runs (the protocol calls it).
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Callable
from typing import Any

from tsfront.serve.edge.transport import LOST_HOOK

__all__ = ["CONTINUE", "STATUS_LINES", "HeldHead", "RequestCycle"]

log = logging.getLogger("tsfront.serve")

#: Bytes of a header name or value an app may not send (as uvicorn checks them).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]').search
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]").search

#: The interim answer to ``Expect: 100-continue``, written on the first ``receive``.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

_NO_BODY_STATUS = (204, 304)
#: ``expected_content_length`` of a body that ends with the connection (an HTTP/1.0 client's,
#: with no length given: it knows no chunked encoding).
_UNTIL_CLOSE = -1
_CHUNK_END = b"0\r\n\r\n"
_500_HEADERS = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"21"),
    (b"connection", b"close"),
]


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


#: The status line of each status code.
STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


class HeldHead:
    """The ``transport`` of a cycle whose response's head is held (see the module's doc): the
    first write goes out with the head in one write, then the cycle writes to the connection's
    transport itself again. Everything but ``write`` and ``close`` is that transport's."""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, cycle: RequestCycle, transport: Any, head: bytes) -> None:
        self._cycle = cycle
        self._transport = transport
        self._head: bytes | None = head

    def write(self, data: bytes) -> None:
        head = self._head
        if head is None:
            self._transport.write(data)
            return
        self._head = None
        self._cycle.transport = self._transport
        self._transport.write(head + data)

    def flush(self) -> None:
        """Send the head, if nothing took it along yet."""
        head = self._head
        if head is not None:
            self._head = None
            self._cycle.transport = self._transport
            self._transport.write(head)

    @property
    def connection_transport(self) -> Any:
        """The connection's own transport, which this stands in front of."""
        return self._transport

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class RequestCycle:
    """One request's exchange (see the module's doc).

    Args:
        scope: the request's ASGI scope.
        transport: the connection's transport.
        flow: the connection's flow control (``write_paused``, ``drain``, ``resume_reading``).
        keep_alive: whether the connection may carry another request after this one.
        expect_continue: the request asked for ``100 Continue`` before its body.
        on_response: called with the cycle once its response is complete, while the app runs.
        default_headers: what gives the headers every response starts with (read per response:
            the server may replace them).
        loop: the connection's event loop.
    """

    __slots__ = (
        LOST_HOOK,
        "_default_headers",
        "_loop",
        "_on_response",
        "_request_done",
        "_waiter",
        "body",
        "chunked_encoding",
        "disconnected",
        "expected_content_length",
        "flow",
        "keep_alive",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        scope: dict[str, Any],
        transport: Any,
        flow: Any,
        keep_alive: bool,
        expect_continue: bool,
        on_response: Callable[[RequestCycle], None] | None,
        default_headers: Callable[[], list[tuple[bytes, bytes]]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.scope = scope
        self._loop = loop
        self.transport = transport
        self.flow = flow
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_continue
        self._on_response = on_response
        self._default_headers = default_headers
        self.disconnected = False
        # The request's body: what arrived and was not handed to the app yet, whether more
        # is to come, and whether the app was handed its last part.
        self.body: bytes | bytearray = b""
        self.more_body = True
        self._request_done = False
        self._waiter: asyncio.Future[None] | None = None  # a receive() waiting, if any
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        setattr(self, LOST_HOOK, None)

    # ------------------------------------------------------------------ from the connection

    def add_body(self, data: bytes) -> int:
        """Bytes of the request's body arrived; returns how many are held now."""
        body = self.body
        if not body:
            self.body = data
        elif type(body) is bytes:
            self.body = bytearray(body) + data
        else:
            body += data
        self.wake()
        return len(self.body)

    def wake(self) -> None:
        """Something ``receive`` waits for happened (body, its end, the response's end, the
        client gone)."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------------ the app's task

    async def run(self, app: Any) -> None:
        """Run ``app`` for this request, and answer for it if it breaks the protocol."""
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.transport.close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self._on_response = None

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _500_HEADERS})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    # ------------------------------------------------------------------ ASGI

    async def receive(self) -> dict[str, Any]:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(CONTINUE)
            self.waiting_for_100_continue = False
        while not (self.disconnected or self.response_complete):
            body = self.body
            if body or not (self.more_body or self._request_done):
                self.body = b""
                more = self.more_body
                if not more:
                    self._request_done = True
                return {"type": "http.request", "body": bytes(body), "more_body": more}
            self.flow.resume_reading()
            waiter = self._waiter = self._loop.create_future()
            await waiter
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected 'http.response.start', but got '{kind}'.")
            self._start(message["status"], message.get("headers", ()))
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected 'http.response.body', but got '{kind}'.")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if self.chunked_encoding:
                if body:
                    if more:
                        self.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
                    else:
                        self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
                elif not more:
                    self.transport.write(_CHUNK_END)
            elif self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            else:
                size = len(body)
                expected = self.expected_content_length
                if expected != _UNTIL_CLOSE:
                    if size > expected:
                        raise RuntimeError("Response content longer than Content-Length")
                    self.expected_content_length = expected - size
                if size:
                    self.transport.write(body)
            if not more:
                if self.expected_content_length > 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.wake()
                if not self.keep_alive:
                    self.transport.close()
                on_response = self._on_response
                if on_response is not None:
                    on_response(self)
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )

    def _start(self, status: int, headers: Any) -> None:
        self.response_started = True
        self.waiting_for_100_continue = False
        head = [STATUS_LINES[status]]
        closing = False
        for name, value in (*self._default_headers(), *headers):
            if _BAD_NAME(name):
                raise RuntimeError("Invalid HTTP header name.")
            if _BAD_VALUE(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length":
                if self.chunked_encoding is None:
                    self.expected_content_length = int(value.decode())
                    self.chunked_encoding = False
            elif name == b"transfer-encoding":
                if value.lower() == b"chunked":
                    self.expected_content_length = 0
                    self.chunked_encoding = True
            elif name == b"connection" and b"close" in [
                token.strip() for token in value.lower().split(b",")
            ]:
                self.keep_alive = False
                closing = True
            head.append(b"%b: %b\r\n" % (name, value))
        if not (self.keep_alive or closing):
            head.append(b"connection: close\r\n")
        if self.scope["method"] == "HEAD":
            self.chunked_encoding = False  # no body is written, whatever the headers say
        elif self.chunked_encoding is None and status not in _NO_BODY_STATUS:
            if self.scope["http_version"] == "1.0":
                # No chunked encoding for an HTTP/1.0 client (uvicorn sends it one): the body
                # as it comes, ended by the close (1.0 is never kept alive here).
                self.chunked_encoding = False
                self.expected_content_length = _UNTIL_CLOSE
            else:
                self.chunked_encoding = True
                head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        held = HeldHead(self, self.transport, b"".join(head))
        self.transport = held
        self._loop.call_soon(held.flush)
