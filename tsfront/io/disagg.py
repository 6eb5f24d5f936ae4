"""Disaggregated prefill/decode in the I/O process (`Routing.disaggregated`).

The decode group is the loop's own engine group (its handshake, input and output sockets;
the stream comes from it, pins name its ranks). This module adds the prefill group: its own
handshake and input ROUTERs (its output PULLs are bound with the others, rows after the
decode engines), and, per request:

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
side; an abort goes to both.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, cast

import msgspec
import zmq

from tsfront.errors import WireDecodeError
from tsfront.io.addresses import advertised, bind_socket
from tsfront.io.engines import EngineEvent
from tsfront.region import (
    FIN_PREFILL_ABORTED,
    FIN_PREFILL_DEAD,
    FIN_PREFILL_SEND_TIMEOUT,
    FIN_RID_ABORTED,
    FIN_SEND_TIMEOUT,
)
from tsfront.wire import ENGINE_DEAD, BatchTokenIDOutSlim, decode_output
from tsfront.wire.request import BOOTSTRAP_PLACEHOLDER

if TYPE_CHECKING:
    from tsfront.config import EngineGroup
    from tsfront.io.engines import Engine
    from tsfront.io.loop import IOLoop, Record

PREFILL = "prefill"
DECODE = "decode"
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
    """The prefill group of one I/O loop, and every request's prefill half."""

    def __init__(self, loop: IOLoop, prefill: list[Engine]) -> None:
        self.loop = loop
        # The loop makes a Disaggregated only when its routing has a prefill group.
        self.group = cast("EngineGroup", loop.config.routing.prefill)
        self.prefill = prefill
        self.by_identity = {e.identity: e for e in prefill}
        # (prefill row, rid) → slot, while the prefill engine holds the request.
        self.pending: dict[tuple[int, bytes], int] = {}
        self.rooms: set[int] = set()  # rooms of the requests in flight
        self.handshake: zmq.Socket | None = None
        self.input: zmq.Socket | None = None

    # ------------------------------------------------------------------ sockets

    def bind(self) -> dict:
        """Bind the prefill group's handshake and input ROUTERs; their real addresses."""
        loop, g, c = self.loop, self.group, self.loop.config
        self.handshake = loop._socket(zmq.ROUTER)
        self.handshake.setsockopt(zmq.MAXMSGSIZE, c.max_message_size)
        handshake = bind_socket(self.handshake, g.handshake_address)
        self.input = loop._socket(zmq.ROUTER)
        self.input.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.input.setsockopt(zmq.MAXMSGSIZE, c.max_message_size)
        self.input.setsockopt(zmq.SNDHWM, c.engine_queue_depth)
        self.input.setsockopt(zmq.LINGER, 200)
        input_address = advertised(bind_socket(self.input, g.input_address), g.handshake_address)
        for e in self.prefill:
            e.input = self.input
            e.handshake = self.handshake
            e.input_advertised = input_address
        return {
            "handshake_address": handshake,
            "input_address": input_address,
            "output_addresses": [e.output_address for e in self.prefill],
        }

    def register(self, poller: zmq.Poller) -> None:
        """Poll the prefill group's handshake and input sockets."""
        poller.register(self.handshake, zmq.POLLIN)
        poller.register(self.input, zmq.POLLIN)

    def on_socket(self, sock: zmq.Socket) -> bool:
        """Handle a readable prefill handshake or input socket; False if it is neither."""
        if sock is self.handshake:
            self.loop._on_handshake(self.handshake, self.by_identity)
        elif sock is self.input:
            self.loop._on_input(self.input, self.by_identity)
        else:
            return False
        return True

    # ------------------------------------------------------------------ requests

    def add(
        self, record: Record, slot: int, payload: zmq.Frame, at: int, expires: float
    ) -> bytes | None:
        """Send the prefill half of a request the loop bound to ``slot`` (decode engine
        chosen); the payload for the decode engine, or None if the request already ended."""
        loop = self.loop
        prefill = self._choose()
        if prefill is None:
            loop._fail(slot, FIN_PREFILL_DEAD, -1)
            return None
        engine, room = prefill
        if engine.aborted and engine.aborted.age(record.rid, time.monotonic()) is not None:
            # The prefill engine would drop it silently (an ABORT of this rid is fresh).
            loop._count("reused_rids")
            loop._fail(slot, FIN_RID_ABORTED, engine.index)
            return None
        host = self.group.bootstrap_host or engine.peer_host or _host(self.group.handshake_address)
        try:
            filled = fill_bootstrap(payload.bytes, at, host, self.group.bootstrap_port, room)
        except WireDecodeError as exc:
            loop.warn("bad-submit", "dropped a disaggregated submission: %s", exc)
            loop._fail(slot, FIN_PREFILL_ABORTED, engine.index)
            return None
        record.prefill = engine
        record.room = room
        self.rooms.add(room)
        self.pending[(engine.row, record.rid)] = slot
        engine.in_flight += 1
        engine.requests_total += 1
        loop.dirty.add(engine.row)
        loop._send_add(engine, slot, record, filled, expires, prefill=True)
        if loop.records.get(slot) is not record:
            return None  # the prefill engine was found unreachable: the request ended
        return filled

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
        engine = cast("Engine", record.prefill)  # the loop calls this only for a prefill half
        if self.pending.pop((engine.row, record.rid), None) is None:
            return  # the prefill engine finished its part already
        engine.in_flight -= 1
        self.loop.dirty.add(engine.row)
        if abort and record.prefill_sent:
            self.loop._queue_abort(engine, record.rid)

    def fail_code(self, code: int) -> int:
        """The code a failure of a prefill send ends the stream with."""
        return FIN_PREFILL_SEND_TIMEOUT if code == FIN_SEND_TIMEOUT else code

    def kill(self, engine: Engine) -> None:
        """A prefill engine died: every request it held ends with a prefill-side death."""
        loop = self.loop
        for key in [k for k in self.pending if k[0] == engine.row]:
            slot = self.pending.pop(key)
            record = loop.records.get(slot)
            if record is None or record.prefill is not engine:
                continue
            if record.prefill_sent:
                loop._queue_abort(engine, record.rid)
            engine.in_flight -= 1
            loop._fail(slot, FIN_PREFILL_DEAD, engine.index)

    # ------------------------------------------------------------------ prefill output

    def on_output(self, engine: Engine, limit: int) -> None:
        """Drain a prefill engine's PULL: its terminal rows are consumed, never shown."""
        loop = self.loop
        for _ in range(limit):
            try:
                frame = cast(zmq.Socket, engine.pull).recv(zmq.NOBLOCK)  # bound in bind()
            except zmq.Again:
                return
            try:
                batch = decode_output(frame)
                if batch is ENGINE_DEAD:
                    loop._kill(engine, EngineEvent.CORE_DEAD, "sent ENGINE_CORE_DEAD")
                    return
                self._apply(engine, cast(BatchTokenIDOutSlim, batch))  # not ENGINE_DEAD
            except WireDecodeError as exc:
                loop.warn("bad-output", "engine %d: dropped an output frame: %s", engine.index, exc)
            except Exception as exc:
                loop._handler_failed(f"prefill engine {engine.index}: output frame", exc)

    def _apply(self, engine: Engine, batch: BatchTokenIDOutSlim) -> None:
        loop = self.loop
        loop.dirty.add(engine.row)
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
            record = loop.records.get(slot)
            if record is None or record.prefill is not engine:
                continue
            if reason == "abort":
                # The prefill engine refused it or its KV transfer failed: the decode side
                # would wait for a cache that never comes.
                loop._fail(slot, FIN_PREFILL_ABORTED, engine.index)


def _host(address: str) -> str:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host if host not in ("*", "0.0.0.0", "") else "127.0.0.1"


__all__ = ["DECODE", "PREFILL", "Disaggregated", "fill_bootstrap"]
