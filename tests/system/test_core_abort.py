"""Every way of ending a stream early aborts the request on its engine and frees its slot.

Leaving the ``async for`` loop, `RequestStream.abort`, `EngineClient.abort`, cancelling the
reading task, ``async with`` and dropping the stream object: each must reach the engine (the
sim's ``wait_abort``) and give the slot back (a one-slot worker can submit again).
"""

from __future__ import annotations

import asyncio
import gc

import pytest
from support.core_fixtures import DEADLINE, FOREVER, collect, in_thread, next_chunk, request, rig


async def _started(r, rid: str):
    stream = await r.client.generate(request(rid, FOREVER))
    await next_chunk(stream)
    return stream


async def _slot_is_free_again(r) -> None:
    # slots_per_worker=1: a new request is accepted only once the aborted one freed its slot.
    tokens, _ = await collect(await r.client.generate(request("after", 3)))
    assert len(tokens) == 3


async def test_leaving_the_async_for_loop_early_aborts_at_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await r.client.generate(request("leave", FOREVER))
        seen = 0
        async for _chunk in stream:
            seen += 1
            if seen == 2:
                break
        await in_thread(r.sim.wait_abort, "leave", DEADLINE)
        assert stream.finished
        await _slot_is_free_again(r)


async def test_stream_abort_reaches_the_engine_and_ends_the_stream():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await _started(r, "explicit")
        stream.abort()
        stream.abort()  # idempotent
        await in_thread(r.sim.wait_abort, "explicit", DEADLINE)
        # Whatever was already delivered may still be read; then the stream just ends.
        await collect(stream)
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        assert r.sim.engine(0).aborts() == ["explicit"]
        await _slot_is_free_again(r)


async def test_client_abort_by_rid_reaches_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await _started(r, "by-rid")
        assert r.client.abort("by-rid") is True
        assert r.client.abort("by-rid") is False  # no longer in flight
        assert r.client.abort("never-sent") is False
        await in_thread(r.sim.wait_abort, "by-rid", DEADLINE)
        assert stream.finished
        await _slot_is_free_again(r)


async def test_cancelling_the_reading_task_aborts_at_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await r.client.generate(request("cancelled", FOREVER))
        first = asyncio.Event()

        async def read() -> None:
            async for _chunk in stream:
                first.set()

        task = asyncio.create_task(read())
        await asyncio.wait_for(first.wait(), DEADLINE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await in_thread(r.sim.wait_abort, "cancelled", DEADLINE)
        await _slot_is_free_again(r)


async def test_cancelling_a_bare_anext_aborts_at_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await _started(r, "anext-cancelled")
        await collect_available(stream)
        task = asyncio.create_task(anext(stream))
        await asyncio.sleep(0)  # let it start waiting
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await in_thread(r.sim.wait_abort, "anext-cancelled", DEADLINE)


async def collect_available(stream) -> None:
    """Read whatever chunks are already delivered, without waiting for more."""
    while stream._pending:
        await anext(stream)


async def test_async_with_exit_aborts_at_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        async with await r.client.generate(request("scoped", FOREVER)) as stream:
            await next_chunk(stream)
        await in_thread(r.sim.wait_abort, "scoped", DEADLINE)
        await _slot_is_free_again(r)


async def test_dropping_the_stream_object_aborts_at_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await _started(r, "dropped")
        del stream
        gc.collect()
        await in_thread(r.sim.wait_abort, "dropped", DEADLINE)
        await _slot_is_free_again(r)


async def test_dropping_an_unread_stream_aborts_at_the_engine():
    async with rig(1, config={"slots_per_worker": 1}) as r:
        await r.client.generate(request("never-read", FOREVER))  # result discarded
        await in_thread(r.sim.wait_request, "never-read", DEADLINE)
        gc.collect()
        await in_thread(r.sim.wait_abort, "never-read", DEADLINE)
        await _slot_is_free_again(r)


async def test_many_aborts_in_one_loop_turn_reach_the_engine():
    async with rig(1) as r:
        streams = [await r.client.generate(request(f"batch-{i}", FOREVER)) for i in range(20)]
        for s in streams:
            await next_chunk(s)
        for s in streams:
            s.abort()
        for i in range(20):
            await in_thread(r.sim.wait_abort, f"batch-{i}", DEADLINE)
        assert sorted(r.sim.engine(0).aborts()) == sorted(f"batch-{i}" for i in range(20))


async def test_a_finished_stream_sends_no_abort():
    async with rig(1) as r:
        stream = await r.client.generate(request("complete", 3))
        await collect(stream)
        stream.abort()
        del stream
        gc.collect()
        # A later request's round trip orders after any abort the worker could have sent.
        await collect(await r.client.generate(request("later", 2)))
        assert r.sim.engine(0).aborts() == []


async def test_dropping_a_stream_held_only_by_a_reference_cycle_aborts_at_the_engine():
    # The cycle collector clears weak references before it runs finalizers.
    async with rig(1, config={"slots_per_worker": 1}) as r:
        stream = await _started(r, "in-a-cycle")
        box: list = [stream]
        box.append(box)
        del stream, box
        gc.collect()
        await in_thread(r.sim.wait_abort, "in-a-cycle", DEADLINE)
        await _slot_is_free_again(r)
