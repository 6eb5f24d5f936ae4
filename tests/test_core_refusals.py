"""Every refusal path of `EngineClient.generate`: a typed error, raised before anything is
sent (the sim's log shows no ADD), and a rid in flight in another worker → `StreamRejected`."""

from __future__ import annotations

import pytest
from core_fixtures import FOREVER, collect, engine_rids, next_chunk, request, rig

from tsfront import (
    Busy,
    ClientClosed,
    DuplicateRequest,
    EngineUnavailable,
    InvalidRequest,
    PromptTooLong,
    StopStringsRefused,
    StreamRejected,
)


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
