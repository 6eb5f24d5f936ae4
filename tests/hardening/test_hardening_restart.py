"""Restart: a rank that comes back (new process, same identity) handshakes again and takes
traffic, with neither the I/O process nor the attached workers restarted; likewise when every
rank restarts at once.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    expected_tokens,
    next_chunk,
    request,
    wait_until,
)
from support.hardening import io_rig, wait_state

from tsfront import EngineDied, EngineUnavailable


async def _serve_pinned(client, rid: str, rank: int, n: int = 20) -> None:
    tokens, chunks = await collect(await client.generate(request(rid, n, pin=rank)))
    assert tokens == expected_tokens(rid, n)
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].engine_index == rank


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
async def test_one_rank_restarts_under_the_same_identity(how):
    async with io_rig(2) as r:
        a = await r.attach()
        b = await r.attach()  # a second worker: it must see the restart too
        io_pid = r.io.pid
        held = await a.generate(request("held", FOREVER, pin=1))
        await next_chunk(held)
        t0 = time.monotonic()
        if how == "sigkill":
            r.ranks[1].kill()
        else:
            r.ranks[1].stop()  # SIGTERM: the rank sends ENGINE_CORE_DEAD
        with pytest.raises(EngineDied):
            await collect(held)
        await wait_state(b, 1, "dead")
        with pytest.raises(EngineUnavailable):
            await b.generate(request("while-dead", 5, pin=1))
        # Unpinned requests go to the live rank meanwhile.
        tokens, chunks = await collect(await b.generate(request("meanwhile", 5)))
        assert chunks[-1].engine_index == 0 and len(tokens) == 5

        r.start_rank(1)
        t1 = time.monotonic()
        await wait_state(a, 1, "live", 30)
        await wait_state(b, 1, "live", 30)
        print(f"\n{how}: dead after {t1 - t0:.3f}s; re-registered {time.monotonic() - t1:.3f}s")
        await _serve_pinned(a, f"after-{how}-a", 1)
        await _serve_pinned(b, f"after-{how}-b", 1)
        assert r.io.alive() and r.io.pid == io_pid
        await wait_until(lambda: a.metrics()["in_flight"] == 0, "in_flight back to 0")


async def test_every_rank_restarts():
    async with io_rig(3) as r:
        client = await r.attach()
        streams = [await client.generate(request(f"all-{k}", FOREVER, pin=k)) for k in range(3)]
        for s in streams:
            await next_chunk(s)
        for p in list(r.ranks.values()):
            p.kill()
        for s in streams:
            with pytest.raises(EngineDied):
                await collect(s)
        for k in range(3):
            await wait_state(client, k, "dead")
        for k in range(3):
            r.start_rank(k)
        for k in range(3):
            await wait_state(client, k, "live", 30)
        await asyncio.gather(*(_serve_pinned(client, f"back-{k}", k) for k in range(3)))
        # And the routing of unpinned requests covers the restarted ranks again.
        spread = [await client.generate(request(f"spread-{i}", 3)) for i in range(12)]
        done = await asyncio.gather(*(collect(s) for s in spread))
        assert {chunks[-1].engine_index for _, chunks in done} == {0, 1, 2}
        await wait_until(lambda: client.metrics()["in_flight"] == 0, "in_flight back to 0")


async def test_restart_twice_in_a_row():
    async with io_rig(1) as r:
        client = await r.attach()
        for round_ in range(3):
            r.ranks[0].kill()
            await wait_state(client, 0, "dead", DEADLINE)
            r.start_rank(0)
            await wait_state(client, 0, "live", 30)
            await _serve_pinned(client, f"round-{round_}", 0, 5)
