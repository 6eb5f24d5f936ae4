"""The push path's native step end to end: real uvicorn, real sockets, the official client.

Two rigs. In process: uvicorn with httptools serving an ASGI app whose response is written by
a `Pusher` over a real `TableDetokenizer` (the table full of what breaks escaping and
decoding), so the test can see that the native step was taken, that a client that stops
reading turns it into the ASGI ``send`` fall-back (back-pressure) and back, that the bytes on
the wire are exactly the Python path's, and that the connection stays usable for the next
request (keep-alive: uvicorn's state is right after the native writes). Then ``tsfront serve``
(native step on, the default) with a byte-level model and an engine whose tokens are single
bytes of a text full of multi-byte characters, quotes, backslashes and control characters:
streamed completions and chat completions through the ``openai`` client must give exactly
the tokenizer's decode of the generated ids, and a client that leaves mid-stream gets its
engine request aborted with no traceback in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.inloop import start_uvicorn
from support.push_fixtures import LoggingOwner, PlainChoice
from support.serve_fixtures import post_stream, read_chunked, start_served

import tsfront.serve.core.push as push
from tsfront import _native
from tsfront.bench.standins import TransportCycle
from tsfront.client.stream import OutputChunk, RequestStream, deliver_all
from tsfront.serve.core.push import Pusher
from tsfront.serve.edge.transport import ConnectionTransport
from tsfront.text.detok import TableDetokenizer, TokenTable

DEADLINE = 30.0
TEXT = 'Ünïcödé "quoted" \\ back\\slash\nline\ttab\x01\x1f del\x7f 😀€ 中文 ok'
_JSON = msgspec.json.Encoder()

# ---------------------------------------------------------------------- in process


def _table() -> tuple[TokenTable, list[list[int]]]:
    # One token per byte of TEXT (so characters split over tokens) and a few whole pieces.
    data = TEXT.encode()
    pieces = [bytes([b]) for b in range(256)] + [b'"\\', "😀".encode(), b"\xff"]
    steps: list[list[int]] = []
    for i, b in enumerate(data):
        steps.append([b] if i % 5 else [b, 256, 257])
    steps.append([258])  # an invalid byte: U+FFFD, as the Python step
    return TokenTable(pieces, None, frozenset(), False, False, "replace"), steps


HEAD, TAIL = b'data: {"choices":[{"index":0,"text":', b',"finish_reason":null}]}\n\n'


def _python_bytes(repeat: int) -> bytes:
    table, steps = _table()
    detok = TableDetokenizer(table)
    out = bytearray()
    for _ in range(repeat):
        for tokens in steps:
            text = detok.step(tokens)
            if text:
                body = HEAD + _JSON.encode(text) + TAIL
                out += b"%x\r\n" % len(body) + body + b"\r\n"
    return bytes(out)


class _App:
    """Streams ``repeat`` rounds of the table's steps through a `Pusher`, as the server's
    response task would: a declined call waits for the send in flight (``settle``), then the
    tokens go through the same pusher again."""

    def __init__(self) -> None:
        self.native_calls = 0
        self.declined = 0
        self.native = False
        self.pushed = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        repeat = int(scope["path"].strip("/") or "1")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-test", b"1")]})
        table, steps = _table()
        choice = PlainChoice(TableDetokenizer(table))
        pusher = Pusher(choice, HEAD, TAIL, send)  # type: ignore[arg-type]
        self.native = pusher.native
        for _ in range(repeat):
            for tokens in steps:
                while not pusher(tokens):
                    self.declined += 1
                    await pusher.settle()
                await asyncio.sleep(0)
        await pusher.settle()
        self.pushed.set()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _EdgeApp:
    """As the server's response task does it under `tsfront serve`'s own protocol: the start,
    the `Pusher` made, the first event through ``send``; then each step pushed and, at once in
    the same loop turn, a marker event through ``send`` (as the task sends a later event)."""

    def __init__(self) -> None:
        self.native = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        table, steps = _table()
        pusher = Pusher(PlainChoice(TableDetokenizer(table)), HEAD, TAIL, send)  # type: ignore[arg-type]
        self.native = pusher.native
        await send({"type": "http.response.body", "body": FIRST, "more_body": True})
        for tokens in steps:
            assert pusher(tokens)
            await send({"type": "http.response.body", "body": MARK, "more_body": True})
        await pusher.settle()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


FIRST, MARK = b"data: first\n\n", b"data: mark\n\n"


class _DrainApp:
    """As the worker does it: the response's task parked on its stream with a `Pusher` as the
    sink, and the table's steps arriving as poll updates handed to the drain
    (`deliver_all`); the last update carries a finish reason, which the task reads."""

    def __init__(self) -> None:
        self.native = False
        self.chunks: list[OutputChunk] = []
        self.pusher: Pusher | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        table, steps = _table()
        loop = asyncio.get_running_loop()
        stream = RequestStream(LoggingOwner(loop), "r", 0, 1)
        pusher = Pusher(PlainChoice(TableDetokenizer(table)), HEAD, TAIL, send)  # type: ignore[arg-type]
        self.native = pusher.native
        stream.set_sink(pusher)
        self.pusher = pusher
        refs = [weakref.ref(stream)]

        async def feed() -> None:
            for i, tokens in enumerate(steps):
                await asyncio.sleep(0)
                deliver_all([(0, list(tokens), None, None, 0, 1, i + 1, 0, 0)], refs)
            await asyncio.sleep(0)
            deliver_all([(0, [], None, None, _native.FIN_STOP, 1, len(steps), 0, 0)], refs)

        feeding = asyncio.ensure_future(feed())
        async for chunk in stream:
            self.chunks.append(chunk)
        await feeding
        await pusher.settle()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n" % len(body) + body + b"\r\n"


def _edge_bytes() -> bytes:
    table, steps = _table()
    detok = TableDetokenizer(table)
    out = bytearray(_chunk(FIRST))
    for tokens in steps:
        text = detok.step(tokens)
        if text:
            out += _chunk(HEAD + _JSON.encode(text) + TAIL)
        out += _chunk(MARK)
    return bytes(out + b"0\r\n\r\n")


async def _serve(app, monkeypatch, http: object = "httptools") -> tuple:
    calls = [0]
    real = push._token_event

    def counting(*args):
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(push, "_token_event", counting)
    server, task, port = await start_uvicorn(app, http, log_level="error")
    return server, task, port, calls


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE)
    body = bytearray()
    deadline = time.monotonic() + DEADLINE
    while not body.endswith(b"\r\n0\r\n\r\n"):
        assert time.monotonic() < deadline, "the response never ended"
        data = await asyncio.wait_for(reader.read(1 << 16), DEADLINE)
        assert data, "the server closed the connection early"
        body += data
    return head, bytes(body)


async def test_native_writes_are_the_python_paths_bytes_and_keep_the_connection(
    monkeypatch,
) -> None:
    app = _App()
    server, task, port, calls = await _serve(app, monkeypatch)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # the same connection twice: keep-alive survives the native writes
            writer.write(b"GET /3 HTTP/1.1\r\nhost: x\r\n\r\n")
            head, body = await _read_response(reader)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
            assert body == _python_bytes(3) + b"0\r\n\r\n"
        assert app.native, "the pusher did not take the native step under uvicorn + httptools"
        assert calls[0] > 0 and app.declined == 0
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, DEADLINE)


async def test_under_the_servers_protocol_a_pushed_event_is_written_in_its_turn(
    monkeypatch,
) -> None:
    # tsfront serve's protocol writes through a head-holding writer until the response's head
    # is out; a pusher made before that (as the response task makes it) must still write each
    # event when it is pushed, not hold it to a later loop turn: a `send` right after it in the
    # same turn (the response's task sending a later event) must reach the wire after it.
    from tsfront.serve.edge.protocol import EdgeLimits, protocol_class

    limits = EdgeLimits(
        timeout_header=DEADLINE, timeout_body=DEADLINE, max_header_bytes=1 << 16, max_connections=8
    )
    app = _EdgeApp()
    server, task, port, calls = await _serve(app, monkeypatch, protocol_class(limits))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # and the connection stays usable
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head, body = await _read_response(reader)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
            assert body == _edge_bytes()
        assert app.native and calls[0] > 0
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, DEADLINE)


async def test_a_client_that_stops_reading_gets_the_fall_back_then_every_byte(
    monkeypatch,
) -> None:
    # Enough events to fill the kernel's buffers and the transport's 64 KiB high-water mark,
    # so uvicorn pauses writing: the pusher hands the send in flight to a task, declines while
    # it is in flight, and takes the native step again once the client reads.
    app = _App()
    server, task, port, calls = await _serve(app, monkeypatch)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /2000 HTTP/1.1\r\nhost: x\r\n\r\n")
        deadline = time.monotonic() + DEADLINE
        while app.declined == 0:  # not reading: wait for the back-pressure
            assert time.monotonic() < deadline, "the server never applied back-pressure"
            await asyncio.sleep(0.01)
        native_before = calls[0]
        head, body = await _read_response(reader)
        assert head.startswith(b"HTTP/1.1 200")
        assert body == _python_bytes(2000) + b"0\r\n\r\n"
        assert native_before > 0 and calls[0] > native_before, "no native step after the fall-back"
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, DEADLINE)


@pytest.mark.parametrize("protocol", ["httptools", "edge"])
async def test_the_drains_native_pass_writes_the_python_paths_bytes(monkeypatch, protocol) -> None:
    # Through uvicorn's real cycle, flow control and transport (and tsfront serve's own
    # protocol, whose head-holding writer is the cycle's transport until the head is out): the
    # drain's native pass takes every plain update (the sink is never called), the bytes on the
    # wire are the Python path's, and the last update reaches the response's task.
    from tsfront.serve.edge.protocol import EdgeLimits, protocol_class

    called: list[list[int]] = []
    real = Pusher.__call__

    def counted(self: Pusher, tokens: list[int]) -> bool:
        called.append(tokens)
        return real(self, tokens)

    monkeypatch.setattr(Pusher, "__call__", counted)
    http: object = "httptools"
    if protocol == "edge":
        limits = EdgeLimits(
            timeout_header=DEADLINE,
            timeout_body=DEADLINE,
            max_header_bytes=1 << 16,
            max_connections=8,
        )
        http = protocol_class(limits)
    app = _DrainApp()
    server, task, port, _calls = await _serve(app, monkeypatch, http)
    clean_before = 0
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # and the connection stays usable
            app.chunks.clear()
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head, body = await _read_response(reader)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
            assert body == _python_bytes(1) + b"0\r\n\r\n"
            assert [c.finish_reason for c in app.chunks] == ["stop"]
            # Sent on the socket itself (the transport held nothing): every event but, under
            # the server's protocol, the first (its head writer stands in front until then).
            events = _python_bytes(1).count(HEAD)
            assert app.pusher is not None
            assert app.pusher.direct_sends >= events - (1 if protocol == "edge" else 0) > 0
            # Under the server's protocol the connection keeps its clean flag: every event
            # after the first direct one skips the checks (the head's write, the first event
            # through the head writer and the first direct one make them).
            conn = app.pusher._sock
            if protocol == "edge":
                assert isinstance(conn, ConnectionTransport)
                sent, clean_before = conn.clean_sends - clean_before, conn.clean_sends
                assert sent >= events - 2 > 0
                assert conn._clean is False  # the end of the body went through it
            else:
                assert not isinstance(conn, _native.ConnectionBase)
        assert app.native and called == []
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, DEADLINE)


def test_the_switch_turns_the_native_step_off(monkeypatch) -> None:
    monkeypatch.setattr(push, "NATIVE", False)
    table, _ = _table()

    async def send(message) -> None:
        pass

    pusher = Pusher(PlainChoice(TableDetokenizer(table)), HEAD, TAIL, send)  # type: ignore[arg-type]
    assert not pusher.native


async def _connection(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Transport, socket.socket]:
    """A server-side transport of a real loopback connection (small send buffer) and the
    client's socket (small receive buffer, not read until the test reads it)."""
    made: asyncio.Future[asyncio.Transport] = loop.create_future()

    class _Proto(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
            made.set_result(transport)

    server = await loop.create_server(_Proto, "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await loop.sock_connect(client, server.sockets[0].getsockname())
    transport = await asyncio.wait_for(made, DEADLINE)
    server.close()
    return transport, client


@pytest.mark.parametrize("wrapped", [False, True], ids=["transport", "connection"])
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_native_pass_sends_on_the_socket_and_keeps_order_past_a_full_buffer(
    monkeypatch, loop_kind: str, wrapped: bool
) -> None:
    # The drain's native pass sends each event on the connection's socket itself while the
    # transport holds nothing; a client that does not read fills the kernel's buffers, a send
    # takes part of an event or nothing, and the rest goes to the transport, which buffers it,
    # so the events after it go through the transport too (it holds something) until it has
    # written it all. Every byte arrives once and in order, and once the transport is empty
    # the sends are direct again. Real sockets, both event loops; and the same behind tsfront
    # serve's `ConnectionTransport` (``connection``), whose clean flag lets the pass skip its
    # checks: set only while the transport holds nothing, cleared by the partial send.
    import uvloop

    monkeypatch.setattr(push, "_cycle_types", lambda: (TransportCycle,))
    called: list[list[int]] = []
    monkeypatch.setattr(Pusher, "__call__", lambda self, tokens: bool(called.append(tokens)))
    big_head = HEAD.replace(b"data: ", b"data: " + b" " * 3000)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, client = await _connection(loop)
        table, steps = _table()
        stream = RequestStream(LoggingOwner(loop), "r", 0, 1)
        conn = ConnectionTransport(transport)
        cycle = TransportCycle(conn if wrapped else transport)
        ours, detok = TableDetokenizer(table), TableDetokenizer(table)
        for d in (ours, detok):
            d.step(steps[0])  # past the first-token rules: the native step applies
        pusher = Pusher(PlainChoice(ours), big_head, TAIL, cycle.send)  # type: ignore[arg-type]
        assert pusher.native and pusher._sock is cycle.transport and pusher._fd >= 0
        stream.set_sink(pusher)
        refs = [weakref.ref(stream)]
        reading = asyncio.ensure_future(_consume(stream))
        await asyncio.sleep(0)  # the reader parks: its sink takes the updates

        expected = bytearray()
        position = 0

        def feed(rounds: int) -> None:
            nonlocal position
            for _ in range(rounds):
                for tokens in steps:
                    position += 1
                    deliver_all([(0, list(tokens), None, None, 0, 1, position, 0, 0)], refs)
                    if conn._clean:  # the flag's invariant
                        assert transport.get_write_buffer_size() == 0
                        assert not transport.is_closing()
                    text = detok.step(tokens)
                    if text:
                        body = big_head + _JSON.encode(text) + TAIL
                        expected.extend(b"%x\r\n" % len(body) + body + b"\r\n")

        got = bytearray()

        async def read_all() -> bytes:
            deadline = time.monotonic() + DEADLINE
            while len(got) < len(expected):
                assert time.monotonic() < deadline, f"{len(got)} of {len(expected)} bytes"
                got.extend(await asyncio.wait_for(loop.sock_recv(client, 1 << 16), DEADLINE))
            return bytes(got)

        feed(20)  # ~80 events of ~3 KB: far past 8 KB + 4 KB of kernel buffers
        direct_first = pusher.direct_sends
        assert 0 < direct_first < position, "no direct send, or no event past a full buffer"
        assert transport.get_write_buffer_size() > 0, "the transport never held the rest"
        # The client reads what the kernel holds, in this loop turn: the socket has room
        # again while the transport still holds its rest (it writes that at the loop's next
        # turn). Events now must queue behind that rest, not go out on the socket before it.
        _read_available(client, got)
        assert got and transport.get_write_buffer_size() > 0
        held = pusher.direct_sends
        feed(2)
        assert pusher.direct_sends == held, "a direct send past what the transport held"
        assert not conn._clean
        assert await read_all() == bytes(expected)
        deadline = time.monotonic() + DEADLINE
        while transport.get_write_buffer_size():
            assert time.monotonic() < deadline, "the transport never emptied"
            await asyncio.sleep(0.001)
        start = len(expected)
        feed(1)  # the transport is empty again: direct sends again
        assert pusher.direct_sends > direct_first
        assert await read_all() == bytes(expected) and len(expected) > start
        assert pusher.error is None and called == [], "an update left the native pass"
        if wrapped:
            assert conn.clean_sends > 0, "no event took the clean connection's way"
        else:
            assert conn.clean_sends == 0 and not conn._clean
        reading.cancel()
        transport.close()
        client.close()

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


class _ParkedApp:
    """``/stream``: a response parked on its stream with a `Pusher` as the sink, fed by the
    test through `deliver_all`; ``/plain``: a fixed body, and the descriptor of its
    connection's socket."""

    PLAIN = b"plain response"

    def __init__(self) -> None:
        self.parked = asyncio.Event()
        self.refs: list[Any] = []
        self.pusher: Pusher | None = None
        self.cycle: Any = None
        self.plain_fd = -1

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/plain":
            self.plain_fd = push.direct_target(send.__self__.transport)[1]
            headers = [(b"content-length", str(len(self.PLAIN)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": self.PLAIN})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        table, _ = _table()
        stream = RequestStream(LoggingOwner(asyncio.get_running_loop()), "r", 0, 1)
        pusher = Pusher(PlainChoice(TableDetokenizer(table)), HEAD, TAIL, send)  # type: ignore[arg-type]
        stream.set_sink(pusher)
        self.pusher, self.cycle, self.refs = pusher, send.__self__, [weakref.ref(stream)]
        await send({"type": "http.response.body", "body": FIRST, "more_body": True})
        self.parked.set()
        async for _ in stream:
            pass
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.mark.parametrize("leaving", ["close", "reset"])
@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_lost_connections_descriptor_gets_no_event_when_another_connection_reuses_it(
    monkeypatch, loop_kind: str, leaving: str
) -> None:
    # Under tsfront serve's protocol a streaming response's connection is clean (events sent
    # with no checks) until something clears it. The client goes away; the event loop closes
    # the socket right after the protocol's connection_lost, and the next connection accepted
    # gets the same descriptor. Events of the old response that arrive then must not reach the
    # new connection: connection_lost cleared the flag, so the pass checks again, and finds
    # the client gone. The client closes (uvicorn then closes the transport too), or resets
    # the connection (the event loop ends it with the error: only connection_lost is told).
    import uvloop

    from tsfront.serve.edge.protocol import EdgeLimits, protocol_class

    async def main() -> None:
        limits = EdgeLimits(
            timeout_header=DEADLINE,
            timeout_body=DEADLINE,
            max_header_bytes=1 << 16,
            max_connections=8,
        )
        app = _ParkedApp()
        server, task, port, _calls = await _serve(app, monkeypatch, protocol_class(limits))
        _, steps = _table()
        position = 0

        def feed(n: int) -> None:
            nonlocal position
            for tokens in steps[1 : n + 1]:
                position += 1
                deliver_all([(0, list(tokens), None, None, 0, 1, position, 0, 0)], app.refs)

        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            await asyncio.wait_for(app.parked.wait(), DEADLINE)
            await asyncio.wait_for(reader.readuntil(FIRST + b"\r\n"), DEADLINE)
            feed(6)
            pusher = app.pusher
            assert pusher is not None
            conn = pusher._sock
            assert isinstance(conn, ConnectionTransport)
            assert conn._clean and conn.clean_sends > 0, "the connection never got clean"
            await asyncio.wait_for(reader.readuntil(TAIL + b"\r\n"), DEADLINE)
            old_fd, direct = pusher._fd, pusher.direct_sends
            if leaving == "reset":  # an RST: the server's read fails
                linger = struct.pack("ii", 1, 0)
                writer.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, linger
                )
                writer.transport.abort()
            else:
                writer.close()
            deadline = time.monotonic() + DEADLINE
            while not app.cycle.disconnected:
                assert time.monotonic() < deadline, "the server never saw the client leave"
                await asyncio.sleep(0.001)
            assert not conn._clean, "connection_lost left the connection clean"
            while _is_open(old_fd):  # the event loop closes it right after connection_lost
                assert time.monotonic() < deadline, "the server never closed the old socket"
                await asyncio.sleep(0.001)
            # Make the freed descriptor the one the server's next accept takes: the client and
            # the server share this process's descriptor table, so every lower free one is
            # plugged, the next client's socket made, and then the old one freed again.
            plugs = _plug_below(old_fd)
            next_client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            next_client.setblocking(False)
            os.close(plugs.pop())  # the one holding old_fd
            try:
                await asyncio.get_running_loop().sock_connect(next_client, ("127.0.0.1", port))
                reader2, writer2 = await asyncio.open_connection(sock=next_client)
                writer2.write(b"GET /plain HTTP/1.1\r\nhost: x\r\n\r\n")
                head = await asyncio.wait_for(reader2.readuntil(b"\r\n\r\n"), DEADLINE)
                body = await asyncio.wait_for(reader2.readexactly(len(app.PLAIN)), DEADLINE)
                assert head.startswith(b"HTTP/1.1 200") and body == app.PLAIN
                assert app.plain_fd == old_fd, "the new connection did not reuse the descriptor"
                feed(6)  # the old response's events, while the new connection holds its descriptor
                assert pusher.direct_sends == direct, "an event was sent on the reused descriptor"
                writer2.write(b"GET /plain HTTP/1.1\r\nhost: x\r\n\r\n")
                head = await asyncio.wait_for(reader2.readuntil(b"\r\n\r\n"), DEADLINE)
                assert head.startswith(b"HTTP/1.1 200"), head  # nothing stray before it
                body = await asyncio.wait_for(reader2.readexactly(len(app.PLAIN)), DEADLINE)
                assert body == app.PLAIN
                writer2.close()
            finally:
                for fd in plugs:
                    os.close(fd)
        finally:
            # The old response's end: its task finishes, and the server can stop.
            deliver_all([(0, [], None, None, _native.FIN_STOP, 1, position, 0, 0)], app.refs)
            server.should_exit = True
            await asyncio.wait_for(task, DEADLINE)

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


def _plug_below(fd: int) -> list[int]:
    """Descriptors opened on /dev/null until one is ``fd``: every free one below it is taken
    (the last one opened holds ``fd``)."""
    plugs: list[int] = []
    while not plugs or plugs[-1] < fd:
        plugs.append(os.open(os.devnull, os.O_RDONLY))
    assert plugs[-1] == fd, f"{fd} was taken before it could be plugged"
    return plugs


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


_ACTIONS = st.lists(
    st.sampled_from(["token"] * 4 + ["write"] * 2 + ["read", "turn", "unclean"]),
    min_size=1,
    max_size=120,
)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=_ACTIONS, size=st.sampled_from([10, 3000, 9000]))
def test_a_clean_connection_keeps_every_byte_in_order_whatever_comes_between(
    loop_kind: str, actions: list[str], size: int
) -> None:
    # The clean flag's hammer: on a real loopback connection with small buffers, the drain's
    # events (``token``), the response task's writes through the connection (``write``), the
    # client reading what has arrived (``read``), loop turns in which the transport writes
    # what it holds (``turn``) and the protocol's clearing (``unclean``) in any order. After
    # every step the flag's invariant holds (set: the transport holds nothing, is open), and
    # the client gets exactly every event and write, once, in the order they were made. Both
    # event loops (uvloop is tsfront serve's).
    import uvloop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(push, "_cycle_types", lambda: (TransportCycle,))
        mp.setattr(Pusher, "__call__", lambda self, tokens: False)  # all must be the pass's
        head = HEAD.replace(b"data: ", b"data: " + b" " * size)
        if loop_kind == "uvloop":
            uvloop.run(_hammer(actions, head))
        else:
            asyncio.run(_hammer(actions, head))


async def _hammer(actions: list[str], head: bytes) -> None:
    loop = asyncio.get_running_loop()
    transport, client = await _connection(loop)
    conn = ConnectionTransport(transport)
    table, steps = _table()
    stream = RequestStream(LoggingOwner(loop), "r", 0, 1)
    ours, detok = TableDetokenizer(table), TableDetokenizer(table)
    for d in (ours, detok):
        d.step(steps[0])  # past the first-token rules: the native step applies
    pusher = Pusher(PlainChoice(ours), head, TAIL, TransportCycle(conn).send)  # type: ignore[arg-type]
    stream.set_sink(pusher)
    refs = [weakref.ref(stream)]
    reading = asyncio.ensure_future(_consume(stream))
    await asyncio.sleep(0)
    expected, got = bytearray(), bytearray()
    position = 0
    for action in actions:
        if action == "token":
            tokens = steps[1 + position % (len(steps) - 1)]
            position += 1
            deliver_all([(0, list(tokens), None, None, 0, 1, position, 0, 0)], refs)
            text = detok.step(tokens)
            if text:
                expected.extend(_chunk(head + _JSON.encode(text) + TAIL))
        elif action == "write":
            marker = b"<write %d>" % len(expected) + b"." * (len(head) // 2)
            conn.write(marker)
            expected.extend(marker)
        elif action == "read":
            _read_available(client, got)
        elif action == "turn":
            await asyncio.sleep(0)
        else:
            conn.unclean()
        if conn._clean:
            assert transport.get_write_buffer_size() == 0 and not transport.is_closing()
    deadline = time.monotonic() + DEADLINE
    while len(got) < len(expected):
        assert time.monotonic() < deadline, f"{len(got)} of {len(expected)} bytes"
        got.extend(await asyncio.wait_for(loop.sock_recv(client, 1 << 16), DEADLINE))
    assert bytes(got) == bytes(expected)
    assert pusher.error is None
    reading.cancel()
    transport.close()
    client.close()
    await asyncio.sleep(0)


def _read_available(client: socket.socket, got: bytearray) -> None:
    """Append to ``got`` what the (non-blocking) client socket has received so far."""
    while True:
        try:
            data = client.recv(1 << 16)
        except BlockingIOError:
            return
        assert data, "the connection closed"
        got.extend(data)


async def _consume(stream: RequestStream) -> None:
    async for _ in stream:
        pass


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_direct_send_is_for_plain_tcp_only(tmp_path, loop_kind: str) -> None:
    # A TLS transport's socket carries ciphertext: never a direct send there (an app that
    # embeds tsfront's ASGI app may run it under uvicorn with TLS). A plain TCP transport is
    # its own target, and behind a writer standing in front of it (tsfront serve's head
    # writer: the drain test above runs the real one) the connection's transport is.
    import ssl

    import uvloop

    from tsfront.serve.core.push import direct_target

    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.Transport] = []

        class _Proto(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                made.append(transport)

        for ctx, client in ((None, None), (server_ctx, client_ctx)):
            server = await loop.create_server(_Proto, "127.0.0.1", 0, ssl=ctx)
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1", port, ssl=client, server_hostname="localhost" if client else None
                ),
                DEADLINE,
            )
            deadline = time.monotonic() + DEADLINE
            while not made:
                assert time.monotonic() < deadline, "no connection"
                await asyncio.sleep(0.001)
            transport = made.pop()
            target, fd = direct_target(transport)
            if ctx is None:
                assert target is transport and fd == transport.get_extra_info("socket").fileno()
                held = types.SimpleNamespace(connection_transport=transport)
                assert direct_target(held) == (transport, fd)
            else:
                assert (target, fd) == (None, -1), "a direct send past TLS"
            writer.close()
            transport.close()
            server.close()
        assert direct_target(object()) == (None, -1)

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


# ---------------------------------------------------------------------- tsfront serve


_IDS: list[int] = []  # the engine's output, set by the fixture (token i of every request)


def token_fn(rid: str, position: int) -> int:
    return _IDS[position % len(_IDS)]


class _Served:
    def __init__(self, s, stderr: Path) -> None:
        self.s = s
        self.stderr = stderr
        self.client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)

    def aborts(self) -> int:
        return sum(c["aborts"] for c in self.s.group.counters().values())

    def wait(self, what: str, predicate, timeout: float = DEADLINE) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.01)


@pytest.fixture(scope="module")
def tokenizer_and_model(tmp_path_factory: pytest.TempPathFactory):
    from tokenizers import Tokenizer

    from tsfront.text.detok import token_tables
    from tsfront.text.testing import make_test_model

    path = make_test_model(tmp_path_factory.mktemp("model") / "bytes", "bytelevel")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tables = token_tables(tok)
    assert tables is not None, "the byte-level test model has a table detokenizer"
    pieces = tables[True].pieces
    byte_id: dict[int, int] = {}
    for i, piece in enumerate(pieces):
        if len(piece) == 1 and piece[0] not in byte_id:
            byte_id[piece[0]] = i
    _IDS[:] = [byte_id[b] for b in TEXT.encode()]
    return tok, path


@pytest.fixture(scope="module")
def served(tokenizer_and_model, tmp_path_factory) -> Iterator[_Served]:
    _, path = tokenizer_and_model
    stderr = tmp_path_factory.mktemp("log") / "serve.err"
    s = start_served(path, workers=1, token_fn=token_fn, stderr=stderr, step_ms=0.5)
    yield _Served(s, stderr)
    code, left = s.close()
    assert code == 0 and not left


def _expected(tokenizer, n: int) -> str:
    return tokenizer.decode([token_fn("", p) for p in range(n)], skip_special_tokens=True)


@pytest.mark.parametrize("n", [1, 7, 300])
def test_streamed_completion_is_the_exact_decode(served, tokenizer_and_model, n: int) -> None:
    tok, _ = tokenizer_and_model
    stream = served.client.completions.create(
        model="bytes", prompt="hello", max_tokens=n, stream=True
    )
    texts = [e.choices[0].text for e in stream if e.choices]
    assert "".join(texts) == _expected(tok, n)
    assert n < 50 or len(texts) > 10  # streamed, not one blob


def test_streamed_chat_completion_is_the_exact_decode(served, tokenizer_and_model) -> None:
    tok, _ = tokenizer_and_model
    n = 250
    stream = served.client.chat.completions.create(
        model="bytes",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=n,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, usage = [], None
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            content.append(event.choices[0].delta.content)
        if event.usage is not None:
            usage = event.usage
    assert "".join(content) == _expected(tok, n)
    assert usage is not None and usage.completion_tokens == n


def test_a_slow_reader_gets_the_exact_text(served, tokenizer_and_model) -> None:
    # The client reads a few bytes at a time with a small receive buffer: writes back up and
    # the server's back-pressure fall-back runs between native writes.
    tok, _ = tokenizer_and_model
    n = 3000
    sock = post_stream(
        served.s.url,
        {"model": "bytes", "prompt": "hello", "max_tokens": n, "stream": True},
        rcvbuf=2048,
        timeout=DEADLINE,
    )
    head, rest = read_chunked(sock, read=512, within=120)
    assert head.startswith(b"HTTP/1.1 200")
    texts = []
    for event in rest.split(b"\n\n"):
        if event.startswith(b"data: {"):
            texts.append(json.loads(event[6:])["choices"][0]["text"])
    assert "".join(texts) == _expected(tok, n)


def test_a_client_that_leaves_mid_stream_aborts_the_request_without_a_traceback(
    served,
) -> None:
    before = served.aborts()
    with httpx.stream(
        "POST",
        f"{served.s.url}/v1/completions",
        json={"model": "bytes", "prompt": "hello", "max_tokens": 4000, "stream": True},
        timeout=DEADLINE,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(20):  # well into the native writes
            next(line for line in lines if line.startswith("data: "))
    # The connection is closed here, mid-stream.
    served.wait("the disconnect's ABORT at the engine", lambda: served.aborts() > before)
    # A request after it is served in full (the worker is fine).
    out = served.client.completions.create(model="bytes", prompt="hello", max_tokens=5)
    assert out.choices[0].finish_reason == "length"
    log = served.stderr.read_text()
    assert "Traceback" not in log, log
