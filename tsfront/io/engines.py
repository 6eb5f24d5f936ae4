"""The I/O process's view of each engine: identity, lifecycle, load (its sockets are the
shell's, `tsfront.io.loop`).

An `Engine` is one attention-DP rank. Its lifecycle is `EngineState`, and every move of it is
one entry of `TRANSITIONS` (state, `EngineEvent`) → state; `Engine.apply` is the only way to
change it, and a pair the table does not hold is a bug (`InvalidTransition`). The table:

* ABSENT --HELLO--> HANDSHAKING (INIT sent) --REGISTERED--> LIVE;
* ABSENT --LOADED--> ADOPTING: a registration taken over from a predecessor I/O process
  (`tsfront.io.adoption`), --RECONNECTED--> LIVE when its output connection comes back;
* LIVE --OUTPUT_LOST--> LOST: the last connection of its output port went (an exit, a crash, a
  missed heartbeat, a network drop), or none came within ``heartbeat_interval +
  heartbeat_timeout`` of its registration (it died between the two, or INIT's output address
  does not reach us from the engine; `Engine.output_due`). LOST *may come back*: if the same
  process (re)connects (RECONNECTED) it is LIVE again with its registration, since ZMQ redials
  both its PUSH and its DEALER by itself and nothing it was told is lost;
* LIVE --INPUT_UNREACHABLE--> DEAD, and any state --CORE_DEAD--> DEAD (it sent
  ENGINE_CORE_DEAD), and ABSENT / ADOPTING --EXPIRED--> DEAD (not back within
  ``handshake_timeout``): DEAD *never* comes back by a reconnect. An unreachable input means
  its DEALER is gone from our ROUTER: an output connection coming back says nothing of the
  input, and an engine that cannot be sent requests is no use until it handshakes again; a
  process that said ENGINE_CORE_DEAD is over; one that did not come back in time had its
  registration dropped;
* any state but LIVE --HELLO--> HANDSHAKING: a (re)started engine process. (A HELLO while
  LIVE is deferred by the I/O core until the old connection is known lost.)

`published` maps each state to the engine table's word (`tsfront.ipc.codes`): ADOPTING is
published HANDSHAKING, LOST is published DEAD.

A LIVE engine may also be *stalled*: it holds requests and has sent no output frame for
``stall_timeout`` seconds (`stalled_after` is the rule; the I/O core applies it about once a
second, never per frame). A stall is a condition of a LIVE engine, not a state of its
connection: it stays LIVE (its sockets are up, ABORTs still reach it) and is published as
``ENGINE_STALLED``. Its moves are a second table, `STALL_TRANSITIONS` ((`Stall`,
`StallEvent`) → `Stall`; `Engine.stall_move` is the only way to change it):

* STEPPING --SILENT--> STALLED: the stall rule fired. Nothing is placed on it any more (nor
  pinned to it); the I/O process sends it a *probe* of its own (`tsfront.io.probes`), since a
  client's request must never be what tests a stuck rank;
* STALLED --EXPIRED--> ABANDONED: ``stall_fail_timeout`` passed since it was marked: its
  requests end with `EngineStalled` and are aborted on it (so a stall has a deadline, and
  ABANDONED has none: nothing of a client's is left on it);
* STALLED / ABANDONED --OUTPUT--> STEPPING: any output frame (the probe's or a request's):
  placed on again, its probe aborted if still out;
* any --DOWN--> STEPPING: it left LIVE (a death, a lost connection) or said HELLO: the
  condition goes with the process it was of.

An engine taken over from a predecessor is *inherited* for as long as it is that same process
(no INIT sent to it since): its rows for rids this I/O process never bound are the
predecessor's orphans. Until a first send to it succeeds, its input DEALER may still be
reconnecting (`input_pending`): an unreachable input then queues the request instead of
killing the engine.
"""

from __future__ import annotations

import collections
import enum
import time
from dataclasses import dataclass, field
from functools import cached_property

import zmq

from tsfront.ipc.aborts import RecentAborts
from tsfront.ipc.codes import (
    ENGINE_ABSENT,
    ENGINE_DEAD,
    ENGINE_HANDSHAKING,
    ENGINE_LIVE,
    ENGINE_STALLED,
)
from tsfront.wire import EngineRegistration, engine_identity

# Per engine; at 1,000 aborts a second that is 262 s of the engine's 300 s memory. Past it the
# oldest go first, and a reuse of one of those would again be dropped silently by the engine.
ABORTED_RIDS_REMEMBERED = 1 << 18

# An engine's role: of the one group, or of one of disaggregated serving's two.
AGGREGATED = "aggregated"
PREFILL = "prefill"
DECODE = "decode"


class EngineState(enum.Enum):
    """Where an engine is in its lifecycle (see the module's table)."""

    ABSENT = "absent"
    HANDSHAKING = "handshaking"
    ADOPTING = "adopting"
    LIVE = "live"
    LOST = "lost"
    DEAD = "dead"

    @property
    def published(self) -> int:
        """The engine table's state word for this state (a stall is published on top)."""
        # By the member's identity (each is a singleton): an Enum's hash is a Python call.
        return _PUBLISHED_BY_ID[id(self)]


class EngineEvent(enum.Enum):
    """What can happen to an engine."""

    HELLO = "hello"  # it said HELLO and was sent INIT
    REGISTERED = "registered"  # its registration arrived on the input socket
    LOADED = "loaded"  # a predecessor's saved registration of it was loaded
    RECONNECTED = "reconnected"  # its output connection came (back)
    OUTPUT_LOST = "output lost"  # the last connection of its output port went
    INPUT_UNREACHABLE = "input unreachable"  # our ROUTER has no route to its DEALER
    CORE_DEAD = "core dead"  # it sent ENGINE_CORE_DEAD
    EXPIRED = "expired"  # handshake_timeout passed and it is not back


S, E = EngineState, EngineEvent
#: The whole lifecycle: (state, event) → next state. A pair not here cannot happen.
TRANSITIONS: dict[tuple[EngineState, EngineEvent], EngineState] = {
    (S.ABSENT, E.HELLO): S.HANDSHAKING,
    (S.ABSENT, E.LOADED): S.ADOPTING,
    (S.ABSENT, E.CORE_DEAD): S.DEAD,
    (S.ABSENT, E.EXPIRED): S.DEAD,
    (S.HANDSHAKING, E.HELLO): S.HANDSHAKING,
    (S.HANDSHAKING, E.REGISTERED): S.LIVE,
    (S.HANDSHAKING, E.CORE_DEAD): S.DEAD,
    (S.ADOPTING, E.HELLO): S.HANDSHAKING,
    (S.ADOPTING, E.RECONNECTED): S.LIVE,
    (S.ADOPTING, E.CORE_DEAD): S.DEAD,
    (S.ADOPTING, E.EXPIRED): S.DEAD,
    (S.LIVE, E.OUTPUT_LOST): S.LOST,
    (S.LIVE, E.INPUT_UNREACHABLE): S.DEAD,
    (S.LIVE, E.CORE_DEAD): S.DEAD,
    (S.LOST, E.HELLO): S.HANDSHAKING,
    (S.LOST, E.RECONNECTED): S.LIVE,
    (S.DEAD, E.HELLO): S.HANDSHAKING,
}
del S, E

#: The states an engine is dead in (its requests ended; it takes none).
DOWN = frozenset({EngineState.LOST, EngineState.DEAD})

_PUBLISHED = {
    EngineState.ABSENT: ENGINE_ABSENT,
    EngineState.HANDSHAKING: ENGINE_HANDSHAKING,
    EngineState.ADOPTING: ENGINE_HANDSHAKING,
    EngineState.LIVE: ENGINE_LIVE,
    EngineState.LOST: ENGINE_DEAD,
    EngineState.DEAD: ENGINE_DEAD,
}
_PUBLISHED_BY_ID = {id(state): word for state, word in _PUBLISHED.items()}


class Stall(enum.Enum):
    """Whether a LIVE engine steps (see the module's second table)."""

    STEPPING = "stepping"  # it sends output (or holds nothing): placed on
    STALLED = "stalled"  # silent with requests for stall_timeout: probed, its requests kept
    ABANDONED = "abandoned"  # stalled past stall_fail_timeout: its requests failed; probed


class StallEvent(enum.Enum):
    """What can happen to a LIVE engine's stepping."""

    SILENT = "silent"  # the stall rule: requests in flight, no output for stall_timeout
    EXPIRED = "expired"  # stall_fail_timeout passed since it was marked stalled
    OUTPUT = "output"  # an output frame came from it
    DOWN = "down"  # it left LIVE, or a new process said HELLO


T, V = Stall, StallEvent
#: Every move of the stall condition: (stall, event) → stall. A pair not here cannot happen.
STALL_TRANSITIONS: dict[tuple[Stall, StallEvent], Stall] = {
    (T.STEPPING, V.SILENT): T.STALLED,
    (T.STEPPING, V.DOWN): T.STEPPING,
    (T.STALLED, V.EXPIRED): T.ABANDONED,
    (T.STALLED, V.OUTPUT): T.STEPPING,
    (T.STALLED, V.DOWN): T.STEPPING,
    (T.ABANDONED, V.OUTPUT): T.STEPPING,
    (T.ABANDONED, V.DOWN): T.STEPPING,
}
del T, V

STEPPING = Stall.STEPPING  # a module global: read per engine on the placement path


@dataclass
class Probe:
    """The one request of its own the I/O process has out on a stalled engine: its rid
    (``tsfront.io.probes``: never bound to a slot, so its rows reach no worker), when it was
    sent, and under disaggregated serving its prefill half (engine and bootstrap room)."""

    rid: bytes
    sent_at: float
    prefill: Engine | None = None
    room: int = 0


class InvalidTransition(Exception):
    """An event that the engine's state does not allow (a bug of the caller)."""


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
    state: EngineState = EngineState.ABSENT
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
    # The connections accepted on this engine's output port (its own, and any peer's): number →
    # the engine generation they were accepted in. The generation grows with each INIT sent
    # (each engine process), so a late disconnect of a predecessor's connection is told apart.
    connections: dict[int, int] = field(default_factory=dict)
    generation: int = 0
    # When a registered engine's output must have connected by (0.0: not waiting for it). The
    # engine dials its output PUSH right after its registration (CONTRACT §1.2 steps 6-7); one
    # that never does (it died in between, or INIT's output address does not reach us) would
    # otherwise stay LIVE with nothing to lose, so the core declares it lost at this time.
    output_due: float = 0.0
    # AGGREGATED, or under disaggregated serving PREFILL / DECODE; its group's number (0: the
    # serving group, 1: the prefill group; `tsfront.io.core.EngineGroup`). A prefill engine's
    # bootstrap host defaults to the address its handshake connection came from.
    role: str = "aggregated"
    group: int = 0
    peer_host: str = ""
    # Taken over from a previous I/O process (see tsfront.io.adoption): ``inherited`` while it
    # is that same engine process (set by LOADED, cleared by the next HELLO); ``input_pending``
    # until a send to it succeeds (its input DEALER may reconnect after its output PUSH).
    inherited: bool = False
    input_pending: bool = False
    # Stall detection: when the engine last sent an output frame, when it last went from no
    # request in flight to one, its stall condition (`STALL_TRANSITIONS`), since when it is
    # not STEPPING (0.0 while it is), and the probe it has out; see `stalled_after`.
    output_at: float = 0.0
    busy_since: float = 0.0
    stall: Stall = Stall.STEPPING
    stalled_since: float = 0.0
    probe: Probe | None = None

    @property
    def output_connected(self) -> bool:
        """Whether a connection of this engine process (its generation) is on its output port."""
        return self.generation in self.connections.values()

    def can(self, event: EngineEvent) -> bool:
        """Whether ``event`` is a move of the engine's current state."""
        return (self.state, event) in TRANSITIONS

    def apply(self, event: EngineEvent) -> EngineState:
        """Move along the table; the new state. Raises `InvalidTransition` for a pair the
        table does not hold."""
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise InvalidTransition(
                f"engine {self.index}: {event.value} while {self.state.value}"
            ) from None
        if event is EngineEvent.LOADED:
            self.inherited = self.input_pending = True
        elif event is EngineEvent.HELLO:
            self.inherited = self.input_pending = False  # a new process
        if self.state is not EngineState.LIVE:
            self.stall_move(StallEvent.DOWN)  # a stall is a condition of a live engine only
        return self.state

    def stall_move(self, event: StallEvent, now: float = 0.0) -> Stall:
        """Move the stall condition along `STALL_TRANSITIONS` (``now``: when, for SILENT);
        the new condition. Raises `InvalidTransition` for a pair the table does not hold.
        Back to STEPPING, the probe is forgotten here: the caller aborts it first."""
        try:
            self.stall = STALL_TRANSITIONS[(self.stall, event)]
        except KeyError:
            raise InvalidTransition(
                f"engine {self.index}: {event.value} while {self.stall.value}"
            ) from None
        if event is StallEvent.SILENT:
            self.stalled_since = now
        elif self.stall is Stall.STEPPING:
            self.stalled_since = 0.0
            self.probe = None
        return self.stall

    @property
    def live(self) -> bool:
        """Whether it is LIVE (serving; possibly stalled)."""
        return self.state is EngineState.LIVE

    @property
    def published_state(self) -> int:
        """The engine table's state word: its state's, or ENGINE_STALLED for a stalled live
        engine."""
        if self.stall is not STEPPING and self.state is EngineState.LIVE:
            return ENGINE_STALLED
        return self.state.published

    @cached_property
    def identity(self) -> bytes:
        """The engine's ZMQ identity: its index as a 2-byte little-endian u16 (made once: it
        is the first frame of every send to the engine)."""
        return engine_identity(self.index)

    @property
    def placeable(self) -> bool:
        """Whether a client's request may go to this engine: live and not stalled (a stalled
        engine takes only the I/O process's own probe)."""
        return self.state is EngineState.LIVE and self.stall is STEPPING

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
