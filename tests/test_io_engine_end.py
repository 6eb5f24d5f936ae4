"""An engine's end loses nothing it sent before it.

The ranks here are `RawEngine` s: the test decides exactly which frames arrive, in which order,
and (by holding the worker's event loop, or stopping the I/O process) what is handled together.
"""

from __future__ import annotations

import asyncio

import pytest
from core_fixtures import DEADLINE, FOREVER, in_thread, request, wait_until_blocking
from raw_engine import raw_rig

from tsfront import EngineDied, IOProcessDied
from tsfront.region import FIN_ENGINE_DEAD, FIN_IO_STOPPING
from tsfront.stream import RequestStream

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


class _Attachment:
    """What a stream needs of its worker: a loop, and the slot release it reports."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.released: list[int] = []

    def _release(self, stream: RequestStream) -> None:
        self.released.append(stream._slot)

    def _abort(self, stream: RequestStream) -> None:
        raise AssertionError("an ended stream must not abort")


@pytest.mark.parametrize("code", [FIN_ENGINE_DEAD, FIN_IO_STOPPING])
async def test_an_update_with_tokens_and_a_local_end_yields_the_tokens_then_the_error(code):
    att = _Attachment()
    stream = RequestStream(att, "r", 3, 1)
    # An earlier update the consumer has not read yet is coalesced with the last tokens.
    stream._deliver((3, [1, 2], None, None, 0, 3, 2, 0, 0))
    stream._deliver((3, BURST, None, None, code, 3, 7, 0, 0))
    assert att.released == [3]
    chunk = await anext(stream)
    assert chunk.output_ids == [1, 2, *BURST]
    assert chunk.finish_reason is None and chunk.completion_tokens == 7
    with pytest.raises(EngineDied if code == FIN_ENGINE_DEAD else IOProcessDied):
        await anext(stream)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
