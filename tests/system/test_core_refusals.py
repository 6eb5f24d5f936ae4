"""Every refusal path of `EngineClient.generate`: a typed error, raised before anything is
sent (the sim's log shows no ADD), and a rid in flight in another worker → `StreamRejected`."""

from __future__ import annotations

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    engine_rids,
    expected_tokens,
    in_thread,
    next_chunk,
    request,
    rig,
    wait_until,
)

from tsfront import (
    Busy,
    ClientClosed,
    DuplicateRequest,
    EngineUnavailable,
    InvalidRequest,
    PromptTooLong,
    RidRecentlyAborted,
    StopStringsRefused,
    StreamRejected,
)
from tsfront.wire import encode_add


async def test_generate_refuses_bad_requests_before_sending_anything():
    async with rig(2, max_model_len=64) as r:
        c = r.client
        with pytest.raises(StopStringsRefused):
            await c.generate(request("stop", 3, sampling_params={"stop": ["\n"]}))
        with pytest.raises(PromptTooLong):
            await c.generate(request("long-prompt", 1, prompt=list(range(3, 100))))
        with pytest.raises(PromptTooLong):
            await c.generate(request("long-output", 100))
        with pytest.raises(EngineUnavailable):
            await c.generate(request("pin-high", 2, pin=2))
        with pytest.raises(EngineUnavailable):
            await c.generate(request("pin-negative", 2, pin=-1))
        with pytest.raises(InvalidRequest):
            await c.generate({"rid": "not-a-request"})
        with pytest.raises(InvalidRequest, match="n"):
            await c.generate(request("two", 2, sampling_params={"n": 2}))
        assert all(x["adds"] == 0 for x in r.sim.counters().values())
        # The client is still usable.
        tokens, _ = await collect(await c.generate(request("fine", 2)))
        assert len(tokens) == 2


async def test_duplicate_in_flight_rid_is_refused_until_it_ends():
    async with rig(1) as r:
        first = await r.client.generate(request("dup", 3))
        with pytest.raises(DuplicateRequest):
            await r.client.generate(request("dup", 2))
        await collect(first)
        # Finished: no longer in flight on this client.
        tokens, _ = await collect(await r.client.generate(request("dup", 2)))
        assert len(tokens) == 2
        assert engine_rids(r.sim, 0) == ["dup", "dup"]


async def test_generate_on_a_closed_client_raises_client_closed():
    async with rig(1) as r:
        other = await r.attach()
        await other.close()
        assert other.closed
        with pytest.raises(ClientClosed):
            await other.generate(request("closed", 2))
        await other.close()  # idempotent


async def test_busy_when_every_slot_of_the_worker_is_in_use():
    async with rig(1, config={"slots_per_worker": 2}) as r:
        held = [await r.client.generate(request(f"slot-{i}", FOREVER)) for i in range(2)]
        with pytest.raises(Busy, match="slots"):
            await r.client.generate(request("third", 2))
        assert "third" not in engine_rids(r.sim, 0)
        # Another worker has its own slots.
        other = await r.attach()
        tokens, _ = await collect(await other.generate(request("elsewhere", 2)))
        assert len(tokens) == 2
        held[0].abort()
        tokens, _ = await collect(await r.client.generate(request("third", 2)))
        assert len(tokens) == 2
        held[1].abort()


async def test_duplicate_rid_across_two_workers_rejects_the_second_stream():
    async with rig(2) as r:
        other = await r.attach()
        first = await r.client.generate(request("shared", FOREVER))
        await next_chunk(first)
        second = await other.generate(request("shared", 5))
        with pytest.raises(StreamRejected) as info:
            await collect(second)
        assert info.value.rid == "shared"
        assert sum(rid == "shared" for e in (0, 1) for rid in engine_rids(r.sim, e)) == 1
        # The first keeps streaming, and the second worker can go on.
        await next_chunk(first)
        first.abort()
        tokens, _ = await collect(await other.generate(request("unique", 3)))
        assert len(tokens) == 3


# ------------------------------------------------------------ reusing an aborted rid
# The engine drops an ADD whose rid it was told to abort in the last 300 s (CONTRACT §4.5), and
# a worker's ABORT can reach the I/O process after its next ADD: a reuse must be refused with
# a reason, never left to hang.


async def test_reusing_a_rid_this_client_just_aborted_raises_rid_recently_aborted():
    async with rig(1) as r:
        first = await r.client.generate(request("again", FOREVER))
        await next_chunk(first)
        first.abort()
        with pytest.raises(RidRecentlyAborted) as info:
            await r.client.generate(request("again", 5))
        assert isinstance(info.value, InvalidRequest) and info.value.field == "rid"
        assert "300 s" in str(info.value) and "fresh rid" in str(info.value)
        # A dropped (garbage-collected) stream counts as aborted too.
        dropped = await r.client.generate(request("dropped", FOREVER))
        await next_chunk(dropped)
        del dropped
        with pytest.raises(RidRecentlyAborted):
            await r.client.generate(request("dropped", 5))
        tokens, _ = await collect(await r.client.generate(request("fresh", 4)))
        assert tokens == expected_tokens("fresh", 4)


async def test_an_add_that_overtakes_the_abort_of_its_rid_ends_with_stream_rejected():
    # What generate refuses, sent anyway (as a second worker, or one past its bounded
    # memory, could): the new ADD reaches the I/O process before the ABORT of the old one,
    # on the same slot. The engine would see add, add, abort, and the stream would hang.
    async with rig(1) as r:
        first = await r.client.generate(request("overtaken", FOREVER, pin=0))
        await next_chunk(first)
        first.abort()
        att = r.client._att
        again = att.submit("overtaken", encode_add(request("overtaken", 5, pin=0)), 0, False)
        with pytest.raises(StreamRejected) as info:
            await collect(again)
        assert "aborted" in str(info.value) and info.value.engine_index == 0
        assert await _metric(r, "reused_rids") == 1
        # Nothing leaked: neither request is counted in flight any more.
        await wait_until(lambda: r.client.metrics()["in_flight"] == 0, "in_flight back to 0")


async def test_a_rid_aborted_on_an_engine_is_refused_there_from_any_worker_and_served_elsewhere():
    async with rig(2) as r:
        other = await r.attach()
        first = await r.client.generate(request("shared-abort", FOREVER, pin=0))
        await next_chunk(first)
        first.abort()
        assert await in_thread(r.sim.engine(0).wait_abort, "shared-abort", DEADLINE)
        with pytest.raises(StreamRejected, match="aborted on engine 0"):
            await collect(await other.generate(request("shared-abort", 5, pin=0)))
        # Engine 1 never saw that rid: it serves it.
        tokens, _ = await collect(await other.generate(request("shared-abort", 5, pin=1)))
        assert tokens == expected_tokens("shared-abort", 5)
        assert engine_rids(r.sim, 0) == ["shared-abort"]


async def _metric(r, name: str) -> int:
    return await wait_until(lambda: r.client.metrics()[name], f"metric {name}")


@pytest.mark.parametrize(
    ("ring", "match", "least"),
    [(0, "submission queue", 8), (65536, "submission ring", 7)],
    ids=["zmq-queue", "ring"],
)
async def test_busy_when_the_local_queue_is_full_and_everything_queued_before_is_served(
    ring, match, least
):
    # The I/O process is stopped (SIGSTOP), so nothing reads the worker's submissions: the
    # DEALER's queue of submit_queue_depth fills (ZMQ's I/O thread may move some on to the
    # kernel's socket buffers first), or without ZMQ the submission ring (64 KiB: 7 ADDs of
    # ~8 KB), and the next generate() raises Busy, handing back the slot it took. Once the
    # I/O process runs again, every submission queued before the refusal is served in full.
    import os
    import signal

    depth = 8
    prompt = list(range(3, 2003))  # ~8 KB per ADD: the kernel buffers fill after a few dozen
    config = {"submit_queue_depth": depth, "submit_ring_bytes": ring}
    async with rig(1, config=config, max_model_len=4096) as r:
        c = r.client
        free_before = len(r.client._att.slots.free)
        os.kill(r.io.pid, signal.SIGSTOP)
        streams = []
        try:
            with pytest.raises(Busy, match=match):
                for i in range(2000):
                    streams.append(await c.generate(request(f"q{i}", 2, prompt=prompt)))
        finally:
            os.kill(r.io.pid, signal.SIGCONT)
        assert least <= len(streams) < 2000
        # The refused request's slot went back; each queued one holds its own.
        assert len(r.client._att.slots.free) == free_before - len(streams)
        for i, stream in enumerate(streams):
            tokens, chunks = await collect(stream, timeout=DEADLINE * 3)
            assert tokens == expected_tokens(f"q{i}", 2)
            assert chunks[-1].finish_reason == "length"
        assert len(r.client._att.slots.free) == free_before
