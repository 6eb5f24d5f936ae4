"""Disaggregated prefill/decode in the I/O process (`Routing.disaggregated`).

The decode group is the core's serving group (`tsfront.io.core.EngineGroup` 0: the stream
comes from it, pins name its ranks); the prefill group is group 1, its rows after the decode
engines, its sockets bound by the shell as every group's are. This class adds, per request:

* a unique 63-bit ``bootstrap_room``; the prefill engine is the one TokenSpeed requires,
  ``first_engine_index + room % num_engines`` of the prefill group (CONTRACT §6: the decode
  engine pulls the KV cache from that rank), the room adjusted to a live rank's residue;
* the same ADD to both engines, its bootstrap fields (nil placeholders the worker encoded at
  a known offset) filled in: the prefill engine's bootstrap host (configured, else the
  address its handshake connection came from) and port (configured, else nil: the engine's
  own ``--disaggregation-bootstrap-port``);
* the prefill engine's output never reaches a slot: its frames are decoded here, not by the
  native writer, and its one terminal row is consumed (``abort`` ends the stream with
  `PrefillFailed`); the decode engine's frames take the usual native path, unchanged.

A failure on either side ends the stream with a code naming the side and aborts the other
side; an abort goes to both. The probe of a stalled decode engine (`tsfront.io.probes`) is a
pair too, since a decode engine serves only a request with a room: its prefill half goes to
a live prefill engine with a room of its own, its rows there are not ours (consumed like an
aborted request's), and superseding the probe aborts both halves.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, cast

import msgspec

from tsfront._native import Record
from tsfront.errors import WireDecodeError
from tsfront.io.core import SENT, EngineGroup, IOCore
from tsfront.io.engines import DECODE, PREFILL, Engine, EngineEvent, Probe
from tsfront.ipc.codes import (
    FIN_PREFILL_ABORTED,
    FIN_PREFILL_DEAD,
    FIN_PREFILL_SEND_TIMEOUT,
    FIN_RID_ABORTED,
    FIN_SEND_TIMEOUT,
)
from tsfront.wire import ENGINE_DEAD, BatchTokenIDOutSlim, decode_output
from tsfront.wire.request import BOOTSTRAP_PLACEHOLDER

if TYPE_CHECKING:
    import zmq

    from tsfront.config import EngineGroup as GroupConfig

ROOM_BITS = 63

_pack = msgspec.msgpack.Encoder().encode


def fill_bootstrap(payload: bytes, at: int, host: str, port: int | None, room: int) -> bytes:
    """The ADD ``payload`` with its three nil bootstrap fields at byte ``at`` filled in.

    Raises `WireDecodeError` if the placeholders are not there (a worker that did not encode
    the request for disaggregated serving).
    """
    end = at + len(BOOTSTRAP_PLACEHOLDER)
    if at <= 0 or payload[at:end] != BOOTSTRAP_PLACEHOLDER:
        raise WireDecodeError(f"no bootstrap placeholders at byte {at} of the ADD")
    return b"".join((payload[:at], _pack(host), _pack(port), _pack(room), payload[end:]))


class Disaggregated:
    """The prefill group of one I/O core, and every request's prefill half; it uses only the
    core's public methods (the core calls it back through `tsfront.io.core.PrefillHalf`)."""

    def __init__(self, core: IOCore, group: EngineGroup) -> None:
        self.core = core
        self.spec = cast("GroupConfig", group.spec)  # a prefill group is an EngineGroup's
        self.prefill = group.engines
        # (prefill row, rid) → slot, while the prefill engine holds the request.
        self.pending: dict[tuple[int, bytes], int] = {}
        self.rooms: set[int] = set()  # rooms of the requests in flight

    # ------------------------------------------------------------------ requests

    def add(
        self, record: Record, slot: int, payload: zmq.Frame | bytes, at: int, expires: float
    ) -> bytes | None:
        """Send the prefill half of a request the core bound to ``slot`` (decode engine
        chosen); the payload for the decode engine, or None if the request already ended."""
        core = self.core
        prefill = self._choose()
        if prefill is None:
            core.fail(slot, FIN_PREFILL_DEAD, -1)
            return None
        engine, room = prefill
        if engine.aborted and engine.aborted.age(record.rid, time.monotonic()) is not None:
            # The prefill engine would drop it silently (an ABORT of this rid is fresh).
            core.count("reused_rids")
            core.fail(slot, FIN_RID_ABORTED, engine.index)
            return None
        host = self.spec.bootstrap_host or engine.peer_host or _host(self.spec.handshake_address)
        try:
            raw = payload if isinstance(payload, bytes) else payload.bytes
            filled = fill_bootstrap(raw, at, host, self.spec.bootstrap_port, room)
        except WireDecodeError as exc:
            core.ports.warn("bad-submit", "dropped a disaggregated submission: %s", exc)
            core.fail(slot, FIN_PREFILL_ABORTED, engine.index)
            return None
        record.prefill = engine
        record.room = room
        self.rooms.add(room)
        self.pending[(engine.row, record.rid)] = slot
        engine.in_flight += 1
        engine.requests_total += 1
        core.dirty.add(engine.row)
        core.send_add(engine, slot, record, filled, expires, prefill=True)
        if core.records.get(slot) is not record:
            return None  # the prefill engine was found unreachable: the request ended
        return filled

    def probe(self, probe: Probe, payload: bytes, at: int) -> bytes | None:
        """Send the prefill half of a probe of a stalled decode engine (``payload`` with nil
        bootstrap fields at byte ``at``); the decode half's payload, or None if no prefill
        engine took it (the next stall check tries again)."""
        chosen = self._choose()
        if chosen is None:
            return None
        engine, room = chosen
        host = self.spec.bootstrap_host or engine.peer_host or _host(self.spec.handshake_address)
        filled = fill_bootstrap(payload, at, host, self.spec.bootstrap_port, room)
        if self.core.ports.send_add(engine, filled) != SENT:
            return None  # a full or unreachable prefill input: its own requests find out
        probe.prefill, probe.room = engine, room
        self.rooms.add(room)
        return filled

    def forget_probe(self, probe: Probe) -> None:
        """The probe was answered or superseded: its prefill half is aborted, its room free."""
        if probe.prefill is None:
            return
        self.rooms.discard(probe.room)
        self.core.queue_abort(probe.prefill, probe.rid)
        probe.prefill = None

    def _choose(self) -> tuple[Engine, int] | None:
        # The room decides the prefill rank (TokenSpeed's rule); a room whose rank is down is
        # moved to a live rank's residue, so placement is uniform over the live ranks.
        n = len(self.prefill)
        live = [e.row - self.prefill[0].row for e in self.prefill if e.live]
        if not live:
            return None
        while True:
            room = secrets.randbits(ROOM_BITS)
            rank = room % n
            if not self.prefill[rank].live:
                rank = live[room % len(live)]
                room = room - room % n + rank
                if room >> ROOM_BITS:
                    room -= n
            if room not in self.rooms:
                return self.prefill[rank], room

    def forget(self, record: Record, *, abort: bool) -> None:
        """The request ended (or went): release its prefill half, aborting it if sent."""
        self.rooms.discard(record.room)
        engine = cast("Engine", record.prefill)  # the core calls this only for a prefill half
        if self.pending.pop((engine.row, record.rid), None) is None:
            return  # the prefill engine finished its part already
        engine.in_flight -= 1
        self.core.dirty.add(engine.row)
        if abort and record.prefill_sent:
            self.core.queue_abort(engine, record.rid)

    def fail_code(self, code: int) -> int:
        """The code a failure of a prefill send ends the stream with."""
        return FIN_PREFILL_SEND_TIMEOUT if code == FIN_SEND_TIMEOUT else code

    def kill(self, engine: Engine) -> None:
        """A prefill engine died: every request it held ends with a prefill-side death."""
        core = self.core
        for key in [k for k in self.pending if k[0] == engine.row]:
            slot = self.pending.pop(key)
            record = core.records.get(slot)
            if record is None or record.prefill is not engine:
                continue
            if record.prefill_sent:
                core.queue_abort(engine, record.rid)
            engine.in_flight -= 1
            core.fail(slot, FIN_PREFILL_DEAD, engine.index)

    # ------------------------------------------------------------------ prefill output

    def on_frame(self, engine: Engine, frame: bytes) -> bool:
        """One frame of a prefill engine's output port: its terminal rows are consumed, never
        shown; False if the engine is dead (ENGINE_CORE_DEAD), so the drain applies nothing
        more of it.
        Raises `WireDecodeError` on a bad frame."""
        batch = decode_output(frame)
        if batch is ENGINE_DEAD:
            self.core.kill(engine, EngineEvent.CORE_DEAD, "sent ENGINE_CORE_DEAD")
            return False
        self._apply(engine, cast(BatchTokenIDOutSlim, batch))  # not ENGINE_DEAD
        return True

    def _apply(self, engine: Engine, batch: BatchTokenIDOutSlim) -> None:
        core = self.core
        core.dirty.add(engine.row)
        tail = (batch.num_running, batch.num_waiting, batch.kv_active_pages, batch.kv_total_pages)
        if tail[3] and min(tail) >= 0 and not max(tail) >> 32:
            engine.tail = tail
            engine.tail_at = time.monotonic()
            engine.in_flight_at_tail = engine.in_flight
        for rid, reason in zip(batch.rids, batch.finished_reasons, strict=True):
            if not reason:
                continue  # a prefill engine does not stream; nothing of it is shown
            slot = self.pending.pop((engine.row, rid.encode()), None)
            if slot is None:
                continue  # aborted, or not ours
            engine.in_flight -= 1
            record = core.records.get(slot)
            if record is None or record.prefill is not engine:
                continue
            if reason == "abort":
                # The prefill engine refused it or its KV transfer failed: the decode side
                # would wait for a cache that never comes.
                core.fail(slot, FIN_PREFILL_ABORTED, engine.index)


def _host(address: str) -> str:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host if host not in ("*", "0.0.0.0", "") else "127.0.0.1"


__all__ = ["DECODE", "PREFILL", "Disaggregated", "fill_bootstrap"]
