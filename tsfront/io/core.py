"""The I/O process's state machine, without sockets: requests in flight, engines, groups.

`IOCore` is to the I/O process what `tsfront.sim.scheduler` is to a simulated rank (and h11
to HTTP): it holds every account (the records of the requests in flight, each `Engine` of each
`EngineGroup`, the attached workers) and moves them on public events: `on_output` (one frame
the native writer ingested), `on_add` / `on_abort` (a worker's submission), `on_hello` /
`on_registration` (the handshake), `on_connection` (an output port's connections), `on_attach` /
`on_detach` (a worker's control connection) and `end_of_turn`. Everything it sends goes
through its `Ports` (a typed protocol of plain method calls: the ADD path allocates nothing
for it); the shell, `tsfront.io.loop`, owns the sockets, the poller, the drain limits and the
error boundary, and implements `Ports` on zmq. The native writer (slot binding, ends, engine
table) is shared memory, not a socket: the core calls it directly, except ``ingest``, which the
shell calls on each frame it receives and hands the result here.

Adoption (`tsfront.io.adoption`) and the prefill group of disaggregated serving
(`tsfront.io.disagg`) are classes that use only this module's public names; the core calls
them through the `Adopter` and `PrefillHalf` protocols, so neither imports the other.
"""

from __future__ import annotations

import collections
import logging
import struct
import sys
import time
from typing import TYPE_CHECKING, Protocol

from zmq import EVENT_ACCEPTED, EVENT_DISCONNECTED

from tsfront._native import Record
from tsfront.errors import WireDecodeError
from tsfront.io.engines import (
    AGGREGATED,
    DECODE,
    PREFILL,
    STEPPING,
    Engine,
    EngineEvent,
    EngineState,
    PendingSend,
    Probe,
    Stall,
    StallEvent,
    stalled_after,
)
from tsfront.io.probes import probe_add, probe_rid
from tsfront.io.routing import Router
from tsfront.ipc.codes import (
    E_IN_FLIGHT,
    E_INDEX,
    E_KV_ACTIVE,
    E_KV_TOTAL,
    E_LOAD_MS_HI,
    E_LOAD_MS_LO,
    E_REQUESTS_HI,
    E_REQUESTS_LO,
    E_RUNNING,
    E_STATE,
    E_WAITING,
    ENGINE_WORDS,
    FIN_DEADLINE,
    FIN_DUPLICATE,
    FIN_ENGINE_DEAD,
    FIN_ENGINE_STALLED,
    FIN_IO_STOPPING,
    FIN_NO_ENGINE,
    FIN_RID_ABORTED,
    FIN_SEND_TIMEOUT,
)
from tsfront.ipc.control import EngineEntry, Engines, EngineUpdate, Failed, ToWorker
from tsfront.ipc.region import IO_METRICS
from tsfront.ipc.submit import (
    ABORT_ENTRY,
    SUBMIT_HEADER,
    WORKER_IDENTITY,
    next_serial,
    ticket_of_attach,
)
from tsfront.wire import decode_ready_message, decode_registration, encode_abort, encode_init

if TYPE_CHECKING:
    import zmq

    from tsfront._native import IngestResult, Writer
    from tsfront.config import ClientConfig
    from tsfront.config import EngineGroup as GroupConfig
    from tsfront.io.state import StateDir
    from tsfront.ipc.region import Region
    from tsfront.metrics.recorder import IOStats

log = logging.getLogger("tsfront.io")

# Seconds between two applications of the stall rule (at most; a quarter of stall_timeout if
# that is shorter), so that a stall is seen within stall_timeout + this.
STALL_CHECK_S = 1.0

# Frames applied from an output port whose engine connection was just lost, before declaring it dead
# (the shell's drain limit is 256 a turn).
LOST_DRAIN = 64 * 256

# What `Ports.send_add` says of one ADD.
SENT, FULL, UNREACHABLE = 0, 1, 2

U32_MAX = 0xFFFFFFFF

# An engine-table row's first eleven words, E_STATE .. E_REQUESTS_HI, in index order, packed in
# one call on a little-endian host (the table is little-endian; elsewhere the words go through
# numpy). Packed into private memory, then copied in: pack_into zeroes its target first, and a
# worker reading the shared row in between would see the engine ABSENT. The copy (memcpy, the
# row 4-byte aligned) writes each word whole, as numpy's stores did.
_ROW_ORDER = (
    E_STATE,
    E_INDEX,
    E_IN_FLIGHT,
    E_RUNNING,
    E_WAITING,
    E_KV_ACTIVE,
    E_KV_TOTAL,
    E_LOAD_MS_LO,
    E_LOAD_MS_HI,
    E_REQUESTS_LO,
    E_REQUESTS_HI,
)
if tuple(range(len(_ROW_ORDER))) != _ROW_ORDER:  # pragma: no cover - a layout edit's guard
    raise ImportError("engine-table words E_STATE .. E_REQUESTS_HI are no longer 0 .. 10")
_ROW_WORDS = struct.Struct(f"@{len(_ROW_ORDER)}I") if sys.byteorder == "little" else None


#: Each I/O counter's word in the region's ``io_metrics``.
_COUNT_WORD = {name: i for i, name in enumerate(IO_METRICS)}


def u32(value: int) -> int:
    """``value`` clamped into an engine-table word (the table is u32; numpy raises outside)."""
    return value if 0 <= value <= U32_MAX else (0 if value < 0 else U32_MAX)


class Ports(Protocol):
    """Everything the core sends, and the one log that must not flood. The shell implements
    it on zmq and the control sockets; a test records the calls."""

    def send_add(self, engine: Engine, payload: zmq.Frame | bytes) -> int:
        """Hand one ADD to the engine's input socket without blocking: `SENT`, `FULL` (its
        queue took nothing) or `UNREACHABLE` (the peer is not connected)."""
        ...

    def send_abort(self, engine: Engine, payload: bytes) -> bool:
        """One ABORT frame to the engine; False if the socket did not take it (kept for the
        next turn)."""
        ...

    def send_init(self, engine: Engine, payload: bytes) -> bool:
        """The INIT answering the engine's HELLO, on its group's handshake socket."""
        ...

    def send_control(self, worker: int, message: ToWorker, fds: list[int] | None = None) -> bool:
        """One control message to an attached worker; False if its connection was dropped
        (it is detached by then)."""
        ...

    def drain_output(self, engine: Engine, limit: int) -> None:
        """Apply what the engine's output port holds (up to ``limit`` items)."""
        ...

    def warn(
        self, kind: str, message: str, *args: object, exc_info: BaseException | None = None
    ) -> None:
        """Log a problem of a kind, rate-limited."""
        ...


class Adopter(Protocol):
    """Taking engines over from a predecessor (`tsfront.io.adoption.Adoption`)."""

    def on_accepted(self, engine: Engine) -> None: ...
    def expire(self) -> None: ...
    def orphans(self, engine: Engine, frame: bytes) -> None: ...


class PrefillHalf(Protocol):
    """The prefill group's side of every request (`tsfront.io.disagg.Disaggregated`)."""

    def add(
        self, record: Record, slot: int, payload: zmq.Frame | bytes, at: int, expires: float
    ) -> bytes | None: ...
    def forget(self, record: Record, *, abort: bool) -> None: ...
    def kill(self, engine: Engine) -> None: ...
    def fail_code(self, code: int) -> int: ...
    def probe(self, probe: Probe, payload: bytes, at: int) -> bytes | None: ...
    def forget_probe(self, probe: Probe) -> None: ...


class EngineGroup:
    """One engine group at run time: its engines (identities ``first_index ..``, rows
    ``first_row ..`` of the engine table), its role, and what its engines are told to dial.
    The shell binds one handshake ROUTER and one input port per group (`number` names them)."""

    def __init__(self, number: int, role: str, spec: ClientConfig | GroupConfig, first_row: int):
        self.number = number
        self.role = role
        self.spec = spec
        self.first_index = spec.first_engine_index
        self.first_row = first_row
        self.engines = [
            Engine(row=first_row + i, index=spec.first_engine_index + i, role=role, group=number)
            for i in range(spec.num_engines)
        ]
        self.by_identity = {e.identity: e for e in self.engines}
        self.input_address = ""  # advertised, once bound

    def rank(self, engine: Engine) -> int:
        """The engine's rank within this group."""
        return engine.row - self.first_row


class Worker:
    """One attached worker as the core knows it: its number, serial and eventfd."""

    __slots__ = ("eventfd", "number", "pid", "serial")

    def __init__(self, number: int, serial: int, pid: int, eventfd: int) -> None:
        self.number = number
        self.serial = serial
        self.pid = pid
        self.eventfd = eventfd


class IOCore:
    """Every account of the I/O process, moved by events; it sends through ``ports``."""

    def __init__(
        self,
        config: ClientConfig,
        ports: Ports,
        writer: Writer,
        region: Region,
        stats: IOStats,
        state_dir: StateDir | None = None,
    ) -> None:
        self.config = config
        self.ports = ports
        self.writer = writer
        self.region = region
        self.engines_off: int = region.layout["engines_off"]  # the engine table, in bytes
        self.stats = stats
        self.state_dir = state_dir
        self.spw = config.slots_per_worker
        pd = config.routing.prefill
        # The group requests are placed on (and pins name) is group 0, rows 0..num_engines-1;
        # under disaggregated serving the prefill group's engines follow it in the table.
        self.serving_group = EngineGroup(0, DECODE if pd is not None else AGGREGATED, config, 0)
        self.groups = [self.serving_group]
        if pd is not None:
            self.groups.append(EngineGroup(1, PREFILL, pd, config.num_engines))
        self.serving = self.serving_group.engines
        self.engines = [e for g in self.groups for e in g.engines]
        self.router = Router(config.routing.load_balance, config.load_ttl, config)
        self.affinity = self.router.affinity
        self.records: dict[int, Record] = {}
        self.attached: dict[int, Worker] = {}  # by worker number
        self.by_submit_identity: dict[bytes, Worker] = {}
        self.free_workers = list(range(config.max_workers - 1, -1, -1))
        self.serial = 0
        self.state = "handshaking"
        self.failure = ""
        self.deadline = time.monotonic() + config.handshake_timeout
        # Rows (not identities: under disaggregated serving both groups may use index 0) of
        # engines that said HELLO while live.
        self.pending_hello: set[int] = set()
        self.dirty: set[int] = set()
        self.counts = dict.fromkeys(IO_METRICS, 0)
        # The counters changed this turn: only those are written at its end.
        self.counts_changed: set[str] = set()
        self.addresses: dict[str, object] = {}
        # `adopting` while engines taken over from a predecessor may still come back.
        self.adopting = False
        self.adopter: Adopter | None = None
        self.prefill: PrefillHalf | None = None
        # Stall detection (`stalled_after`), applied at the end of a turn once every
        # `stall_every` seconds: nothing per frame but a clock reading per drain. The probes
        # out on stalled engines, by rid (a worker's ADD reusing one is refused).
        self.stall_timeout = config.stall_timeout
        self.stall_fail_timeout = config.stall_fail_timeout
        self.stall_every = min(STALL_CHECK_S, (config.stall_timeout or 4.0) / 4)
        self.stall_check_at = 0.0
        self.probes: dict[bytes, Engine] = {}
        # A registered engine's output connection is awaited as long as a silent one is kept
        # (the heartbeat's interval + timeout); `output_due` is the earliest such deadline.
        self.output_wait = config.heartbeat_interval + config.heartbeat_timeout
        self.output_due = float("inf")

    # ------------------------------------------------------------------ accounts

    def count(self, name: str) -> None:
        """Count one event of the I/O metrics (published at the end of the turn)."""
        self.counts[name] += 1
        self.counts_changed.add(name)

    def handler_failed(self, where: str, exc: Exception) -> None:
        """The error boundary's account of one frame / event / connection whose handling
        raised: counted (``handler_errors``) and logged with its traceback, never silent."""
        self.count("handler_errors")
        kind = "handler:" + where.split(":", 1)[0]
        self.ports.warn(kind, "%s: handler failed, frame dropped: %r", where, exc, exc_info=exc)

    def group_of(self, engine: Engine) -> EngineGroup:
        """The engine's group."""
        return self.groups[engine.group]

    # ------------------------------------------------------------------ engine output

    def on_output_seen(self, engine: Engine, now: float) -> None:
        """The engine's output port had a frame this turn (once a drain: the stall rule's clock)."""
        engine.output_at = now
        if engine.stall is not STEPPING:
            self.unstall(engine, "it sent output")

    def on_output(self, engine: Engine, result: IngestResult | None, frame: bytes) -> None:
        """One frame of a serving engine, as ``Writer.ingest`` applied it (None: it was
        ENGINE_CORE_DEAD)."""
        if result is None:
            self.kill(engine, EngineEvent.CORE_DEAD, "sent ENGINE_CORE_DEAD")
            self.forget_registration(engine)
            return
        _index, running, waiting, kv_active, kv_total, _rows, unknown, finished = result
        records = self.records
        for slot in finished:
            record = records.pop(slot, None)
            if record is not None:
                record.engine.in_flight -= 1
        if unknown and engine.inherited and self.adopter is not None:
            self.adopter.orphans(engine, frame)
        if finished:
            # in_flight moved: the row is published at the turn's end. The load tail is in the
            # table already: the shell's ingest wrote it (`IngestResult`), so a frame that
            # ends nothing costs no publication (a cold one is ~15 µs of the turn).
            self.dirty.add(engine.row)
        if kv_total:
            # In u32: the native decoder refuses a frame whose load tail is not.
            engine.tail = (running, waiting, kv_active, kv_total)
            engine.tail_at = time.monotonic()
            engine.in_flight_at_tail = engine.in_flight

    # ------------------------------------------------------------------ submissions

    def submitter(self, identity: bytes) -> Worker | None:
        """The attached worker whose submit socket has this identity."""
        return self.by_submit_identity.get(identity)

    def is_late_abort(self, identity: bytes) -> bool:
        """Whether an ABORT from an unknown identity is the last of a worker detached since
        (a worker closing sends its last aborts and closes its control socket: the detach can
        win the race; its requests ended at the detach)."""
        if len(identity) != WORKER_IDENTITY.size:
            return False
        serial: int = WORKER_IDENTITY.unpack(identity)[1]
        return 0 < serial <= self.serial

    def on_add(
        self,
        worker: Worker,
        header: bytes,
        payload: zmq.Frame | bytes,
        hashes: zmq.Frame | bytes | None = None,
    ) -> None:
        """A worker's ADD: route it, bind its rid to its slot and send it (or end it here)."""
        if len(header) < SUBMIT_HEADER.size:
            self.ports.warn("bad-submit", "dropped a submission with a short header")
            return
        local, ticket, pin, with_lp, expires, bootstrap_at = SUBMIT_HEADER.unpack_from(header)
        if local >= self.spw or ticket == 0:
            self.ports.warn("bad-submit", "dropped a submission for slot %d", local)
            return
        if not ticket_of_attach(ticket, worker.serial):
            self.ports.warn(
                "bad-submit", "worker %s: dropped a submission with a foreign ticket", worker.number
            )
            return
        rid = header[SUBMIT_HEADER.size :]
        slot = worker.number * self.spw + local
        if slot in self.records:
            # The worker reused a slot whose request we still hold: its ABORT for the old one
            # is behind this ADD (a worker flushes aborts once per loop iteration). Forget the
            # old request now, which queues that ABORT, rather than crossing streams.
            self.forget(slot, abort=True)
        if self.probes and rid in self.probes:
            # The rid of a probe of ours: the engine's rows for it must reach no slot.
            self.writer.bind(rid, slot, ticket, False, FIN_DUPLICATE, -1)
            self.writer.finish(slot, FIN_DUPLICATE, -1)
            return
        engine: Engine | None
        stalled: Engine | None = None  # the stalled engine it was pinned to
        if pin >= 0:
            engine = self.serving[pin] if pin < len(self.serving) else None
            if engine is not None and not engine.live:
                engine = None
            if engine is not None and engine.stall is not STEPPING:
                stalled, engine = engine, None  # only the I/O process's probe goes there
            if engine is not None and self.affinity is not None:
                self.affinity.note(engine, payload, hashes)
        else:
            engine = self.router.choose(self.serving, payload, hashes)
        # Bound to the engine it goes to: only rows from that engine's output port reach its slot.
        index = engine.index if engine is not None else -1
        if not self.writer.bind(rid, slot, ticket, bool(with_lp), FIN_DUPLICATE, index):
            log.info(
                "refused request %r: its rid is in flight already", rid.decode("utf-8", "replace")
            )
            return  # the rid is in flight already; the slot now says so
        if engine is None:
            self.refuse(slot, rid, pin, stalled)
            return
        if engine.aborted and engine.aborted.age(rid, time.monotonic()) is not None:
            # The engine would drop it silently (it remembers aborted rids for 300 s), and
            # our ABORT of the old one may even reach it after this ADD: refuse, with a reason.
            self.count("reused_rids")
            self.writer.finish(slot, FIN_RID_ABORTED, engine.index)
            return
        record = self.records[slot] = Record(rid, engine, ticket, sent=False)
        engine.in_flight += 1
        if engine.in_flight == 1:
            engine.busy_since = time.monotonic()  # the stall rule counts from here (or output)
        engine.requests_total += 1
        self.dirty.add(engine.row)
        if expires and time.monotonic() >= expires:
            # Its deadline passed on the way here: it is never sent (the worker's own timer
            # ends its stream; this end reaches a worker whose timer is late).
            self.fail(slot, FIN_DEADLINE, engine.index)
            return
        out: zmq.Frame | bytes = payload
        if self.prefill is not None:
            filled = self.prefill.add(record, slot, payload, bootstrap_at, expires)
            if filled is None:
                return  # ended already
            out = filled
        self.send_add(engine, slot, record, out, expires)

    def refuse(self, slot: int, rid: bytes, pin: int, stalled: Engine | None) -> None:
        """End a request no engine may take: its pinned rank is stalled, or every live engine
        is (`EngineStalled`: retry; a client's request is never what tests a stalled engine),
        or no engine is live (`StreamRejected`)."""
        if stalled is None and pin < 0 and any(e.live for e in self.serving):
            code, at, why = FIN_ENGINE_STALLED, -1, "every live engine is stalled"
        elif stalled is not None:
            code, at, why = FIN_ENGINE_STALLED, stalled.index, f"engine {stalled.index} is stalled"
        else:
            code, at = FIN_NO_ENGINE, -1
            why = "no live engine" + (f" at rank {pin}" if pin >= 0 else "")
        log.info("refused request %r: %s", rid.decode("utf-8", "replace"), why)
        self.writer.finish(slot, code, at)

    def send_add(
        self,
        engine: Engine,
        slot: int,
        record: Record,
        payload: zmq.Frame | bytes,
        expires: float,
        prefill: bool = False,
    ) -> None:
        """Send one half of a bound request to ``engine`` (queued behind its backlog, or if
        its queue is full)."""
        if engine.backlog:
            self.queue(engine, slot, payload, expires, prefill)
            return
        status = self.ports.send_add(engine, payload)
        if status == SENT:
            if prefill:
                record.prefill_sent = True
            else:
                record.sent = True
            engine.input_pending = False
        elif status == FULL:
            self.queue(engine, slot, payload, expires, prefill)
        elif engine.input_pending:
            self.queue(engine, slot, payload)  # taken over: its input is reconnecting
        else:
            self.lost(engine, EngineEvent.INPUT_UNREACHABLE, "input connection unreachable")

    def queue(
        self,
        engine: Engine,
        slot: int,
        payload: zmq.Frame | bytes,
        expires: float = 0.0,
        prefill: bool = False,
    ) -> None:
        """Put a send the engine's queue did not take in its backlog (``send_timeout``)."""
        engine.backlog.append(
            PendingSend(
                slot,
                self.records[slot].ticket,
                payload,
                time.monotonic() + self.config.send_timeout,
                expires,
                prefill,
            )
        )

    def fail(self, slot: int, code: int, engine_index: int) -> None:
        """End a request here (a send that timed out, a deadline, a prefill failure): forget
        it (ABORTs go where its ADDs left) and publish the end in its slot."""
        self.forget(slot, abort=True)
        self.writer.finish(slot, code, engine_index)

    def retry_backlog(self, engine: Engine, now: float) -> None:
        """Send what waits in the engine's backlog, ending what waited too long."""
        while engine.backlog:
            pending = engine.backlog[0]
            record = self.records.get(pending.slot)
            if record is None or record.ticket != pending.ticket:
                # Aborted while queued (its slot may already carry a newer request).
                engine.backlog.popleft()
                continue
            if pending.expires and now >= pending.expires:
                engine.backlog.popleft()
                self.fail(pending.slot, FIN_DEADLINE, engine.index)
                continue
            if now >= pending.deadline:
                engine.backlog.popleft()
                self.ports.warn(
                    "send-timeout", "engine %d took no request within send_timeout", engine.index
                )
                code = FIN_SEND_TIMEOUT
                if pending.prefill and self.prefill is not None:
                    code = self.prefill.fail_code(code)
                self.fail(pending.slot, code, engine.index)
                continue
            status = self.ports.send_add(engine, pending.payload)
            if status == FULL:
                return
            if status == UNREACHABLE:
                if engine.input_pending:
                    return  # taken over: its input is reconnecting (send_timeout bounds it)
                self.lost(engine, EngineEvent.INPUT_UNREACHABLE, "input connection unreachable")
                return
            engine.backlog.popleft()
            if pending.prefill:
                record.prefill_sent = True
            else:
                record.sent = True
            engine.input_pending = False

    def on_abort(self, worker: Worker, data: bytes) -> None:
        """A worker's batch of ABORT entries (slot, ticket): forget each request still ours."""
        usable = len(data) - len(data) % ABORT_ENTRY.size
        for local, ticket in ABORT_ENTRY.iter_unpack(data[:usable]):
            if local >= self.spw:
                continue
            slot = worker.number * self.spw + local
            record = self.records.get(slot)
            if record is None or record.ticket != ticket:
                continue  # finished already (or never bound): nothing to tell the engine
            self.forget(slot, abort=True)

    def forget(self, slot: int, *, abort: bool) -> None:
        """Drop the request of ``slot`` (unbinding it), queueing ABORTs where it was sent."""
        # An ADD still in the backlog never reaches the engine (its entry no longer matches a
        # record and is skipped), so only a sent one needs an ABORT.
        record = self.records.pop(slot)
        engine = record.engine
        engine.in_flight -= 1
        self.writer.unbind(slot)
        self.dirty.add(engine.row)
        if abort and record.sent:
            self.queue_abort(engine, record.rid)
        if record.prefill is not None and self.prefill is not None:
            self.prefill.forget(record, abort=abort)

    def queue_abort(self, engine: Engine, rid: bytes) -> None:
        """Queue an ABORT of ``rid`` (sent at the end of the turn, one frame per engine);
        remembered from now on, so that no ADD reusing the rid reaches this engine process
        while it would drop it."""
        engine.aborts.append(rid.decode("utf-8", "replace"))
        engine.aborted.add(rid, time.monotonic())

    def send_aborts(self, engine: Engine) -> None:
        """Send the engine's queued ABORTs as one frame (kept if the socket refuses)."""
        if self.ports.send_abort(engine, encode_abort(engine.aborts)):
            engine.aborts = []

    # ------------------------------------------------------------------ engine lifecycle

    def lost(self, engine: Engine, event: EngineEvent, reason: str) -> None:
        """The engine's connection went: apply what it sent before (frames that finish
        requests among them) so that only what was truly unfinished ends, then kill it."""
        self.ports.drain_output(engine, LOST_DRAIN)
        self.kill(engine, event, reason)

    def kill(self, engine: Engine, event: EngineEvent, reason: str) -> None:
        """The engine is down: every request it held ends with EngineDied."""
        # A death the engine's state has no move for is no news: it is down already (an
        # ENGINE_CORE_DEAD drained from the output port of a lost engine, say).
        if not engine.can(event):
            return
        log.warning("engine %d is dead: %s", engine.index, reason)
        self.stats.engine_died(engine.row)
        self.forget_probe(engine)  # its ABORT queued, as the requests' are, in case it is back
        engine.apply(event)
        engine.dead_reason = reason
        if engine.role == PREFILL and self.prefill is not None:
            self.prefill.kill(engine)
        # The records are the one account of what is in flight where; a death is rare enough
        # to find its requests by a scan rather than keep a second per-engine set.
        for slot in [s for s, r in self.records.items() if r.engine is engine]:
            record = self.records.pop(slot)
            self.writer.finish(slot, FIN_ENGINE_DEAD, engine.index)
            if record.sent:
                self.queue_abort(engine, record.rid)
            if record.prefill is not None and self.prefill is not None:
                self.prefill.forget(record, abort=True)
        engine.backlog.clear()
        engine.in_flight = 0
        engine.tail = (0, 0, 0, 0)
        if self.affinity is not None:
            self.affinity.forget(engine)
        self.dirty.add(engine.row)
        if engine.row in self.pending_hello:
            self.pending_hello.discard(engine.row)
            self.send_init(engine)

    def fail_handshake(self) -> None:
        """The group did not come up within ``handshake_timeout``: every worker is told."""
        missing = [
            e.index if e.role != PREFILL else f"prefill {e.index}"
            for e in self.engines
            if not e.live
        ]
        self.state = "failed"
        self.failure = (
            f"engines {missing} did not register within handshake_timeout="
            f"{self.config.handshake_timeout}s; check that each engine dials "
            f"{self.addresses.get('handshake_address')} with --zmq-engine-index "
            f"{self.config.first_engine_index} and --data-parallel-size {self.config.num_engines}"
            "; engines handshake once per start: if they registered with an earlier frontend, "
            "restart them, or keep a long-lived `tsfront io` and attach to it"
        )
        # Attached workers receive the failure and raise it (HandshakeTimeout), so the user sees
        # it there; logging it as an error too would report one failure twice.
        level = logging.INFO if self.attached else logging.ERROR
        log.log(level, "handshake failed: %s", self.failure)
        self.broadcast(Failed(kind="timeout", error=self.failure))

    def on_hello(self, group: EngineGroup, frames: list[bytes], peer_host: str = "") -> None:
        """A frame on a group's handshake socket: HELLO (answered with INIT) or READY.
        ``peer_host``: where the engine dialled from (a prefill engine's bootstrap host)."""
        identity = frames[0]
        engine = group.by_identity.get(identity)
        if engine is None:
            self.ports.warn(
                "bad-identity",
                "refused a handshake from identity %s: not in engines %d..%d",
                identity.hex(),
                group.engines[0].index,
                group.engines[-1].index,
            )
            return
        if len(frames) < 2:
            return
        try:
            message = decode_ready_message(frames[-1])
        except WireDecodeError as exc:
            self.ports.warn(
                "bad-handshake", "engine %d: bad handshake frame: %s", engine.index, exc
            )
            return
        if message.status == "HELLO":
            engine.peer_host = peer_host
            if engine.live:
                # Either a duplicate of a live engine, or a restart we have not noticed
                # yet; answer once the old connection is known dead.
                self.pending_hello.add(engine.row)
                self.ports.warn(
                    "dup-identity",
                    "engine %d said HELLO while live; INIT deferred until it is dead",
                    engine.index,
                )
                return
            self.send_init(engine)
        # READY needs no reply: the registration on the input socket is what counts.

    def send_init(self, engine: Engine) -> None:
        """Answer the engine's HELLO: a new engine process, to be registered."""
        init = encode_init([self.group_of(engine).input_address], [engine.output_address])
        if not self.ports.send_init(engine, init):
            return
        engine.apply(EngineEvent.HELLO)  # a new process: no longer inherited, nor stalled
        # Connections accepted from now on belong to the process we just answered; the
        # earlier ones (its predecessor's, a stray peer's) can no longer kill it.
        engine.generation += 1
        engine.aborts = []  # a new engine process knows none of the old rids
        engine.aborted.clear()
        if self.affinity is not None:
            self.affinity.forget(engine)  # nor is anything in its (new) prefix cache
        self.forget_registration(engine)  # the old process's; the new one's is saved later
        self.dirty.add(engine.row)

    def on_registration(self, group: EngineGroup, frames: list[bytes]) -> None:
        """A frame on a group's input socket: an engine's registration makes it live."""
        engine = group.by_identity.get(frames[0])
        if engine is None or engine.state is not EngineState.HANDSHAKING or len(frames) < 2:
            self.ports.warn("bad-input", "dropped an unexpected frame on the input socket")
            return
        try:
            registration = decode_registration(frames[-1])
        except WireDecodeError as exc:
            self.ports.warn(
                "bad-registration", "engine %d: bad registration: %s", engine.index, exc
            )
            return
        self.stats.engine_registered(engine.row, again=engine.registration is not None)
        engine.registration = registration
        engine.apply(EngineEvent.REGISTERED)
        if self.affinity is not None:
            self.affinity.registered(engine)
        engine.dead_reason = ""
        if not engine.output_connected:
            engine.output_due = time.monotonic() + self.output_wait
            self.output_due = min(self.output_due, engine.output_due)
        self.dirty.add(engine.row)
        log.info("engine %d registered (rank %d)", engine.index, engine.row)
        if self.state_dir is not None:
            try:
                self.state_dir.save(engine.index, engine.row, engine.output_address, registration)
            except OSError as exc:
                # Serving goes on; only a successor could not take this engine over.
                self.ports.warn(
                    "state-dir", "engine %d: registration not saved: %s", engine.index, exc
                )
        self.engine_live(engine)

    def engine_live(self, engine: Engine) -> None:
        """The engine is live: the group may be ready, or the workers get its update."""
        # Taking engines over, one live engine is enough to serve: the others come back (or
        # are declared dead) one by one.
        if self.state == "handshaking":
            if self.adopting or all(e.live for e in self.engines):
                self.ready()
        elif self.state == "ready":
            self.broadcast(EngineUpdate(self.engine_info(engine)))

    def ready(self) -> None:
        """The group serves: every worker gets the engine list."""
        self.state = "ready"
        self.broadcast(Engines(self.engine_infos()))

    def forget_registration(self, engine: Engine) -> None:
        """The engine is known dead (or replaced): a successor must not wait for it."""
        if self.state_dir is not None:
            try:
                self.state_dir.remove(engine.index)
            except OSError as exc:
                self.ports.warn(
                    "state-dir", "engine %d: registration not removed: %s", engine.index, exc
                )

    def on_connection(self, engine: Engine, kind: int, conn: int) -> None:
        """An event of the engine's output port (`tsfront.io.outputs`): a connection whose ZMTP
        handshake is done (``EVENT_ACCEPTED``) or one that ended; ``conn`` is its number, unique in
        the process."""
        if kind == EVENT_DISCONNECTED:
            generation = engine.connections.pop(conn, None)
            if generation is None:
                return
            self.count("output_disconnects")
            if generation != engine.generation:
                # A connection of an earlier engine process (accepted before we sent the
                # current one its INIT): its end says nothing about the current process.
                self.count("stale_disconnects")
                return
            # Only the last connection going counts: anyone may connect to an output port, and a
            # stray peer leaving must not kill the engine that is still connected.
            if engine.live and not engine.output_connected:
                self.lost(
                    engine,
                    EngineEvent.OUTPUT_LOST,
                    "lost its output connection (exit, crash or missed heartbeat)",
                )
            return
        if kind != EVENT_ACCEPTED:
            return
        engine.connections[conn] = engine.generation
        engine.output_due = 0.0
        if engine.state is EngineState.ADOPTING:
            if self.adopter is not None:
                self.adopter.on_accepted(engine)
            return
        if engine.state is EngineState.LOST and engine.row not in self.pending_hello:
            # Same process, reconnected after a transient loss: it keeps its registration.
            engine.apply(EngineEvent.RECONNECTED)
            engine.dead_reason = ""
            self.dirty.add(engine.row)
            log.warning("engine %d reconnected", engine.index)

    def check_outputs(self, now: float) -> None:
        """Declare lost each live engine whose output has not connected by its `output_due`
        (it died after its registration, or its output address does not reach us); it is live
        again if its output does connect (RECONNECTED)."""
        due = float("inf")
        for e in self.engines:
            if not e.output_due:
                continue
            if now < e.output_due:
                due = min(due, e.output_due)
                continue
            e.output_due = 0.0
            if e.live and not e.output_connected:
                self.lost(
                    e,
                    EngineEvent.OUTPUT_LOST,
                    f"its output did not connect to {e.output_address} within "
                    f"{self.output_wait:g}s of its registration (it exited, or that address "
                    "does not reach this host from the engine's)",
                )
        self.output_due = due

    # ------------------------------------------------------------------ stalls

    def check_stalls(self, now: float, timeout: float) -> None:
        """Apply the stall rule to the serving group's live engines, and move each stalled one
        on (`tsfront.io.engines.STALL_TRANSITIONS`): its requests failed once it has been
        stalled for ``stall_fail_timeout``, its probe sent, or superseded when unanswered
        for ``timeout``."""
        # The engines requests are placed on; a prefill engine's place is fixed by the
        # request's bootstrap room, so its stall would change nothing.
        fail_after = self.stall_fail_timeout
        for e in self.serving:
            if not e.live:
                continue
            if e.stall is STEPPING:
                if not stalled_after(e.in_flight, e.output_at, e.busy_since, now, timeout):
                    continue
                self.mark_stalled(e, now)
            elif (
                e.stall is Stall.STALLED
                and fail_after is not None
                and now - e.stalled_since >= fail_after
            ):
                self.abandon(e, now)
            if e.probe is None or now - e.probe.sent_at >= timeout:
                self.send_probe(e, now)

    def mark_stalled(self, engine: Engine, now: float) -> None:
        """The stall rule fired: nothing more is placed on the engine."""
        engine.stall_move(StallEvent.SILENT, now)
        self.stats.engine_stalled(engine.row)
        self.dirty.add(engine.row)
        log.warning(
            "engine %d is stalled: %d request(s) in flight and no output for %.1fs; placing new "
            "requests elsewhere and probing it until it sends output%s",
            engine.index,
            engine.in_flight,
            now - max(engine.output_at, engine.busy_since),
            ""
            if self.stall_fail_timeout is None
            else f"; its requests fail in {self.stall_fail_timeout:g}s unless it does",
        )

    def abandon(self, engine: Engine, now: float) -> None:
        """The engine has been stalled for ``stall_fail_timeout``: every request it holds ends
        with `EngineStalled` (its slot finished once, here) and is aborted on it."""
        engine.stall_move(StallEvent.EXPIRED)
        # A stall is rare enough to find its requests by a scan, as a death does.
        slots = [s for s, r in self.records.items() if r.engine is engine]
        for slot in slots:
            self.fail(slot, FIN_ENGINE_STALLED, engine.index)
        self.count("stall_failures")
        self.dirty.add(engine.row)
        log.warning(
            "engine %d: stalled for %.1fs (stall_fail_timeout): %d request(s) ended with "
            "EngineStalled and aborted on it; still probing it",
            engine.index,
            now - engine.stalled_since,
            len(slots),
        )

    def send_probe(self, engine: Engine, now: float) -> None:
        """Send the stalled engine a probe of our own (`tsfront.io.probes`), superseding (and
        aborting) the one it has out; if its input does not take it, the next check tries
        again."""
        self.forget_probe(engine)
        rid = probe_rid(engine.index)
        payload, at = probe_add(rid)
        probe = Probe(rid, now)
        if self.prefill is not None:
            filled = self.prefill.probe(probe, payload, at)
            if filled is None:
                return  # no prefill engine took its half: the next check tries again
            payload = filled
        status = self.ports.send_add(engine, payload)
        if status != SENT:
            if self.prefill is not None:
                self.prefill.forget_probe(probe)
            if status == UNREACHABLE and not engine.input_pending:
                self.lost(engine, EngineEvent.INPUT_UNREACHABLE, "input connection unreachable")
            return
        engine.input_pending = False
        engine.probe = probe
        self.probes[rid] = engine
        self.count("stall_probes")
        log.info("engine %d: probe %s sent", engine.index, rid.decode())

    def forget_probe(self, engine: Engine) -> None:
        """Abort the probe the engine has out, if any (it was answered, superseded, or the
        engine is gone); a probe that already ended makes this ABORT one the engine forgets
        after 300 s, harmless, since a probe's rid is never used again."""
        probe = engine.probe
        if probe is None:
            return
        engine.probe = None
        self.probes.pop(probe.rid, None)
        self.queue_abort(engine, probe.rid)
        if self.prefill is not None:
            self.prefill.forget_probe(probe)

    def unstall(self, engine: Engine, why: str) -> None:
        """The stalled engine sent output: it is placed on again, its probe aborted."""
        log.warning(
            "engine %d is no longer stalled (%s after %.1fs)",
            engine.index,
            why,
            time.monotonic() - engine.stalled_since,
        )
        self.forget_probe(engine)
        engine.stall_move(StallEvent.OUTPUT)
        self.dirty.add(engine.row)

    # ------------------------------------------------------------------ workers

    def on_attach(self, pid: int, eventfd: int) -> Worker | None:
        """A worker asked to attach (with its eventfd): its place, or None if every place is
        taken. The shell maps the number to its connection, then calls `welcome`."""
        if not self.free_workers:
            return None
        number = self.free_workers.pop()
        self.serial = next_serial(self.serial)
        worker = Worker(number, self.serial, pid, eventfd)
        self.attached[number] = worker
        self.writer.reset_worker(number)
        self.writer.set_worker_fd(number, eventfd)
        self.stats.worker_attached(number, pid)
        self.by_submit_identity[WORKER_IDENTITY.pack(number, worker.serial)] = worker
        return worker

    def welcome(self, worker: Worker) -> None:
        """Tell a just-attached worker (its `Attached` sent) where the group stands."""
        if self.state == "ready":
            self.ports.send_control(worker.number, Engines(self.engine_infos()))
        elif self.state == "failed":
            self.ports.send_control(worker.number, Failed(kind="timeout", error=self.failure))

    def on_detach(self, worker: Worker) -> None:
        """The worker's control connection went: its requests end, its place is free."""
        if self.attached.pop(worker.number, None) is None:
            return  # detached once, whatever calls this again
        w = worker.number
        base = w * self.spw
        for slot in range(base, base + self.spw):
            if slot in self.records:
                self.forget(slot, abort=True)
        # Its queued sends go too: none may reach an engine, nor be mistaken for a request
        # of the next worker given this number.
        for e in self.engines:
            if e.backlog:
                e.backlog = collections.deque(
                    p for p in e.backlog if not base <= p.slot < base + self.spw
                )
        self.writer.reset_worker(w)
        self.stats.worker_detached(w)
        self.by_submit_identity.pop(WORKER_IDENTITY.pack(w, worker.serial), None)
        self.free_workers.append(w)
        log.info("worker %d detached", w)

    def broadcast(self, message: ToWorker) -> None:
        """Send one control message to every attached worker."""
        # Workers act on a message at once: the engine table must already say what it says.
        self.publish_dirty()
        for number in list(self.attached):
            if number in self.attached:
                self.ports.send_control(number, message)

    # ------------------------------------------------------------------ publishing

    def engine_info(self, engine: Engine) -> EngineEntry:
        """The engine as workers are told of it."""
        return EngineEntry(
            index=engine.index,
            rank=self.group_of(engine).rank(engine),
            role=engine.role,
            output_address=engine.output_address,
            registration=engine.registration,
        )

    def engine_infos(self) -> list[EngineEntry]:
        """Every engine, as workers are told of them."""
        return [self.engine_info(e) for e in self.engines]

    def publish_engine(self, e: Engine) -> None:
        """Write the engine's row of the engine table."""
        # Every word must fit a u32: the store raises on one outside, and then every word is
        # clamped, for nothing here may raise in the loop (the tail is range-checked on
        # arrival; this is the last line of defence). A stall is published as a state of its
        # own; here it is a condition of a LIVE engine.
        running, waiting, active, total = e.tail
        load_ms = int(e.tail_at * 1000) & 0xFFFFFFFFFFFFFFFF if e.tail_at else 0
        requests = e.requests_total & 0xFFFFFFFFFFFFFFFF
        words = (
            e.published_state,
            e.index,
            e.in_flight,
            running,
            waiting,
            active,
            total,
            load_ms & 0xFFFFFFFF,
            load_ms >> 32,
            requests & 0xFFFFFFFF,
            requests >> 32,
        )
        if _ROW_WORDS is not None:
            at = self.engines_off + e.row * ENGINE_WORDS * 4
            # Packed, then copied in: pack_into zeroes its target first, and a worker reading
            # the shared row then would see it ENGINE_ABSENT.
            try:
                row = _ROW_WORDS.pack(*words)
            except struct.error:  # a word outside u32: every word clamped (the slow path)
                row = _ROW_WORDS.pack(*map(u32, words))
            self.region.map[at : at + _ROW_WORDS.size] = row
        else:  # pragma: no cover - big-endian hosts
            self.region.engines[e.row][: len(words)] = [u32(w) for w in words]

    def publish_dirty(self) -> None:
        """Write the rows of the engines that changed."""
        for row in self.dirty:
            self.publish_engine(self.engines[row])
        self.dirty.clear()

    # ------------------------------------------------------------------ the turn

    def end_of_turn(self, now: float) -> None:
        """Once per turn: deadlines, the batched ABORTs and backlogs (each engine inside the
        error boundary), spilled tokens, the stall rule when due, the engine table and the
        I/O metrics."""
        if now >= self.deadline:
            if self.adopting and self.adopter is not None:
                self.adopter.expire()
            elif self.state == "handshaking":
                self.fail_handshake()
        for e in self.engines:
            try:
                if e.aborts and e.live:
                    self.send_aborts(e)
                if e.backlog:
                    self.retry_backlog(e, now)
            except Exception as exc:
                self.handler_failed(f"engine {e.index}: sending its queued frames", exc)
        if self.writer.spilling():
            self.writer.flush_spills()
        if now >= self.output_due:
            self.check_outputs(now)
        if now >= self.stall_check_at and self.stall_timeout is not None:
            self.stall_check_at = now + self.stall_every
            self.check_stalls(now, self.stall_timeout)
        self.publish_dirty()
        affinity = self.affinity
        if affinity is not None and (
            affinity.fallbacks != self.counts["affinity_fallbacks"]
            or affinity.hashed_here != self.counts["affinity_rehashed"]
        ):
            self.counts["affinity_fallbacks"] = affinity.fallbacks
            self.counts["affinity_rehashed"] = affinity.hashed_here
            self.counts_changed.update(("affinity_fallbacks", "affinity_rehashed"))
        if self.counts_changed:
            # The changed words only (a submission's turn changes one): writing the whole
            # array from a list cost numpy's conversion of every counter, every such turn.
            metrics, counts = self.region.io_metrics, self.counts
            for name in self.counts_changed:
                metrics[_COUNT_WORD[name]] = counts[name]
            self.counts_changed.clear()

    def timeout_ms(self, now: float) -> int:
        """How long the shell's poll may wait for the next event."""
        if self.writer.spilling():
            return 1
        aborts = stalled = False
        for e in self.engines:  # a loop, not any() over a generator: once a turn
            if e.backlog:
                return 1
            if e.aborts:
                aborts = True
            if e.stall is not STEPPING:
                stalled = True
        if aborts:
            return 10  # ABORTs the socket did not take (e.g. an input still reconnecting)
        if self.state == "handshaking" or self.adopting:
            return max(0, min(1000, int((self.deadline - now) * 1000) + 1))
        if (self.records or stalled) and self.stall_timeout is not None:
            # Requests in flight, or a stalled engine to probe: turn in time for the next
            # stall check.
            return max(0, min(1000, int((self.stall_check_at - now) * 1000) + 1))
        if self.output_due != float("inf"):  # a registered engine's output is awaited
            return max(0, min(1000, int((self.output_due - now) * 1000) + 1))
        return 1000

    def close(self) -> None:
        """End every open stream and queue its ABORTs, sent now where the engine is live."""
        for slot, record in list(self.records.items()):
            self.writer.finish(slot, FIN_IO_STOPPING, record.engine.index)
            if record.sent:
                record.engine.aborts.append(record.rid.decode("utf-8", "replace"))
            if record.prefill is not None and record.prefill_sent:
                record.prefill.aborts.append(record.rid.decode("utf-8", "replace"))
        self.records.clear()
        self.writer.wake()
        for e in self.engines:
            self.forget_probe(e)
            if e.aborts and e.live:
                self.send_aborts(e)
