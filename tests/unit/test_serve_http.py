"""tsfront serve's own HTTP/1.1 connection (tsfront/serve/edge/protocol.py,
tsfront/serve/edge/cycle.py).

Each test runs `EdgeProtocol` under uvicorn's `Server`, as a worker does, on a loopback port,
and talks to it with raw sockets; the answers are read with h11 (an HTTP/1.1 parser of its own,
not ours). The split property drives one connection's bytes through ``data_received`` in two
pieces cut at every point, and asks for the same answers as in one piece. The hostile-client
limits (deadlines, 431, pipelining depth, 100-continue) are tests/hardening/
test_serve_hostile_edge.py's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import h11
import pytest
import uvicorn
from support.inloop import start_uvicorn
from uvicorn.server import ServerState

from tsfront.serve.edge.cycle import RequestCycle
from tsfront.serve.edge.protocol import EdgeLimits, protocol_class

DEADLINE = 10.0


class _App:
    """Answers by path: ``/echo`` the request as JSON (sized), ``/stream`` two chunked events,
    ``/big`` ``size`` bytes chunked, ``/slow`` waits on ``release`` between its two events,
    ``/raise-before`` and ``/raise-after`` raise before and after the start, ``/none`` returns
    without answering."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cycles: list[Any] = []
        self.paused = 0  # sends made while the connection's writing was paused

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.cycles.append(getattr(send, "__self__", None))
        path = scope["path"]
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message["body"]
            more = message["more_body"]
        if path == "/raise-before":
            raise RuntimeError("raised before the start")
        if path == "/none":
            return
        if path == "/echo":
            answer = json.dumps(
                {
                    "method": scope["method"],
                    "path": scope["path"],
                    "raw_path": scope["raw_path"].decode(),
                    "query": scope["query_string"].decode(),
                    "version": scope["http_version"],
                    "body": len(body),
                    "body_head": body[:16].decode("latin-1"),
                    "headers": [[n.decode(), v.decode()] for n, v in scope["headers"]],
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(answer)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": answer})
            return
        # ``?te``: the app names the chunked encoding itself (a HEAD's answer has no body still).
        te = [(b"transfer-encoding", b"chunked")] if scope["query_string"] == b"te" else []
        await send({"type": "http.response.start", "status": 200, "headers": te})
        if path == "/raise-after":
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
            raise RuntimeError("raised after the start")
        if path == "/big":
            size = int(scope["query_string"].decode().partition("=")[2])
            piece = bytes(range(256)) * 256
            sent = 0
            while sent < size:
                self.paused += send.__self__.flow.write_paused
                chunk = piece[: size - sent]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        if path == "/slow":
            self.started.set()
            await self.release.wait()
        await send({"type": "http.response.body", "body": b"data: two\n\n"})


def _limits() -> EdgeLimits:
    return EdgeLimits(
        timeout_header=30, timeout_body=30, max_header_bytes=65536, max_connections=64
    )


class _Served:
    def __init__(self, app: _App, server: uvicorn.Server, port: int, task: asyncio.Task) -> None:
        self.app, self.server, self.port, self.task = app, server, port, task

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
async def served():
    app = _App()
    server, task, port = await start_uvicorn(
        app,
        protocol_class(_limits()),
        log_level="critical",
        timeout_keep_alive=30,
        server_header=False,
        date_header=False,
    )
    yield _Served(app, server, port, task)
    server.should_exit = True
    await asyncio.wait_for(task, DEADLINE)
    # Nothing outlives the server: no connection, no request's task.
    assert not server.server_state.connections
    assert not server.server_state.tasks


async def _responses(
    reader: asyncio.StreamReader,
    count: int,
    methods: tuple[str, ...] = (),
    closed: bool = False,
) -> tuple[list[tuple[h11.Response, bytes]], bool]:
    """``count`` responses read with h11 (``methods``: of the requests, where not POST: h11
    reads a HEAD's answer without a body), and whether the server closed the connection after
    them (waited for when ``closed``)."""
    conn = h11.Connection(h11.CLIENT)
    answers: list[tuple[h11.Response, bytes]] = []
    deadline = time.monotonic() + DEADLINE
    eof = False
    while len(answers) < count:
        method = methods[len(answers)] if len(answers) < len(methods) else "POST"
        conn.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
        conn.send(h11.EndOfMessage())
        head: h11.Response | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                assert time.monotonic() < deadline, "the answer never came"
                data = await asyncio.wait_for(reader.read(1 << 16), DEADLINE)
                if not data:
                    eof = True
                conn.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                answers.append((head, body))
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError(f"closed after {len(answers)} answers")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            break
        conn.start_next_cycle()
    if closed and not eof:
        eof = await asyncio.wait_for(reader.read(), DEADLINE) == b""
    return answers, eof


def _request(path: str, body: bytes = b"", *, method: str = "POST", extra: str = "") -> bytes:
    length = f"content-length: {len(body)}\r\n" if method != "GET" else ""
    return f"{method} {path} HTTP/1.1\r\nhost: x\r\n{length}{extra}\r\n".encode() + body


def _header(head: h11.Response, name: bytes) -> bytes | None:
    return next((v for n, v in head.headers if n == name), None)


async def test_pipelined_requests_are_answered_in_order_on_one_connection(served) -> None:
    reader, writer = await served.connect()
    chunked = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    writer.write(
        _request("/echo", b"first")
        + b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        + chunked
        + _request("/stream")
        + _request("/echo?x=1", method="GET")
    )
    answers, _ = await _responses(reader, 4)
    first, second, stream, third = answers
    assert json.loads(first[1])["body_head"] == "first"
    assert json.loads(second[1])["body_head"] == "hello world"
    assert stream[1] == b"data: one\n\ndata: two\n\n"
    assert _header(stream[0], b"transfer-encoding") == b"chunked"
    assert json.loads(third[1])["method"] == "GET" and json.loads(third[1])["query"] == "x=1"
    writer.close()
    assert served.server.server_state.total_requests >= 4


async def test_the_scope_has_the_path_unquoted_the_raw_path_and_the_query(served) -> None:
    reader, writer = await served.connect()
    writer.write(_request("/ec%68o?q=a%20b&r=1", b"", method="POST", extra="X-Odd:  v \t\r\n"))
    ((head, body),), _ = await _responses(reader, 1)
    scope = json.loads(body)
    assert head.status_code == 200
    assert scope["path"] == "/echo" and scope["raw_path"] == "/ec%68o"
    assert scope["query"] == "q=a%20b&r=1" and scope["version"] == "1.1"
    # Names lowered, a value's surrounding whitespace dropped (RFC 9110 §5.5).
    assert ["x-odd", "v"] in scope["headers"]
    writer.close()


@pytest.mark.parametrize("target", ["/stream", "/stream?te"])
async def test_head_gets_the_headers_and_no_body_and_the_connection_serves_on(
    served, target
) -> None:
    reader, writer = await served.connect()
    writer.write(_request(target, method="HEAD") + _request("/stream"))
    (head_answer, after), _ = await _responses(reader, 2, ("HEAD",))
    assert head_answer[0].status_code == 200 and head_answer[1] == b""
    assert after[1] == b"data: one\n\ndata: two\n\n"
    writer.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /echo HTTP/1.0\r\ncontent-length: 2\r\n\r\nhi",
        b"POST /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi",
        # No WebSocket here: answered as plain HTTP, then closed (the parser stops there).
        b"GET /echo HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    ],
    ids=["http-1.0", "connection-close", "upgrade"],
)
async def test_a_request_that_ends_its_connection_is_answered_then_closed(served, raw) -> None:
    reader, writer = await served.connect()
    writer.write(raw)
    ((head, body),), closed = await _responses(reader, 1, closed=True)
    assert head.status_code == 200 and json.loads(body)["path"] == "/echo"
    assert _header(head, b"connection") == b"close"
    assert closed
    writer.close()


@pytest.mark.parametrize("path", ["/stream", "/big?size=300000"])
async def test_an_http_1_0_client_gets_no_chunked_encoding_and_the_body_to_the_close(
    served, path
) -> None:
    # HTTP/1.0 has no chunked encoding: a body with no length is sent as it comes and ends
    # with the connection.
    reader, writer = await served.connect()
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), DEADLINE)  # to the server's close
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head
    assert b"transfer-encoding" not in head
    if path == "/stream":
        assert body == b"data: one\n\ndata: two\n\n"
    else:
        piece = bytes(range(256)) * 256
        assert body == (piece * 5)[:300000]
    writer.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"BREW /echo HTTP/1.1\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nbad header\r\n\r\n",
        b"POST /echo HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nhi",
        b"POST /echo HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"GET /\xc3\xa9cho HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /echo?\xff HTTP/1.1\r\nhost: x\r\n\r\n",
    ],
    ids=["method", "header", "two-lengths", "chunk-size", "utf8-path", "byte-query"],
)
async def test_a_malformed_request_gets_a_json_400_and_the_connection_closed(served, raw) -> None:
    reader, writer = await served.connect()
    writer.write(raw)
    data = await asyncio.wait_for(reader.read(), DEADLINE)  # to the server's close
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and "well-formed" in error["message"]
    writer.close()


@pytest.mark.parametrize("path", ["/raise-before", "/none"])
async def test_an_app_that_fails_before_its_answer_gets_a_500_and_a_close(served, path) -> None:
    reader, writer = await served.connect()
    writer.write(_request(path))
    ((head, body),), closed = await _responses(reader, 1, closed=True)
    assert head.status_code == 500 and body == b"Internal Server Error"
    assert closed
    writer.close()


async def test_an_app_that_fails_mid_answer_has_its_connection_closed(served) -> None:
    reader, writer = await served.connect()
    writer.write(_request("/raise-after"))
    data = await asyncio.wait_for(reader.read(), DEADLINE)  # to the server's close
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == b"4\r\npart\r\n"  # no last chunk: the client sees the answer cut
    writer.close()


async def test_a_body_over_the_high_water_mark_arrives_whole(served) -> None:
    reader, writer = await served.connect()
    body = bytes(range(256)) * 8192  # 2 MiB: reading pauses and resumes along the way
    writer.write(_request("/echo", body))
    ((_head, answer),), _ = await _responses(reader, 1)
    assert json.loads(answer)["body"] == len(body)
    writer.close()


async def test_a_client_that_reads_slowly_gets_every_byte_in_order(served) -> None:
    reader, writer = await served.connect()
    size = 8 << 20  # far past the transport's high-water mark: send() waits for the drain
    writer.write(_request(f"/big?size={size}"))
    ((_head, body),), _ = await _responses(reader, 1)
    assert served.app.paused > 0  # the app's sends met a paused connection, and waited
    piece = bytes(range(256)) * 256
    assert len(body) == size and body == (piece * (size // len(piece) + 1))[:size]
    writer.close()


async def test_shutdown_lets_the_running_answer_end_then_closes(served) -> None:
    reader, writer = await served.connect()
    idle_reader, idle_writer = await served.connect()
    writer.write(_request("/slow"))
    await asyncio.wait_for(served.app.started.wait(), DEADLINE)
    for connection in list(served.server.server_state.connections):
        connection.shutdown()
    # The idle connection is closed at once; the running answer ends whole, then its close.
    assert await asyncio.wait_for(idle_reader.read(), DEADLINE) == b""
    served.app.release.set()
    ((_head, body),), closed = await _responses(reader, 1, closed=True)
    assert body == b"data: one\n\ndata: two\n\n" and closed
    writer.close()
    idle_writer.close()


async def test_a_client_leaving_mid_answer_marks_every_request_of_it_disconnected(served) -> None:
    _reader, writer = await served.connect()
    writer.write(_request("/slow") + _request("/echo", b"queued"))
    await asyncio.wait_for(served.app.started.wait(), DEADLINE)
    running = served.app.cycles[0]
    assert type(running) is RequestCycle
    writer.close()
    deadline = time.monotonic() + DEADLINE
    while not running.disconnected:
        assert time.monotonic() < deadline, "the loss was never told"
        await asyncio.sleep(0.01)
    served.app.release.set()
    assert len(served.app.cycles) == 1  # the queued request was never started


async def test_every_split_of_a_connections_bytes_gets_the_same_answers() -> None:
    # Three pipelined requests (a sized body, a chunked one, a GET), fed in two pieces cut at
    # every point: the same answers as fed whole.
    stream = (
        _request("/echo", b"abc")
        + b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"3\r\nxyz\r\n0\r\n\r\n"
        + _request("/stream", method="GET")
    )
    whole = await _fed([stream])
    assert whole.count(b"HTTP/1.1 200 OK") == 3
    for cut in range(1, len(stream)):
        assert await _fed([stream[:cut], stream[cut:]]) == whole, f"cut at {cut}"


class _Transport(asyncio.Transport):
    """A recording transport: what the protocol writes, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)


async def _fed(pieces: list[bytes]) -> bytes:
    config = uvicorn.Config(_App(), lifespan="off", log_level="critical")
    config.load()
    state = ServerState()
    protocol = protocol_class(_limits())(config=config, server_state=state, app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    for piece in pieces:
        protocol.data_received(piece)
        await asyncio.sleep(0)
    deadline = time.monotonic() + DEADLINE
    while state.tasks or protocol._cycles:
        assert time.monotonic() < deadline, "the answers never ended"
        await asyncio.sleep(0.001)
    await asyncio.sleep(0)  # a held head's flush
    protocol.connection_lost(None)
    return bytes(transport.written)
