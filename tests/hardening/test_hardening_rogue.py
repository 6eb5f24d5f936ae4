"""Rogue peers: whatever arrives on any socket of the I/O process, it keeps serving.

Each test runs a healthy stream on a real rank while the rogue traffic flows, and checks it
completes with every token; the I/O process's memory (RSS) is checked to stay bounded where
the traffic is large.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket

import pytest
import zmq
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    expected_tokens,
    in_thread,
    next_chunk,
    request,
    rig,
    wait_until,
)
from support.raw_engine import RawEngine, raw_rig

from tsfront import ClientConfig, EngineClient, HandshakeTimeout, IOProcess
from tsfront.ipc import channel
from tsfront.testing import private_addresses
from tsfront.wire import (
    BatchTokenIDOutSlim,
    EngineRegistration,
    decode_init,
    encode_hello,
    encode_output,
    encode_ready,
    encode_registration,
    engine_identity,
)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _healthy(r, rid: str, n: int = 400, pin: int = 0) -> None:
    tokens, chunks = await collect(await r.client.generate(request(rid, n, pin=pin)), 30)
    assert tokens == expected_tokens(rid, n)
    assert chunks[-1].finish_reason == "length"


def _submit_address(io_address: str) -> str:
    return "ipc://@" + io_address.split("@", 1)[1] + "-submit"


def _garbage(rng: random.Random, n: int) -> list[bytes]:
    return [rng.randbytes(rng.randrange(0, 600)) for _ in range(n)]


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


async def _no_reply(sock: zmq.Socket, timeout_ms: int = 300) -> bool:
    return not await in_thread(sock.poll, timeout_ms)


async def test_out_of_range_identity_is_never_answered(zctx):
    async with rig(2) as r:
        rogue = zctx.socket(zmq.DEALER)
        rogue.setsockopt(zmq.IDENTITY, engine_identity(77))
        rogue.connect(r.io.handshake_address)
        healthy = asyncio.create_task(_healthy(r, "ok-range"))
        rogue.send(encode_hello())
        assert await _no_reply(rogue)
        await healthy
        assert [e.state for e in r.client.load()] == ["live", "live"]


async def test_duplicate_identity_is_deferred_until_the_first_dies(zctx):
    async with rig(2) as r:
        held = await r.client.generate(request("held", FOREVER, pin=1))
        await next_chunk(held)
        dup = zctx.socket(zmq.DEALER)
        dup.setsockopt(zmq.IDENTITY, engine_identity(1))
        dup.connect(r.io.handshake_address)
        dup.send(encode_hello())
        assert await _no_reply(dup)  # deferred: the live rank 1 is undisturbed
        assert not held.finished
        await _healthy(r, "during-dup", 200, pin=1)
        # Once the first is known dead the newcomer is taken as a restart: it gets its INIT.
        r.sim.engine(1).stop(sentinel=True)
        assert await in_thread(dup.poll, int(DEADLINE * 1000))
        init = decode_init(dup.recv_multipart()[-1])
        assert init.addresses.outputs == [r.io.output_addresses[1]]
        dup.send(encode_ready())
        await _healthy(r, "rank0-after-dup", 100, pin=0)


async def test_hello_flood_and_garbage_on_the_handshake_socket(zctx):
    async with rig(2) as r:
        rss0 = _rss_kb(r.io.pid)
        rng = random.Random(1)
        healthy = asyncio.create_task(_healthy(r, "under-flood", 1000))
        socks = []
        for i in range(20):
            s = zctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, engine_identity(1000 + i) if i % 2 else rng.randbytes(5))
            s.connect(r.io.handshake_address)
            socks.append(s)

        def flood() -> None:
            for k in range(20_000):
                s = socks[k % len(socks)]
                if k % 3 == 0:
                    s.send(encode_hello())
                else:
                    s.send_multipart(_garbage(rng, rng.randrange(1, 4)))

        await in_thread(flood)
        await healthy
        for s in socks:
            assert await _no_reply(s, 10)
        assert [e.state for e in r.client.load()] == ["live", "live"]
        assert _rss_kb(r.io.pid) - rss0 < 64 * 1024


async def test_garbage_on_input_and_output_sockets(zctx):
    async with rig(2) as r:
        rng = random.Random(2)
        held = await r.client.generate(request("held-io", FOREVER, pin=1))
        await next_chunk(held)
        healthy = asyncio.create_task(_healthy(r, "under-garbage", 800))
        # Input ROUTER: unknown identities, and a live engine's identity out of turn.
        inp = []
        for ident in (rng.randbytes(2), engine_identity(0), engine_identity(9)):
            s = zctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident)
            s.connect(r.io.input_address)
            inp.append(s)
        # Each output PULL: garbage frames and truncated/odd msgpack.
        outs = []
        for address in r.io.output_addresses:
            s = zctx.socket(zmq.PUSH)
            s.connect(address)
            outs.append(s)

        def spray() -> None:
            for k in range(3000):
                inp[k % 3].send_multipart(_garbage(rng, rng.randrange(1, 4)))
                outs[k % 2].send(rng.randbytes(rng.randrange(0, 300)))
            for s in outs:
                s.send(b"\x9a" + b"\xc0" * 9)  # a 10-array of nils
                s.send(b"\xdd\xff\xff\xff\xff")  # an array claiming 4 G elements

        await in_thread(spray)
        await healthy
        assert not held.finished
        # The rogue PUSHes leave: that must not count as the engines' own disconnects.
        for s in outs + inp:
            s.close(linger=0)
        await _healthy(r, "after-rogues-left", 300, pin=1)
        assert not held.finished
        assert [e.state for e in r.client.load()] == ["live", "live"]
        held.abort()


async def test_oversized_frames_are_dropped_with_bounded_memory(zctx):
    async with rig(2) as r:
        rss0 = _rss_kb(r.io.pid)
        big = b"\x00" * (32 << 20)
        healthy = asyncio.create_task(_healthy(r, "under-big", 600))
        hs = zctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, engine_identity(0))
        hs.connect(r.io.handshake_address)
        inp = zctx.socket(zmq.DEALER)
        inp.connect(r.io.input_address)
        out = zctx.socket(zmq.PUSH)
        out.connect(r.io.output_addresses[0])

        def send_big() -> None:
            for _ in range(4):
                hs.send(big)
                inp.send(big)
                out.send(big)

        await in_thread(send_big)
        await healthy
        # Frames are dropped once decoded as garbage; the I/O process keeps no copy.
        await wait_until(
            lambda: _rss_kb(r.io.pid) - rss0 < 200 * 1024, "I/O RSS back under 200 MiB above start"
        )
        await _healthy(r, "after-big", 100)
        out.close(linger=0)
        hs.close(linger=0)
        inp.close(linger=0)


async def test_garbage_on_the_submit_and_control_sockets(zctx):
    async with rig(1) as r:
        rng = random.Random(3)
        healthy = asyncio.create_task(_healthy(r, "under-local-garbage", 800))
        sub = zctx.socket(zmq.DEALER)
        sub.setsockopt(zmq.IDENTITY, b"\x00\x00\x00\x00" + b"\x01" * 8)  # a worker 0 impostor
        sub.connect(_submit_address(r.io.address))
        for _ in range(2000):
            sub.send_multipart(_garbage(rng, rng.randrange(1, 5)))
        name = channel.socket_name(r.io.address)
        for payload in (
            rng.randbytes(1000),
            b"\xff\xff\xff\x7f",  # a length over the limit
            b"\x05\x00\x00\x00" + b"\xc1" * 5,  # undecodable msgpack
            channel.pack({"op": "attach"}),  # no eventfd
            channel.pack({"op": "nonsense", "x": 1}),
            b"",  # connect and leave
        ):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(name)
            if payload:
                c.sendall(payload)
            c.close()
        await healthy
        # A well-formed impostor of a real worker's identity is dropped as stale.
        worker0 = r.client._att.worker
        sub.send_multipart([b"X", b"\x00" * 12])
        await _healthy(r, f"after-local-garbage-{worker0}", 50)
        assert r.io.alive()
        fds = len(os.listdir(f"/proc/{r.io.pid}/fd"))
        assert fds < 200
        sub.close(linger=0)


def _tail_frame(running: int, waiting: int, active: int, total: int) -> bytes:
    empty: list = []
    return encode_output(
        BatchTokenIDOutSlim(
            empty,
            empty,
            empty,
            empty,
            empty,
            empty,
            empty,
            empty,
            0,
            running,
            waiting,
            active,
            total,
        )
    )


async def test_load_tail_outside_u32_on_an_output_pull_keeps_the_io_process_serving(zctx):
    # A 0-row frame passes the decoder whatever its tail says; storing num_running = -1 into
    # the engine table used to raise in the loop and end the I/O process.
    async with rig(2) as r:
        held = await r.client.generate(request("held-tail", FOREVER, pin=0))
        await next_chunk(held)
        healthy = asyncio.create_task(_healthy(r, "under-bad-tails", 300, pin=0))
        rogue = zctx.socket(zmq.PUSH)
        rogue.connect(r.io.output_addresses[0])
        for tail in ((-1, 0, 0, 1000), (0, 1 << 32, 0, 1000), (0, 0, 1 << 40, 1000), (0, 0, 0, -1)):
            rogue.send(_tail_frame(*tail))
        await healthy
        await _healthy(r, "after-bad-tails", 50, pin=0)
        assert r.io.alive() and not held.finished
        assert [e.state for e in r.client.load()] == ["live", "live"]
        held.abort()
        rogue.close(linger=0)


async def test_an_engine_naming_another_engines_rid_never_touches_that_stream():
    # Rank 1's output socket (rank 1 lying, or anything connected to its port) sends rows for
    # a rid sent to rank 0, in frames that even claim to come from rank 0: tokens, then a
    # finish. They are unknown rows; rank 0's stream gets its tokens and its end from rank 0.
    async with raw_rig(2) as (_io, (rank0, rank1), client, _ctx):
        stream = await client.generate(request("on-rank-0", FOREVER, pin=0))
        assert (await in_thread(rank0.recv_add)).rid == "on-rank-0"
        before = client.metrics()
        rank1.push(
            rank0.tokens_frame("on-rank-0", [666, 667], 2),
            rank0.tokens_frame("on-rank-0", [668], 3, "stop"),
        )
        await wait_until(lambda: client.metrics()["rows"] >= before["rows"] + 2, "rows ingested")
        rank0.push(
            rank0.tokens_frame("on-rank-0", [5, 6], 2),
            rank0.tokens_frame("on-rank-0", [7], 3, "length"),
        )
        tokens, chunks = await collect(stream)
        assert tokens == [5, 6, 7]
        assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 3
        assert {c.engine_index for c in chunks} == {0}
        assert client.metrics()["unknown_rows"] == before["unknown_rows"] + 2


async def test_a_garbage_registration_is_dropped_and_the_ranks_next_one_counts():
    # The raw engine lies through the shared handshake's registration hook: its first frame
    # on the input is no registration at all. The I/O process drops it (the rank stays
    # handshaking, so a client cannot attach yet), keeps running, and the rank's next,
    # well-formed registration makes it live and served.
    cfg = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        num_engines=1,
        handshake_timeout=DEADLINE,
        **private_addresses(),
    )
    io = await asyncio.to_thread(IOProcess.start, cfg)
    ctx = zmq.Context()
    engine = client = None
    try:
        engine = await in_thread(
            lambda: RawEngine(ctx, io.handshake_address, 0, registration=b"\xc1 not a map")
        )
        with pytest.raises(HandshakeTimeout):
            await EngineClient.attach(io.address, timeout=0.5)
        engine.input.send(encode_registration(EngineRegistration(max_model_len=1 << 20)))
        client = await EngineClient.attach(io.address, timeout=DEADLINE)
        stream = await client.generate(request("after-garbage", 2))
        assert (await in_thread(engine.recv_add)).rid == "after-garbage"
        engine.push(engine.tokens_frame("after-garbage", [5, 6], 2, "length"))
        tokens, chunks = await collect(stream)
        assert tokens == [5, 6] and chunks[-1].finish_reason == "length"
    finally:
        if client is not None:
            await client.close()
        if engine is not None:
            engine.close()
        ctx.destroy(linger=0)
        await asyncio.to_thread(io.stop)
