"""What the worker's HTTP layer costs a request on its own: the bound of a tsfront-owned
HTTP/1.1 connection (docs/PERFORMANCE.md, "A connection's answers once per connection").

One uvloop loop holds both ends of a keep-alive loopback connection: a client that writes the
bench's streamed completion request (8 headers, a 70-byte body) and reads the chunked answer,
and one of two servers:

* ``edge``: `tsfront serve`'s `EdgeProtocol` (its own HTTP/1.1 connection, with the edge)
  running a trivial ASGI app: one ``receive``, the start, one event, the end;
* ``uvicorn``: uvicorn's own httptools protocol (what ``edge`` replaced), no edge, the same app;
* ``canned``: a bare `asyncio.Protocol` that writes the same answer's bytes in the same two
  writes, a loop turn apart (as the edge sends a short request's), parsing nothing.

A round is `PER_ROUND` requests' round trips, one after the other in one coroutine, client
included; ``edge`` minus ``canned``, divided by `PER_ROUND`, is the protocol, its request
cycle and task, the ASGI messages and the edge, per request; ``uvicorn`` minus ``edge`` what
tsfront's own connection saves against uvicorn's (less the edge, which ``uvicorn`` lacks). Run:
``.venv/bin/python -m pytest tsfront/bench/micro/bench_http.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

ROUNDS = 40
PER_ROUND = 100
BODY = json.dumps({"model": "m", "prompt": "w5 w6 w7 w8", "max_tokens": 2, "stream": True}).encode()
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: */*\r\n"
    b"accept-encoding: gzip, deflate\r\nconnection: keep-alive\r\nuser-agent: python-httpx/0.28\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)
) + BODY
EVENT = b'data: {"x":1}\n\n'
DONE = b"data: [DONE]\n\n"
END = b"0\r\n\r\n"
# The edge's answer after its headers, and the canned one whole, in the same two writes.
FIRST = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FIRST += b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
LAST = b"%x\r\n%s\r\n" % (len(DONE), DONE) + END


async def _app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    await send({"type": "http.response.body", "body": EVENT, "more_body": True})
    await send({"type": "http.response.body", "body": DONE})


class _Canned(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self.transport.write(FIRST)
        self.loop.call_soon(self.transport.write, LAST)


class _Rig:
    def __init__(self, server: str) -> None:
        self.loop = uvloop.new_event_loop()
        self.server_kind = server
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.server: Any = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.server_kind in ("edge", "uvicorn"):
            from uvicorn.config import Config
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
            from uvicorn.server import ServerState

            from tsfront.serve.edge.protocol import EdgeLimits, protocol_class

            config = Config(
                app=_app, http="httptools", lifespan="off", access_log=False, proxy_headers=False
            )
            config.load()
            state = ServerState()
            limits = EdgeLimits(
                timeout_header=30, timeout_body=30, max_header_bytes=65536, max_connections=16
            )
            cls: Any = protocol_class(limits) if self.server_kind == "edge" else HttpToolsProtocol

            def factory() -> asyncio.Protocol:
                protocol: asyncio.Protocol = cls(
                    config=config, server_state=state, app_state={}, _loop=loop
                )
                return protocol

            self.server = await loop.create_server(factory, "127.0.0.1", 0)
        else:
            self.server = await loop.create_server(_Canned, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)

    async def _round_trip(self) -> bytes:
        assert self.reader is not None and self.writer is not None
        self.writer.write(REQUEST)
        data = b""
        while not data.endswith(END):
            chunk = await self.reader.read(65536)
            if not chunk:
                raise RuntimeError("the server closed the connection")
            data += chunk
        return data

    async def _round_trips(self, n: int) -> bytes:
        answer = b""
        for _ in range(n):
            answer = await self._round_trip()
        return answer

    def requests(self, n: int = PER_ROUND) -> bytes:
        """``n`` round trips; the last answer."""
        return self.loop.run_until_complete(self._round_trips(n))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.server is not None:
            self.server.close()
        self.loop.run_until_complete(asyncio.sleep(0.01))
        self.loop.close()


@pytest.fixture(scope="module", params=["edge", "uvicorn", "canned"])
def rig(request: pytest.FixtureRequest) -> Iterator[_Rig]:
    r = _Rig(request.param)
    try:
        r.loop.run_until_complete(r.start())
        r.requests(500)  # warm
        yield r
    finally:
        r.close()


def test_http_request_round_trip(benchmark, rig: _Rig) -> None:
    answer = benchmark.pedantic(rig.requests, rounds=ROUNDS, iterations=1)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in head
    assert EVENT in body and DONE in body and body.endswith(END)
