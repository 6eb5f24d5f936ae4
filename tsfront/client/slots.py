"""`SlotTable`: the lifetime of one worker's slots, from a submission to the slot's reuse.

A worker has ``slots_per_worker`` slots in the shared region (the I/O process writes them,
the worker's native `Reader` reads them). The table owns what says which request holds which
slot: the free list, the open streams by slot and by rid, the tickets (each use of a slot has
its own, so a late write for the previous request is never read as the next one's), the
deadline heap with its one loop timer, and the batch of aborts sent once per loop iteration.
A `RequestStream` reaches it only through `tsfront.client.stream.SlotOwner` (`release`, `abort`,
`dropped`); the `Attachment` (tsfront.client.attachment) gives it the reader, the recorder and a way
to send the abort batch once it is attached, and asks it for slots.
"""

from __future__ import annotations

import asyncio
import heapq
import time
import weakref
from collections.abc import Callable
from typing import Any

from tsfront.client.stream import RequestStream
from tsfront.errors import StreamError
from tsfront.ipc.aborts import RecentAborts
from tsfront.ipc.submit import ABORT_ENTRY, TICKET_SHIFT
from tsfront.metrics.recorder import Recorder

__all__ = ["ABORTED_RIDS_REMEMBERED", "DEADLINES_COMPACT_AT", "SlotTable"]

# Rids this worker aborted that it still refuses to reuse (within the engine's 300 s memory).
# Past this many, the oldest are forgotten; the I/O process's per-engine memory still
# catches a reuse of those.
ABORTED_RIDS_REMEMBERED = 1 << 16
# Deadline heap size from which entries of ended streams are compacted away.
DEADLINES_COMPACT_AT = 64
# Seconds before a batch of aborts the submission queue refused is offered again.
ABORT_RETRY_S = 0.001


class SlotTable:
    """One worker's slots: who holds each, until the slot is free again.

    Attributes:
        loop: the event loop the streams wait on and the timers run in.
        refs: the open streams by local slot, as a list of weak references (None: free; weak:
            a stream its owner dropped is collected, and `dropped` aborts it). The drain's
            lookup per update is a list index and a reference call.
        slot_of: the open streams' local slots by rid (`stream_of` gives the stream). A plain
            dict, emptied by `release` and `dropped`: no weak-value dictionary, whose entries
            cost a Python-level keyed reference each, per request.
        free: the free local slots (the last one is taken next).
        aborted: the rids this worker aborted recently (`RecentAborts`).
        disaggregated: whether the group serves prefill and decode apart (for the errors'
            wording).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.refs: list[weakref.ref[RequestStream] | None] = []
        self.slot_of: dict[str, int] = {}
        self.free: list[int] = []
        self.aborted = RecentAborts(ABORTED_RIDS_REMEMBERED)
        self.disaggregated = False
        self.closed = False
        self._reader: Any = None  # the worker's _native.Reader, once attached
        self._recorder: Recorder | None = None
        self._send_aborts: Callable[[bytes], bool] | None = None
        self._ticket_base = 0
        self._next_ticket = 1
        self._aborts: list[bytes] = []
        self._abort_scheduled = False
        # Deadlines of the streams that have one: a heap of (monotonic time, ticket, stream
        # reference) and one loop timer for the earliest, never one timer per stream or token.
        # Entries of streams that ended stay until their time comes (popped unread).
        self._deadlines: list[tuple[float, int, weakref.ref[RequestStream]]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0

    def attach(
        self,
        reader: Any,
        recorder: Recorder | None,
        size: int,
        ticket_base: int,
        send_aborts: Callable[[bytes], bool],
        *,
        disaggregated: bool,
    ) -> None:
        """Start serving ``size`` slots read by ``reader``; tickets come from the attach's
        own range (`tsfront.ipc.submit.ticket_base`). ``send_aborts(batch)`` sends packed
        abort entries, False when the submission queue is full (then retried)."""
        self._reader = reader
        self._recorder = recorder
        self._send_aborts = send_aborts
        self._ticket_base = ticket_base
        self._next_ticket = ticket_base + 1
        self.free = list(range(size - 1, -1, -1))
        self.refs = [None] * size
        self.disaggregated = disaggregated

    # ------------------------------------------------------------------ open streams

    @property
    def streams(self) -> dict[int, RequestStream]:
        """The open streams by local slot (a new dict: for the ends and for tools, not per
        request)."""
        return {slot: stream for slot, stream in enumerate(self._live()) if stream is not None}

    def stream_of(self, rid: str) -> RequestStream | None:
        """The open stream of ``rid``, or None."""
        slot = self.slot_of.get(rid)
        return None if slot is None else self._at(slot)

    def _at(self, slot: int) -> RequestStream | None:
        ref = self.refs[slot]
        return None if ref is None else ref()

    def _live(self) -> list[RequestStream | None]:
        return [None if ref is None else ref() for ref in self.refs]

    # ------------------------------------------------------------------ taking a slot

    def take(self) -> tuple[int, int] | None:
        """A free slot and the ticket of its next use, expected by the reader from now on;
        None when every slot is held."""
        if not self.free:
            return None
        slot = self.free.pop()
        ticket = self._next_ticket
        self._next_ticket += 1
        if self._next_ticket - self._ticket_base == 1 << TICKET_SHIFT:
            # 2^40 requests later, reuse the range: a slot holds one request at a time, so a
            # reused ticket never meets its namesake on the same slot.
            self._next_ticket = self._ticket_base + 1
        self._reader.expect(slot, ticket)
        return slot, ticket

    def put_back(self, slot: int) -> None:
        """Free a slot `take` gave whose submission was never sent."""
        self._reader.release(slot)
        self.free.append(slot)

    def open(
        self, rid: str, slot: int, ticket: int, expires: float, deadline: float | None
    ) -> RequestStream:
        """The stream of the request just sent in ``slot``; ``expires`` (monotonic time) is
        when its ``deadline`` (seconds, None: none) passes."""
        stream = RequestStream(self, rid, slot, ticket, deadline)
        self.refs[slot] = weakref.ref(stream)
        self.slot_of[rid] = slot
        if deadline is not None:
            self._add_deadline(expires, stream)
        return stream

    # ------------------------------------------------------------------ SlotOwner

    def release(self, stream: RequestStream) -> None:
        """The stream saw its end in the slot: the slot is free to reuse."""
        slot = stream.slot
        ref = self.refs[slot]
        if ref is not None and ref() is stream:
            if self.slot_of.get(stream.rid) == slot:  # (a reused rid maps to its newest)
                del self.slot_of[stream.rid]
            self.refs[slot] = None
            if self._reader is not None:
                self._reader.release(slot)
            self.free.append(slot)

    def abort(self, stream: RequestStream, reason: str = "cancelled") -> None:
        """End the open ``stream`` early: abort its request on the engine (in this loop
        iteration's batch), free its slot, record it as ``reason``."""
        if self._at(stream.slot) is not stream:
            return
        self.aborted.add(stream.rid, time.monotonic())
        self._aborts.append(ABORT_ENTRY.pack(stream.slot, stream.ticket))
        if self._recorder is not None:
            self._recorder.cancelled(stream.slot, reason)
        self.release(stream)
        self._schedule_aborts()

    def dropped(self, stream: RequestStream) -> None:
        """An unfinished stream was garbage-collected: abort it and free its slot."""
        # A collected reference cycle clears weak references before finalizers run, so its
        # reference may be dead already: the slot is still its own (only `release` frees a
        # slot), so abort by what the stream knows.
        current = self._at(stream.slot)
        if current is stream:
            self.abort(stream)
            return
        if current is not None or self.closed:
            return
        if self.slot_of.get(stream.rid) == stream.slot:
            del self.slot_of[stream.rid]
        self.aborted.add(stream.rid, time.monotonic())
        self._aborts.append(ABORT_ENTRY.pack(stream.slot, stream.ticket))
        if self._recorder is not None:
            self._recorder.cancelled(stream.slot)
        if self._reader is not None:
            self._reader.release(stream.slot)
        self.refs[stream.slot] = None
        self.free.append(stream.slot)
        self._schedule_aborts()

    # ------------------------------------------------------------------ aborts

    def _schedule_aborts(self) -> None:
        if not self._abort_scheduled and not self.closed:
            self._abort_scheduled = True
            self.loop.call_soon(self._flush_aborts)

    def _flush_aborts(self) -> None:
        # One ABORT message per loop iteration carries every stream aborted in it.
        self._abort_scheduled = False
        if not self._aborts or self._send_aborts is None:
            return
        if not self._send_aborts(b"".join(self._aborts)):
            self._abort_scheduled = True
            self.loop.call_later(ABORT_RETRY_S, self._flush_aborts)
            return
        self._aborts.clear()

    # ------------------------------------------------------------------ deadlines

    def _add_deadline(self, expires: float, stream: RequestStream) -> None:
        heap = self._deadlines
        if len(heap) >= DEADLINES_COMPACT_AT and len(heap) > 2 * len(self.slot_of):
            # Most entries belong to streams that ended: drop them now rather than when their
            # time comes, so the heap stays within twice the open streams (amortised O(1)).
            heap[:] = [e for e in heap if (s := e[2]()) is not None and not s.finished]
            heapq.heapify(heap)
        heapq.heappush(heap, (expires, stream.ticket, weakref.ref(stream)))
        if self._deadline_timer is None or expires < self._deadline_at:
            self._arm_deadline_timer(expires)

    def _arm_deadline_timer(self, expires: float) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = expires
        # The loop's clock may not be time.monotonic (uvloop's is its own): convert.
        delay = max(0.0, expires - time.monotonic())
        self._deadline_timer = self.loop.call_at(self.loop.time() + delay, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        heap = self._deadlines
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, ticket, ref = heapq.heappop(heap)
            stream = ref()
            if stream is not None and stream.ticket == ticket and self._at(stream.slot) is stream:
                stream.expire()
        if heap and not self.closed:
            self._arm_deadline_timer(heap[0][0])

    # ------------------------------------------------------------------ the end

    def fail_all(self, error: Callable[[RequestStream], StreamError], reason: StreamError) -> int:
        """End every open stream with ``error(stream)`` (the I/O process is gone: nothing to
        abort), recorded as ``reason``; how many there were."""
        open_streams = [stream for stream in self._live() if stream is not None]
        for stream in open_streams:
            stream.fail(error(stream))
            if self._recorder is not None:
                self._recorder.failed(stream.slot, reason)
        return len(open_streams)

    def close(self) -> bytes:
        """End every open stream (the client was closed) and stop the timers; the abort
        entries still to send, this batch's and the open streams' (idempotent: b"" after the
        first call)."""
        if self.closed:
            return b""
        self.closed = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines.clear()
        for stream in [stream for stream in self._live() if stream is not None]:
            self._aborts.append(ABORT_ENTRY.pack(stream.slot, stream.ticket))
            stream.fail(
                StreamError(f"request {stream.rid!r}: the client was closed", rid=stream.rid)
            )
            if self._recorder is not None:
                self._recorder.closed(stream.slot)
        batch = b"".join(self._aborts)
        self._aborts.clear()
        self._reader = None
        self._recorder = None
        self._send_aborts = None
        return batch
