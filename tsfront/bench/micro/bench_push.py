"""The drain's native pass over real loopback connections: the event sent on the socket by the
pass itself (the default while the transport holds nothing) against the transport's write.

One batch is what a worker's drain gets from one engine step: one plain token for each of
`CONNECTIONS` parked streams, each with a real `Pusher` (the native step) on a real uvloop TCP
transport whose other end a reader process drains; `deliver_all` takes the batch as the worker
does (``tsfront._native.push_batch``). The two benchmarks differ only in the pushers' ``_fd``
(``-1``: no direct send, every event through ``transport.write``), so their ratio is what the
direct send saves (docs/PERFORMANCE.md, "Worker per token: the direct send"). A third,
``connection``, has each transport behind tsfront serve's `ConnectionTransport`, as under
``tsfront serve``, so the pass skips its checks while the connection stays clean (the first
round's events make them and set it; docs/PERFORMANCE.md, "Owning the connection's write
state"). Each runs ``warm`` and ``cold`` (64 MB written before every round, so that what the
pass reads has left the caches, as between two tokens of a connection in a server): what the
clean flag saves is the checks' cache misses, which only the cold rounds show. uvicorn's
cycle is a stand-in with what the pass reads of it (`tsfront.bench.standins.TransportCycle`);
between rounds the loop runs briefly, so the transports and the reader keep up.
Run: ``.venv/bin/python -m pytest tsfront/bench/micro/bench_push.py``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import weakref
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pytest
import uvloop

import tsfront.serve.core.push as push
from tsfront.bench.floor import drain_connections
from tsfront.bench.standins import NullOwner, TransportCycle
from tsfront.client.stream import RequestStream, deliver_all
from tsfront.serve.core.choice import Choice
from tsfront.serve.core.push import Pusher
from tsfront.serve.edge.transport import ConnectionTransport
from tsfront.text.detok import TableDetokenizer, TokenTable

CONNECTIONS = 64
ROUNDS = 300
COLD_ROUNDS = 100
EVICT_BYTES = 64 << 20
_TABLE = TokenTable([b" w%d" % i for i in range(64)], None, frozenset(), False, False, "replace")
_HEAD = (
    b'data: {"id":"cmpl-0123456789abcdef01234567","object":"text_completion",'
    b'"choices":[{"index":0,"text":'
)
_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'


class _Rig:
    def __init__(self, wrapped: bool) -> None:
        self.wrapped = wrapped
        self.loop = uvloop.new_event_loop()
        self.transports: list[asyncio.Transport] = []
        self.streams: list[RequestStream] = []
        self.pushers: list[Pusher] = []
        self.conns: list[ConnectionTransport] = []  # behind which the pushers write (wrapped)
        self.fds: list[int] = []
        self.tasks: list[asyncio.Task] = []
        self.refs: list[weakref.ref[RequestStream] | None] = []
        self.position = 0
        self.reader: Any = None

    async def start(self) -> None:
        made = self.transports

        class _Proto(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                made.append(transport)

        server = await self.loop.create_server(_Proto, "127.0.0.1", 0)
        ours, theirs = multiprocessing.Pipe()
        ctx = multiprocessing.get_context("spawn")
        port = cast(asyncio.Server, server).sockets[0].getsockname()[1]
        self.reader = ctx.Process(
            target=drain_connections, args=(port, CONNECTIONS, sys.maxsize, theirs), daemon=True
        )
        self.reader.start()
        if not await self.loop.run_in_executor(None, ours.poll, 60):
            raise RuntimeError("the reader did not connect")
        while len(made) < CONNECTIONS:
            await asyncio.sleep(0.005)
        server.close()
        owner = NullOwner(self.loop)
        for i, transport in enumerate(made):
            stream = RequestStream(owner, f"r{i}", i, 1)
            detok = TableDetokenizer(_TABLE)
            detok.step([0])  # past the first-token rules: the native step applies
            conn: Any = transport
            if self.wrapped:
                conn = ConnectionTransport(transport)
                self.conns.append(conn)
            pusher = Pusher(
                Choice(0, stream, detok, None, 1), _HEAD, _TAIL, TransportCycle(conn).send
            )
            assert pusher.native and pusher._fd >= 0
            stream.set_sink(pusher)
            self.streams.append(stream)
            self.pushers.append(pusher)
            self.fds.append(pusher._fd)
            self.tasks.append(asyncio.ensure_future(self._park(stream)))
        await asyncio.sleep(0.01)
        self.refs[:] = [weakref.ref(s) for s in self.streams]

    @staticmethod
    async def _park(stream: RequestStream) -> None:
        async for _ in stream:
            raise AssertionError("a chunk left the native pass")

    def direct(self, on: bool) -> None:
        for pusher, fd in zip(self.pushers, self.fds, strict=True):
            pusher._fd = fd if on else -1

    def batch(self) -> None:
        self.position += 1
        p = self.position
        deliver_all(
            [(i, [1 + (p + i) % 63], None, None, 0, 1, p, 0, 0) for i in range(CONNECTIONS)],
            self.refs,
        )

    def settle(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0.001))

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for transport in self.transports:
            transport.close()
        self.loop.run_until_complete(asyncio.sleep(0.01))
        self.loop.close()
        if self.reader is not None:
            self.reader.join(10)
            if self.reader.is_alive():
                self.reader.kill()


@pytest.fixture(scope="module", params=[False, True], ids=["transport", "connection"])
def rig(request: pytest.FixtureRequest) -> Iterator[_Rig]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(push, "_cycle_types", lambda: (TransportCycle,))
        r = _Rig(request.param)
        try:
            r.loop.run_until_complete(r.start())
            yield r
        finally:
            r.close()


_EVICT: list[np.ndarray] = []


def _evict() -> None:
    # Every cache line of 64 MB written: what the pass reads is cold again, as in a server
    # whose connections each get a token every 20 ms.
    if not _EVICT:
        _EVICT.append(np.zeros(EVICT_BYTES, dtype=np.uint8))
    _EVICT[0][::64] += 1


@pytest.mark.parametrize("cache", ["warm", "cold"])
@pytest.mark.parametrize("send", ["direct", "transport_write"])
def test_drain_pass_batch(benchmark, rig: _Rig, send: str, cache: str) -> None:
    if rig.wrapped and send != "direct":
        pytest.skip("behind the connection's transport: the direct send only (``clean``)")
    rig.direct(send == "direct")
    before = sum(p.direct_sends for p in rig.pushers)
    if cache == "cold":

        def setup() -> None:
            rig.settle()
            _evict()

        benchmark.pedantic(rig.batch, setup=setup, rounds=COLD_ROUNDS, iterations=1)
    else:
        benchmark.pedantic(rig.batch, setup=rig.settle, rounds=ROUNDS, iterations=1)
    sent = sum(p.direct_sends for p in rig.pushers) - before
    if send == "direct":
        assert sent > 0, "no event was sent directly"
    else:
        assert sent == 0
    if rig.wrapped:
        assert sum(c.clean_sends for c in rig.conns) > 0, "no clean connection"
    assert all(p.error is None for p in rig.pushers)
