"""The worker's slot table (`tsfront.client.slots.SlotTable`) through its public methods.

A real event loop, a recording stand-in for the native reader (`expect` / `release`) and a
recording sender for the abort batches: every slot in use, a full submission queue, a stream
garbage-collected unfinished, the client closed with streams open. The same table under real
processes is exercised by test_core_abort.py, test_deadlines.py and
test_stress_full_occupancy.py.
"""

from __future__ import annotations

import gc
import time

import pytest
from support.core_fixtures import wait_until

from tsfront.client.slots import SlotTable
from tsfront.errors import StreamError
from tsfront.ipc.codes import FIN_LENGTH
from tsfront.ipc.submit import ABORT_ENTRY

SLOTS = 4
TICKET_BASE = 7 << 40


class Reader:
    """What the table asks of the native reader, recorded."""

    def __init__(self) -> None:
        self.expected: dict[int, int] = {}
        self.released: list[int] = []

    def expect(self, slot: int, ticket: int) -> None:
        self.expected[slot] = ticket

    def release(self, slot: int) -> None:
        self.released.append(slot)


class Sender:
    """The submission queue: refuses the first ``refuse`` batches (full), records the rest."""

    def __init__(self, refuse: int = 0) -> None:
        self.refuse = refuse
        self.batches: list[list[tuple[int, int]]] = []

    def __call__(self, batch: bytes) -> bool:
        if self.refuse:
            self.refuse -= 1
            return False
        size = ABORT_ENTRY.size
        self.batches.append([ABORT_ENTRY.unpack_from(batch, i) for i in range(0, len(batch), size)])
        return True


def table(refuse: int = 0) -> tuple[SlotTable, Reader, Sender]:
    import asyncio

    slots = SlotTable(asyncio.get_running_loop())
    reader, sender = Reader(), Sender(refuse)
    slots.attach(reader, None, SLOTS, TICKET_BASE, sender, disaggregated=False)
    return slots, reader, sender


def fill(slots: SlotTable) -> list:
    streams = []
    while (taken := slots.take()) is not None:
        slot, ticket = taken
        streams.append(slots.open(f"r{slot}", slot, ticket, 0.0, None))
    return streams


async def test_every_slot_in_use_then_each_freed_once_for_a_fresh_ticket() -> None:
    slots, reader, _ = table()
    streams = fill(slots)
    assert len(streams) == SLOTS and slots.take() is None and not slots.free
    tickets = [s.ticket for s in streams]
    assert len(set(tickets)) == SLOTS and all(t > TICKET_BASE for t in tickets)
    assert reader.expected == {s.slot: s.ticket for s in streams}
    assert set(slots.slot_of) == {s.rid for s in streams}
    assert all(slots.stream_of(s.rid) is s for s in streams)
    # The stream saw its end: the slot goes back, once, however often it is reported.
    first = streams[0]
    slots.release(first)
    slots.release(first)
    assert reader.released == [first.slot] and slots.free == [first.slot]
    assert first.rid not in slots.slot_of and slots.stream_of(first.rid) is None
    slot, ticket = slots.take() or (None, None)
    assert slot == first.slot and ticket not in tickets
    # A slot whose submission never went out comes back too.
    slots.put_back(slot)
    assert slots.free == [slot] and reader.released == [first.slot, slot]


async def test_aborts_of_one_loop_iteration_go_in_one_batch() -> None:
    slots, _, sender = table()
    streams = fill(slots)
    for stream in streams[:3]:
        stream.abort()
    assert sender.batches == []  # batched: sent from the loop, not per abort
    await wait_until(lambda: sender.batches, "the abort batch")
    assert sender.batches == [[(s.slot, s.ticket) for s in streams[:3]]]
    assert sorted(slots.free) == sorted(s.slot for s in streams[:3])
    now = time.monotonic()
    assert all(slots.aborted.age(s.rid, now) is not None for s in streams[:3])
    assert slots.aborted.age(streams[3].rid, now) is None


async def test_a_full_submission_queue_delays_the_batch_and_loses_no_abort() -> None:
    slots, _, sender = table(refuse=3)
    streams = fill(slots)
    streams[0].abort()
    streams[1].abort()
    await wait_until(lambda: sender.batches, "the abort batch once the queue takes it")
    assert sender.refuse == 0
    assert sender.batches == [[(s.slot, s.ticket) for s in streams[:2]]]


async def test_a_stream_dropped_unfinished_is_aborted_and_frees_its_slot() -> None:
    slots, reader, sender = table()
    taken = slots.take()
    assert taken is not None
    slot, ticket = taken
    slots.open("dropped", slot, ticket, 0.0, None)  # nobody keeps it
    gc.collect()
    await wait_until(lambda: sender.batches, "the dropped stream's abort")
    assert sender.batches == [[(slot, ticket)]]
    assert slots.free.count(slot) == 1 and reader.released == [slot]
    assert slots.aborted.age("dropped", time.monotonic()) is not None


async def test_close_ends_every_open_stream_and_returns_their_aborts() -> None:
    slots, _, sender = table()
    streams = fill(slots)
    streams[0].abort()  # in this iteration's batch, not sent yet
    batch = slots.close()
    entries = [ABORT_ENTRY.unpack_from(batch, i) for i in range(0, len(batch), ABORT_ENTRY.size)]
    assert entries == [(s.slot, s.ticket) for s in streams]
    for stream in streams[1:]:
        with pytest.raises(StreamError, match="the client was closed"):
            await anext(stream)
    assert slots.close() == b"" and not slots.streams
    assert sender.batches == []  # the closing batch is the caller's to send


async def test_take_ready_hands_over_the_unread_chunks_and_the_end_still_comes() -> None:
    slots, _, _ = table()
    stream = fill(slots)[0]
    assert stream.take_ready() == []
    # Two updates of plain tokens (coalesced into one unread chunk), then the finish.
    stream.deliver((0, [5, 6], None, None, 0, 0, 0, 0, 0))
    stream.deliver((0, [7], None, None, 0, 0, 0, 0, 0))
    ready = stream.take_ready()
    assert [c.output_ids for c in ready] == [[5, 6, 7]]
    assert stream.take_ready() == []
    stream.deliver((0, [8], None, None, FIN_LENGTH, 3, 4, 0, 0))
    chunks = [chunk async for chunk in stream]
    assert [c.output_ids for c in chunks] == [[8]] and chunks[-1].finish_reason == "length"


async def test_a_stream_collected_in_a_cycle_leaves_no_rid_behind() -> None:
    """A reference cycle is collected with its weak references cleared before the stream's
    finalizer runs: the rid is forgotten all the same, and a new request may use it."""
    slots, reader, sender = table()
    taken = slots.take()
    assert taken is not None
    slot, ticket = taken
    stream = slots.open("cycle", slot, ticket, 0.0, None)
    holder: list = [stream]
    holder.append(holder)  # the stream lives only in a cycle now
    del stream, holder
    gc.collect()
    await wait_until(lambda: sender.batches, "the collected stream's abort")
    assert sender.batches == [[(slot, ticket)]]
    assert "cycle" not in slots.slot_of and slots.stream_of("cycle") is None
    assert slots.free.count(slot) == 1 and reader.released == [slot] and not slots.streams


async def test_a_rid_open_twice_maps_to_its_newest_until_that_ends() -> None:
    """The table itself does not refuse a rid in flight (`EngineClient` does): ending the
    older stream leaves the newer one found by its rid."""
    slots, _, _ = table()
    old = slots.open("same", *(slots.take() or (0, 0)), 0.0, None)
    new = slots.open("same", *(slots.take() or (0, 0)), 0.0, None)
    assert slots.stream_of("same") is new
    slots.release(old)
    assert slots.stream_of("same") is new and slots.streams == {new.slot: new}
    slots.release(new)
    assert slots.stream_of("same") is None and not slots.slot_of
