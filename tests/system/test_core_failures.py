"""Failures are contained: a dead rank fails only its streams, a killed worker only its own
requests, and a killed I/O process ends every open stream promptly with `IOProcessDied`."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    engine_rids,
    expected_tokens,
    hold_main,
    in_thread,
    next_chunk,
    reap,
    request,
    rig,
    spawn,
    wait_until,
)

from tsfront import ClientClosed, EngineDied, EngineUnavailable, IOProcessDied, StreamError


async def test_dead_rank_fails_only_its_streams():
    # Rank 1 sends ENGINE_CORE_DEAD after 5 decode steps; rank 0 is healthy.
    async with rig(2, first_engine_index=3, rank_options={1: {"dead_after_steps": 5}}) as r:
        doomed = [await r.client.generate(request(f"on-1-{i}", FOREVER, pin=1)) for i in range(3)]
        healthy = [await r.client.generate(request(f"on-0-{i}", 40, pin=0)) for i in range(3)]
        for s in doomed:
            with pytest.raises(EngineDied) as info:
                await collect(s)
            assert info.value.engine_index == 4
            assert info.value.rid == s.rid
            with pytest.raises(StopAsyncIteration):  # the error is raised once
                await anext(s)
        for s in healthy:
            tokens, chunks = await collect(s)
            assert tokens == expected_tokens(s.rid, 40)
            assert chunks[-1].finish_reason == "length"
        loads = r.client.load()
        assert [(x.alive, x.state) for x in loads] == [(True, "live"), (False, "dead")]
        # New unpinned requests avoid the dead rank...
        for i in range(4):
            tokens, chunks = await collect(await r.client.generate(request(f"after-{i}", 2)))
            assert chunks[-1].engine_index == 3
        assert not any(rid.startswith("after-") for rid in engine_rids(r.sim, 4))
        # ...and a request pinned to it is refused at once, before anything is sent.
        with pytest.raises(EngineUnavailable, match="not live"):
            await r.client.generate(request("pinned-to-dead", 2, pin=1))
        assert "pinned-to-dead" not in engine_rids(r.sim, 4)


async def test_rank_that_vanishes_without_a_sentinel_fails_its_streams():
    # exit_after_steps: the rank closes its sockets without ENGINE_CORE_DEAD (a crash); the
    # lost output connection is what tells the I/O process.
    crash = {0: {"exit_after_steps": 3}}
    async with rig(2, rank_options=crash, config={"heartbeat_timeout": 1}) as r:
        doomed = await r.client.generate(request("crashed-on-0", FOREVER, pin=0))
        healthy = await r.client.generate(request("on-1", 30, pin=1))
        with pytest.raises(EngineDied) as info:
            await collect(doomed)
        assert info.value.engine_index == 0
        tokens, _ = await collect(healthy)
        assert tokens == expected_tokens("on-1", 30)


async def test_killed_worker_has_its_requests_aborted_and_others_keep_streaming():
    async with rig(2) as r:
        mine = await r.client.generate(request("survivor", FOREVER))
        await next_chunk(mine)
        rids = [f"orphan-{i}" for i in range(4)]
        proc, conn = spawn(hold_main, r.io.address, rids)
        try:
            assert await in_thread(conn.poll, DEADLINE), "worker never reported"
            assert conn.recv() == "streaming"
            os.kill(proc.pid, signal.SIGKILL)
            for rid in rids:
                await in_thread(r.sim.wait_abort, rid, DEADLINE)
        finally:
            reap(proc)
            conn.close()
        # This worker's stream still flows, and new requests are served.
        for _ in range(5):
            await next_chunk(mine)
        mine.abort()
        tokens, _ = await collect(await r.client.generate(request("after-kill", 4)))
        assert tokens == expected_tokens("after-kill", 4)
        # A new worker can take the dead one's place.
        other = await r.attach()
        tokens, _ = await collect(await other.generate(request("new-worker", 3)))
        assert tokens == expected_tokens("new-worker", 3)


async def test_killed_io_process_ends_every_open_stream_within_a_second():
    async with rig(2) as r:
        other = await r.attach()
        streams = [await r.client.generate(request(f"open-{i}", FOREVER)) for i in range(4)]
        streams += [await other.generate(request(f"other-{i}", FOREVER)) for i in range(2)]
        for s in streams:
            await next_chunk(s)
        os.kill(r.io.pid, signal.SIGKILL)
        killed = time.monotonic()

        async def ended(s) -> float:
            with pytest.raises(IOProcessDied):
                await collect(s, timeout=1.0)
            return time.monotonic() - killed

        elapsed = await asyncio.gather(*(ended(s) for s in streams))
        assert max(elapsed) < 1.0
        assert r.client.closed and other.closed
        with pytest.raises(ClientClosed):
            await r.client.generate(request("too-late", 2))
        with pytest.raises(ClientClosed):
            r.client.load()
        await wait_until(lambda: not r.io.alive(), "the I/O process to be reaped")


async def test_closing_the_client_ends_its_open_streams():
    async with rig(1) as r:
        other = await r.attach()
        s = await other.generate(request("closed-under", FOREVER))
        await next_chunk(s)
        await other.close()
        with pytest.raises(StreamError):
            await collect(s)
        await in_thread(r.sim.wait_abort, "closed-under", DEADLINE)
        with pytest.raises(ClientClosed):
            await other.generate(request("x", 1))
