"""Streams: each gets exactly its tokens, in order, across worker processes; a stream ends
exactly once; an engine's refusal is a finished chunk; a slow reader loses nothing."""

from __future__ import annotations

import asyncio
import struct

import pytest
from support.core_fixtures import (
    DEADLINE,
    collect,
    expected_tokens,
    in_thread,
    next_chunk,
    reap,
    request,
    rig,
    spawn,
    streams_main,
    wait_until_blocking,
)

from tsfront import StreamRejected
from tsfront.sim import default_logprob


async def test_many_concurrent_streams_across_worker_processes_get_exactly_their_tokens():
    async with rig(3) as r:
        jobs = {w: [(f"w{w}-r{i}", 5 + (7 * i + w) % 40) for i in range(30)] for w in range(3)}
        spawned = [spawn(streams_main, r.io.address, jobs[w]) for w in range(3)]
        try:
            # Streams of this process run alongside the workers'.
            local = [await r.client.generate(request(f"main-{i}", 20)) for i in range(10)]
            results = await asyncio.gather(*(collect(s) for s in local))
            for s, (tokens, chunks) in zip(local, results):
                assert tokens == expected_tokens(s.rid, 20)
                assert [c.completion_tokens for c in chunks][-1] == 20
            for w, (_proc, conn) in enumerate(spawned):
                assert await in_thread(conn.poll, 3 * DEADLINE), f"worker {w} never reported"
                status, got = conn.recv()
                assert status == "ok", got
                assert set(got) == {rid for rid, _ in jobs[w]}
                for rid, n in jobs[w]:
                    tokens, finish, completion, nchunks = got[rid]
                    assert tokens == expected_tokens(rid, n), rid
                    assert (finish, completion) == ("length", n)
                    assert nchunks <= n
        finally:
            for proc, conn in spawned:
                reap(proc)
                conn.close()
        # The load was spread: every rank served some of the 100 requests.
        assert all(c["adds"] > 0 for c in r.sim.counters().values())
        assert sum(c["adds"] for c in r.sim.counters().values()) == 100


async def test_chunks_carry_cumulative_counts_and_logprobs():
    async with rig(1) as r:
        stream = await r.client.generate(request("lp", 6, return_logprob=True))
        tokens, chunks = await collect(stream)
        assert tokens == expected_tokens("lp", 6)
        # Chunks may coalesce steps (a reader behind), but counts always match the deltas.
        cumulative = [sum(len(c.output_ids) for c in chunks[: k + 1]) for k in range(len(chunks))]
        assert [c.completion_tokens for c in chunks] == cumulative
        assert all(c.prompt_tokens == 3 for c in chunks)
        vals = [v for c in chunks for v in c.output_token_logprobs_val]
        idx = [v for c in chunks for v in c.output_token_logprobs_idx]
        assert idx == tokens
        assert vals == [default_logprob(t) for t in tokens]  # exact in float32
        assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
        assert stream.engine_index == 0


async def test_stream_ends_exactly_once_after_the_finished_chunk():
    async with rig(1) as r:
        stream = await r.client.generate(request("once", 3))
        _, chunks = await collect(stream)
        assert chunks[-1].finished and sum(c.finished for c in chunks) == 1
        assert stream.finished
        for _ in range(2):
            with pytest.raises(StopAsyncIteration):
                await anext(stream)
        assert [c async for c in stream] == []


async def test_stream_error_is_raised_once_then_the_stream_is_over():
    async with rig(1) as r:
        other = await r.attach()
        first = await r.client.generate(request("twice-rid", 200))
        await next_chunk(first)
        second = await other.generate(request("twice-rid", 5))
        with pytest.raises(StreamRejected) as info:
            await next_chunk(second)
        assert info.value.rid == "twice-rid"
        for _ in range(2):
            with pytest.raises(StopAsyncIteration):
                await anext(second)
        # The first request is untouched by its namesake.
        tokens, _ = await collect(first)
        assert tokens[-1] == expected_tokens("twice-rid", 200)[-1]


async def test_engine_rejected_request_ends_with_an_abort_chunk():
    # The rank runs without --enable-output-logprobs: return_logprob is allowed by
    # validate_request (it cannot know) and refused by the engine with a terminal "abort".
    async with rig(1, enable_output_logprobs=False) as r:
        stream = await r.client.generate(request("refused", 5, return_logprob=True))
        tokens, chunks = await collect(stream)
        assert tokens == []
        assert [c.finish_reason for c in chunks] == ["abort"]
        assert chunks[0].engine_index == 0
        assert r.sim.counters()[0]["rejected"] == 1


def _slot_spilled(client, stream) -> int:
    # White-box: the slot header's `spilled` counter (u64 at byte 48, docs/DESIGN.md).
    att = client._att
    layout = att.region.layout
    slot = att.worker * att.spw + stream.slot
    off = layout["slots_off"] + slot * layout["slot_bytes"] + 48
    return struct.unpack_from("<Q", att.region.map, off)[0]


async def test_unread_stream_keeps_every_token_while_other_streams_flow():
    async with rig(1, config={"ring_capacity": 8}) as r:
        idle = await r.client.generate(request("unread", 60))
        busy = await r.client.generate(request("read", 30))
        tokens, _ = await collect(busy)  # flows while "unread" piles up
        assert tokens == expected_tokens("read", 30)
        tokens, chunks = await collect(idle)
        assert tokens == expected_tokens("unread", 60)
        assert chunks[-1].finish_reason == "length"


async def test_stalled_worker_loses_no_tokens_through_the_spill_path():
    # The worker's loop is blocked while the engine produces 60 tokens into 8-token rings: the
    # I/O process must spill, then flush in order as the worker drains.
    async with rig(1, config={"ring_capacity": 8}) as r:
        a = await r.client.generate(request("spill-a", 60))
        b = await r.client.generate(request("spill-b", 45))
        await in_thread(r.sim.wait_request, "spill-b", DEADLINE)
        engine = r.sim.engine(0)
        wait_until_blocking(lambda: engine.counters()["finished"] == 2, "both to finish")
        (ta, ca), (tb, cb) = await asyncio.gather(collect(a), collect(b))
        assert ta == expected_tokens("spill-a", 60)
        assert tb == expected_tokens("spill-b", 45)
        assert (ca[-1].finish_reason, ca[-1].completion_tokens) == ("length", 60)
        assert (cb[-1].finish_reason, cb[-1].completion_tokens) == ("length", 45)
        assert _slot_spilled(r.client, a) > 0
        assert _slot_spilled(r.client, b) > 0
        # The worker keeps serving afterwards.
        tokens, _ = await collect(await r.client.generate(request("after-spill", 20)))
        assert tokens == expected_tokens("after-spill", 20)


async def test_non_streaming_request_delivers_every_token():
    async with rig(1) as r:
        tokens, chunks = await collect(await r.client.generate(request("batch", 120, stream=False)))
        assert tokens == expected_tokens("batch", 120)
        assert len(chunks) < 10  # the engine emits at 1, every 50, and the end
