"""The I/O process's view of each engine: identity, handshake state, sockets, load.

An `Engine` is one attention-DP rank. It moves HANDSHAKING (HELLO seen, INIT sent) → LIVE
(registration received) → DEAD (ENGINE_CORE_DEAD, a lost output connection, a missed
heartbeat or an unreachable input), and back to HANDSHAKING if the same identity says HELLO
again (a restarted rank).

A LIVE engine may also be *stalled* (`Engine.stalled_since` set): it holds requests and has
sent no output frame for ``stall_timeout`` seconds (`stalled_after` is the rule; the I/O loop
applies it about once a second, never per frame). It stays LIVE (its sockets are up, its
streams go on, ABORTs still reach it) and is published as ``ENGINE_STALLED``. The policies do
not place on it while it holds requests (`placeable`); with none left it takes one at a time,
the probe that shows whether it recovered. Any output frame from it clears the stall; so do
its death and a new handshake.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import zmq

from tsfront.aborts import RecentAborts
from tsfront.region import ENGINE_ABSENT, ENGINE_LIVE
from tsfront.wire import EngineRegistration, engine_identity

# Per engine; at 1,000 aborts a second that is 262 s of the engine's 300 s memory. Past it the
# oldest go first, and a reuse of one of those would again be dropped silently by the engine.
ABORTED_RIDS_REMEMBERED = 1 << 18


@dataclass
class PendingSend:
    """A request the engine's input queue did not take yet."""

    slot: int
    ticket: int  # the request's, so a reused slot is never mistaken for it
    payload: zmq.Frame | bytes  # bytes: a disaggregated ADD with its bootstrap fields
    deadline: float  # send_timeout's
    expires: float = 0.0  # the request's own deadline (0: none); never sent after it
    prefill: bool = False  # the prefill half of a disaggregated request


@dataclass
class Engine:
    """One engine (attention-DP rank) as the I/O process tracks it."""

    row: int  # 0-based position: rank under aggregated DP
    index: int  # identity index = first_engine_index + row
    output_address: str = ""
    pull: zmq.Socket | None = None
    monitor: zmq.Socket | None = None
    state: int = ENGINE_ABSENT
    registration: EngineRegistration | None = None
    dead_reason: str = ""
    in_flight: int = 0
    requests_total: int = 0
    # Latest load tail (num_running, num_waiting, kv_active_pages, kv_total_pages), when it
    # arrived, and our in-flight count at that moment (to count what we sent since).
    tail: tuple[int, int, int, int] = (0, 0, 0, 0)
    tail_at: float = 0.0
    in_flight_at_tail: int = 0
    backlog: collections.deque[PendingSend] = field(default_factory=collections.deque)
    aborts: list[str] = field(default_factory=list)
    # Rids (bytes) of every ABORT queued for this engine process in the last 300 s: an ADD
    # reusing one would be dropped by the engine without a word, so it is refused here.
    aborted: RecentAborts = field(default_factory=lambda: RecentAborts(ABORTED_RIDS_REMEMBERED))
    # The connections accepted on this engine's output PULL (its own, and any peer's): fd →
    # the engine generation they were accepted in. The generation grows with each INIT sent
    # (each engine process), so a late disconnect of a predecessor's connection is told apart.
    connections: dict[int, int] = field(default_factory=dict)
    generation: int = 0
    # "aggregated", or under disaggregated serving "prefill" / "decode". A prefill engine has
    # its group's own handshake and input sockets (None: the loop's) and its bootstrap host
    # defaults to the address its handshake connection came from.
    role: str = "aggregated"
    input: zmq.Socket | None = None
    handshake: zmq.Socket | None = None
    input_advertised: str = ""
    peer_host: str = ""
    # Taken over from a previous I/O process (see tsfront.io.adoption): ``adopting`` until its
    # output connection comes back; ``adopted`` for as long as it is the same engine process
    # (its rows for rids we never bound are orphans of the predecessor); ``input_pending``
    # until a send to it succeeds (its input DEALER may reconnect after its output PUSH).
    adopting: bool = False
    adopted: bool = False
    input_pending: bool = False
    # Stall detection: when the engine last sent an output frame, when it last went from no
    # request in flight to one, and since when it is stalled (0.0: it is not); see
    # `stalled_after` and `placeable`.
    output_at: float = 0.0
    busy_since: float = 0.0
    stalled_since: float = 0.0

    @property
    def identity(self) -> bytes:
        """The engine's ZMQ identity: its index as a 2-byte little-endian u16."""
        return engine_identity(self.index)

    @property
    def placeable(self) -> bool:
        """Whether a `LoadBalance` policy may choose this engine: live, and not stalled with
        requests still in flight (a stalled engine holding none takes one: the probe)."""
        return self.state == ENGINE_LIVE and not (self.stalled_since and self.in_flight)

    def tail_fresh(self, ttl: float, now: float | None = None) -> bool:
        """Whether the load tail is recent enough to route on (and carries data)."""
        if self.tail[3] == 0 or self.tail_at == 0.0:
            return False
        return ((now or time.monotonic()) - self.tail_at) <= ttl


def stalled_after(
    in_flight: int, output_at: float, busy_since: float, now: float, timeout: float
) -> bool:
    """The stall rule: an engine with requests in flight whose last output frame, and the
    moment it last became busy, are both at least ``timeout`` seconds before ``now``.

    Measuring from the later of the two means that an engine idle for an hour is not stalled
    the moment it gets a request: it has ``timeout`` seconds to answer it.
    """
    return in_flight > 0 and now - max(output_at, busy_since) >= timeout
