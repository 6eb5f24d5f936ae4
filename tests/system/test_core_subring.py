"""Submissions through the workers' shared-memory rings, through a real I/O process and sim ranks.

Pins: small ADDs and ABORTs go through the ring (the I/O process counts them, none over ZMQ);
the ADDs of one turn of the worker's loop wake the parked I/O process once (one doorbell at the
end of the turn, not one an ADD) and all reach the engine, and a turn that publishes more than
the ring holds rings before it fills;
a prompt too large for the ring goes over ZMQ and the ADDs made right after it reach the engine
after it, in order; an ABORT right after its ADD reaches the engine after that ADD on either
path; a full ring is `Busy` at once (never a hang) and takes submissions again once the I/O
process drained it, as a worker whose every slot is in use gets `Busy`; a worker killed
mid-stream is replaced at its place by a new one whose ring works from a clean start; and
``submit_ring_bytes=0`` keeps every submission on ZMQ.
"""

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
    hold_main,
    in_thread,
    next_chunk,
    reap,
    request,
    rig,
    spawn,
    streams_main,
    wait_until,
)

from tsfront.errors import Busy

SMALL_RING = 4096  # records up to 2,048 bytes: a prompt of ~700 ids of 3 bytes does not fit
BIG_PROMPT = [40000 + i for i in range(1000)]  # 3 msgpack bytes an id: ~3 KB of payload


def _counts(r) -> tuple[int, int]:
    m = r.client.metrics()
    return m["ring_submissions"], m["zmq_submissions"]


async def test_adds_and_aborts_go_through_the_ring() -> None:
    async with rig(1) as r:
        for i in range(5):
            tokens, _ = await collect(await r.client.generate(request(f"ring-{i}", 3)))
            assert len(tokens) == 3
        stream = await r.client.generate(request("ring-abort", FOREVER))
        await next_chunk(stream)
        stream.abort()
        await in_thread(r.sim.wait_abort, "ring-abort", DEADLINE)
        ring, zmq = await wait_until(lambda: _counts(r)[0] >= 7 and _counts(r), "ring counts")
        assert ring == 7 and zmq == 0  # 6 ADDs and one ABORT batch
        assert r.client.metrics()["bad_ring_records"] == 0


async def test_the_adds_of_one_loop_turn_ring_the_doorbell_once() -> None:
    n = 6
    async with rig(1) as r:
        # A round trip first: the I/O process has just had a turn and parks (idle, its poll
        # waits up to a second: nothing but a doorbell wakes it during the turn below).
        tokens, _ = await collect(await r.client.generate(request("turn-warm", 2)))
        assert len(tokens) == 2
        taken, wakeups = _counts(r)[0], r.client.metrics()["ring_wakeups"]
        streams = []
        for i in range(n):  # one loop turn: generate does not yield
            streams.append(await r.client.generate(request(f"turn-{i}", 2)))
            # Still in the turn, a pause in which a doorbell per ADD would have woken the I/O
            # process, had it take the ADD and park again (then the next ADD wakes it again).
            # A busy wait (the loop must not run) that ends early once the ADD was taken.
            end = time.monotonic() + 0.02
            while _counts(r)[0] < taken + i + 1 and time.monotonic() < end:
                pass
        for s in streams:
            tokens, _ = await collect(s)
            assert len(tokens) == 2
        assert engine_rids(r.sim, 0)[1:] == [f"turn-{i}" for i in range(n)]
        assert _counts(r) == (taken + n, 0)
        assert r.client.metrics()["ring_wakeups"] == wakeups + 1, "one doorbell for the turn"


async def test_a_turn_that_publishes_more_than_the_ring_holds_rings_before_it_fills() -> None:
    # 200 ADDs of ~16 KB in one turn of the worker's loop: three times the default ring
    # (1 MiB). The doorbell rings once a quarter of the ring is unannounced, so the I/O process
    # drains while the turn goes on. With a doorbell only at the end of the turn, the parked
    # I/O process would take nothing until the turn ends, and the 65th ADD would be Busy.
    # Whether the I/O process keeps up is the machine's scheduling, not the ring's: so before
    # each ADD the turn waits (a busy wait: the loop must not run) until at most 40 of its ADDs
    # (~640 KB) are untaken, and at the end of the turn (before it ends) the I/O process must
    # have been woken by a doorbell: its idle timer alone would also drain the ring, slowly,
    # but it counts no wake-up.
    prompt = [7] * 16384
    async with rig(1, config={"slots_per_worker": 256}) as r:
        tokens, _ = await collect(await r.client.generate(request("burst-warm", 1)))
        taken = _counts(r)[0]  # the I/O process then parks: only a doorbell wakes it
        wakeups = r.client.metrics()["ring_wakeups"]
        streams = []
        for i in range(200):  # one loop turn: generate does not yield
            end = time.monotonic() + DEADLINE
            while _counts(r)[0] < taken + i - 40:
                assert time.monotonic() < end, f"the I/O process took nothing for {i} ADDs"
            streams.append(await r.client.generate(request(f"burst-{i}", 1, prompt=prompt)))
        assert r.client.metrics()["ring_wakeups"] > wakeups, "no doorbell inside the turn"
        for s in streams:
            tokens, _ = await collect(s)
            assert len(tokens) == 1
        assert _counts(r) == (taken + 200, 0)


async def test_a_prompt_too_large_for_the_ring_goes_over_zmq_and_keeps_the_order() -> None:
    async with rig(1, config={"submit_ring_bytes": SMALL_RING}) as r:
        # Made in one go, without yielding: the big one over ZMQ, the two after it behind it.
        big = await r.client.generate(request("big", 2, prompt=BIG_PROMPT))
        after = [await r.client.generate(request(f"after-{i}", 2)) for i in range(2)]
        for s in (big, *after):
            tokens, _ = await collect(s)
            assert len(tokens) == 2
        assert engine_rids(r.sim, 0) == ["big", "after-0", "after-1"]
        ring, zmq = _counts(r)
        assert zmq >= 1  # the big one (and those made before it was handled)
        # Later ones are back on the ring once the ZMQ submission was handled.
        tokens, _ = await collect(await r.client.generate(request("later", 2)))
        assert len(tokens) == 2
        assert _counts(r)[0] == ring + 1


@pytest.mark.parametrize("prompt", [[1, 2, 3], BIG_PROMPT], ids=["ring", "zmq"])
async def test_an_abort_right_after_its_add_reaches_the_engine_after_it(prompt) -> None:
    async with rig(1, config={"submit_ring_bytes": SMALL_RING}) as r:
        for i in range(3):
            rid = f"quick-{i}"
            stream = await r.client.generate(request(rid, FOREVER, prompt=prompt))
            stream.abort()  # before the I/O process has seen the ADD
            await in_thread(r.sim.wait_abort, rid, DEADLINE)
            assert rid in engine_rids(r.sim, 0)
        # Nothing left running: every slot is free again and the engine holds none of them.
        assert r.client.metrics()["in_flight"] == 0 or await wait_until(
            lambda: r.client.metrics()["in_flight"] == 0, "no request in flight"
        )


async def test_a_full_ring_is_busy_at_once_and_takes_submissions_again() -> None:
    prompt = [40000 + i for i in range(500)]  # ~1.5 KB: two fit a 4 KB ring
    async with rig(1, config={"submit_ring_bytes": SMALL_RING, "slots_per_worker": 64}) as r:
        streams = []
        # The I/O process is stopped, so nothing drains the ring while it fills (it is a
        # process of its own: the worker not yielding would not stop it, and under a slow
        # build it drained part of the ring meanwhile).
        os.kill(r.io.pid, signal.SIGSTOP)
        try:
            with pytest.raises(Busy, match="submission ring"):
                for i in range(64):
                    streams.append(await r.client.generate(request(f"full-{i}", 2, prompt=prompt)))
        finally:
            os.kill(r.io.pid, signal.SIGCONT)
        assert 1 <= len(streams) <= SMALL_RING // 1500  # what fits, and no more
        for s in streams:
            tokens, _ = await collect(s)
            assert len(tokens) == 2
        # Drained: the ring takes new submissions (the slot of the refused one was given back).
        tokens, _ = await collect(await r.client.generate(request("full-after", 2, prompt=prompt)))
        assert len(tokens) == 2


async def test_every_slot_in_use_is_busy_with_the_ring_on() -> None:
    async with rig(1, config={"slots_per_worker": 4}) as r:
        streams = [await r.client.generate(request(f"slot-{i}", FOREVER)) for i in range(4)]
        with pytest.raises(Busy, match="slots"):
            await r.client.generate(request("slot-5", 2))
        for s in streams:
            await next_chunk(s)
            s.abort()
        tokens, _ = await collect(await r.client.generate(request("slot-after", 2)))
        assert len(tokens) == 2


async def test_a_worker_killed_mid_stream_is_replaced_at_its_place_with_a_clean_ring() -> None:
    async with rig(1, config={"max_workers": 2}) as r:
        proc, conn = spawn(hold_main, r.io.address, ["held-0", "held-1"])
        try:
            assert await asyncio.wait_for(asyncio.to_thread(conn.recv), DEADLINE) == "streaming"
            proc.kill()
            await in_thread(r.sim.wait_abort, "held-0", DEADLINE)
        finally:
            reap(proc)
        ring_before = r.client.metrics()["ring_submissions"]
        proc, conn = spawn(streams_main, r.io.address, [("next-0", 3), ("next-1", 4)])
        try:
            status, result = await asyncio.wait_for(asyncio.to_thread(conn.recv), DEADLINE)
        finally:
            reap(proc)
        assert status == "ok", result
        assert result["next-0"][0] and len(result["next-0"][0]) == 3
        assert len(result["next-1"][0]) == 4
        m = r.client.metrics()
        assert m["ring_submissions"] >= ring_before + 2 and m["bad_ring_records"] == 0


async def test_no_ring_keeps_every_submission_on_zmq() -> None:
    async with rig(1, config={"submit_ring_bytes": 0}) as r:
        tokens, _ = await collect(await r.client.generate(request("zmq-only", 3)))
        assert len(tokens) == 3
        assert _counts(r) == (0, 1)
