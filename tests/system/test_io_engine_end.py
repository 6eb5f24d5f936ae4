"""An engine's end loses nothing it sent before it.

The ranks here are `RawEngine` s: the test decides exactly which frames arrive, in which order,
and (by holding the worker's event loop, or stopping the I/O process) what is handled together.
"""

from __future__ import annotations

import asyncio

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    in_thread,
    request,
    wait_until,
    wait_until_blocking,
)
from support.raw_engine import RawEngine, raw_rig

from tsfront import EngineDied, IOProcessDied
from tsfront.client.stream import RequestStream
from tsfront.ipc.region import FIN_ENGINE_DEAD, FIN_IO_STOPPING

BURST = [101, 102, 103, 104, 105]


async def _read(stream, timeout: float = DEADLINE) -> tuple[list, BaseException | None]:
    """Every chunk of ``stream`` and the error that ended it (None if it finished)."""
    chunks = []

    async def run() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    try:
        await asyncio.wait_for(run(), timeout)
    except EngineDied as exc:
        return chunks, exc
    return chunks, None


async def test_tokens_sent_right_before_engine_core_dead_are_delivered_then_engine_died():
    # Ten ranks, each killed once: its last frame (5 tokens) and its sentinel reach the worker
    # in one update, because the worker's loop is held until the I/O process handled both.
    async with raw_rig(10) as (_io, engines, client, _ctx):
        for rank, engine in enumerate(engines):
            rid = f"burst-{rank}"
            stream = await client.generate(request(rid, FOREVER, pin=rank))
            add = await in_thread(engine.recv_add)
            assert add.rid == rid
            engine.push(engine.tokens_frame(rid, BURST, len(BURST)))
            engine.push_dead()
            wait_until_blocking(lambda r=rank: client.load()[r].state == "dead", "rank dead")
            chunks, error = await _read(stream)
            assert [t for c in chunks for t in c.output_ids] == BURST, rank
            assert all(c.finish_reason is None for c in chunks)
            assert isinstance(error, EngineDied) and error.engine_index == rank
            assert stream.finished


async def test_tokens_spilled_before_an_engine_death_are_all_delivered_then_engine_died():
    # 40 tokens into an 8-token ring while the worker is held: 32 spill, and the death is
    # published only once they drained, together with the last of them.
    async with raw_rig(1, ring_capacity=8) as (_io, engines, client, _ctx):
        engine = engines[0]
        stream = await client.generate(request("spilled", FOREVER, pin=0))
        assert (await in_thread(engine.recv_add)).rid == "spilled"
        burst = list(range(1000, 1040))
        engine.push(engine.tokens_frame("spilled", burst, len(burst)))
        engine.push_dead()
        wait_until_blocking(lambda: client.load()[0].state == "dead", "rank 0 dead")
        chunks, error = await _read(stream)
        assert [t for c in chunks for t in c.output_ids] == burst
        assert all(c.finish_reason is None for c in chunks)
        assert isinstance(error, EngineDied) and error.engine_index == 0
        assert client.metrics()["spilled_tokens"] >= len(burst) - 8


class _Slots:
    """A stream's `SlotOwner`: a loop, and the slot release it reports."""

    disaggregated = False

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.released: list[int] = []

    def release(self, stream: RequestStream) -> None:
        self.released.append(stream.slot)

    def abort(self, stream: RequestStream, reason: str = "cancelled") -> None:
        raise AssertionError("an ended stream must not abort")

    def dropped(self, stream: RequestStream) -> None:
        raise AssertionError("an ended stream must not abort")


@pytest.mark.parametrize("code", [FIN_ENGINE_DEAD, FIN_IO_STOPPING])
async def test_an_update_with_tokens_and_a_local_end_yields_the_tokens_then_the_error(code):
    att = _Slots()
    stream = RequestStream(att, "r", 3, 1)
    # An earlier update the consumer has not read yet is coalesced with the last tokens.
    stream.deliver((3, [1, 2], None, None, 0, 3, 2, 0, 0))
    stream.deliver((3, BURST, None, None, code, 3, 7, 0, 0))
    assert att.released == [3]
    chunk = await anext(stream)
    assert chunk.output_ids == [1, 2, *BURST]
    assert chunk.finish_reason is None and chunk.completion_tokens == 7
    with pytest.raises(EngineDied if code == FIN_ENGINE_DEAD else IOProcessDied):
        await anext(stream)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_predecessors_late_disconnect_never_kills_the_restarted_engine():
    # Rank 0's first process sends ENGINE_CORE_DEAD but keeps its output connection; a new
    # process registers under the same identity; only then does the old connection go, before
    # the new process connected its own output. That disconnect must not kill the new one.
    async with raw_rig(1) as (io, engines, client, ctx):
        old = engines[0]
        old.input.close(linger=0)  # its input goes first: the identity must be free again
        old.push_dead()
        await wait_until(lambda: client.load()[0].state == "dead", "rank 0 dead")
        new = await in_thread(lambda: RawEngine(ctx, io.handshake_address, 0, connect_output=False))
        engines.append(new)
        await wait_until(lambda: client.load()[0].state == "live", "rank 0 re-registered")
        before = client.metrics()["output_disconnects"]
        old.close_output()
        await wait_until(
            lambda: client.metrics()["output_disconnects"] > before, "the old connection's end"
        )
        assert client.load()[0].state == "live"
        assert client.metrics()["stale_disconnects"] == 1
        new.connect_output()
        stream = await client.generate(request("after-restart", FOREVER, pin=0))
        assert (await in_thread(new.recv_add)).rid == "after-restart"
        new.push(new.tokens_frame("after-restart", [5, 6, 7], 3, "length"))
        tokens, chunks = await collect(stream)
        assert tokens == [5, 6, 7] and chunks[-1].finish_reason == "length"


async def test_an_engine_whose_output_never_connects_is_lost_and_back_when_it_connects():
    # The engine registers and then never dials its output (it died between the two, or INIT's
    # output address does not reach it): it must not stay live, holding a pinned request that
    # can never end, for ever. Within heartbeat_interval + heartbeat_timeout it is lost (its
    # request ends with EngineDied); when its output does connect it is live again.
    async with raw_rig(1, connect_output=False, heartbeat_interval=0.2, heartbeat_timeout=0.3) as (
        _io,
        engines,
        client,
        _ctx,
    ):
        engine = engines[0]
        assert client.load()[0].state == "live"
        stream = await client.generate(request("no-output", FOREVER, pin=0))
        assert (await in_thread(engine.recv_add)).rid == "no-output"
        with pytest.raises(EngineDied):
            await collect(stream)
        assert client.load()[0].state == "dead"
        engine.connect_output()
        await wait_until(lambda: client.load()[0].state == "live", "rank 0 live again")
        stream = await client.generate(request("after-output", FOREVER, pin=0))
        assert (await in_thread(engine.recv_add)).rid == "after-output"
        engine.push(engine.tokens_frame("after-output", [5, 6], 2, "length"))
        tokens, chunks = await collect(stream)
        assert tokens == [5, 6] and chunks[-1].finish_reason == "length"


async def test_frames_still_queued_when_the_engine_disconnects_are_applied_before_its_death():
    # The rank sends a burst of frames (many turns' worth: DRAIN is 256 a turn), the last one
    # finishing the request, and closes its connection at once. The I/O process's ZMQ thread
    # reads all of it long before the loop has applied it, so the loop sees the disconnect
    # with frames still queued: it must apply every one before it declares the rank dead, so
    # the request finishes instead of ending with EngineDied.
    frames_sent = 3000
    async with raw_rig(1) as (_io, engines, client, _ctx):
        engine = engines[0]
        stream = await client.generate(request("last-words", FOREVER, pin=0))
        assert (await in_thread(engine.recv_add)).rid == "last-words"
        frames = [engine.tokens_frame("last-words", [i], i + 1) for i in range(frames_sent - 1)]
        frames.append(engine.tokens_frame("last-words", [frames_sent - 1], frames_sent, "length"))
        engine.push(*frames)
        engine.close_output()  # returns once every frame and the close are on the wire
        tokens, chunks = await collect(stream)
        assert tokens == list(range(frames_sent))
        assert chunks[-1].finish_reason == "length"
        await wait_until(lambda: client.load()[0].state == "dead", "rank 0 dead")
        assert client.metrics()["in_flight"] == 0
