"""The loop of the I/O process: one thread, one `zmq.Poller`, every socket.

Each turn handles, in this order: engine output (decode → slot rings, in native code), worker
submissions (route, forward the payload frame unchanged), the handshake and registration
sockets, the output connections' monitors, the workers' control sockets; then, once per turn,
it sends the batched ABORTs, retries queued sends, flushes spilled tokens and wakes the parked
workers that got news. Nothing a peer or a worker sends can raise out of a handler: bad input
is logged (rate-limited) and dropped, and each frame (or event, or control connection) is
handled inside a boundary that catches anything else, counts it (`handler_errors`), logs it
with a traceback (rate-limited) naming the engine or worker, drops that frame and goes on.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import time
from typing import cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from tsfront import _native, control
from tsfront.config import ClientConfig, EngineGroup
from tsfront.errors import WireDecodeError
from tsfront.io import adoption
from tsfront.io.addresses import advertised, bind_socket, output_address_for
from tsfront.io.disagg import DECODE, PREFILL, Disaggregated
from tsfront.io.engines import Engine, EngineEvent, EngineState, PendingSend, stalled_after
from tsfront.io.routing import Router
from tsfront.io.state import StateDir
from tsfront.ipc.control import (
    Attach,
    Attached,
    EngineEntry,
    Engines,
    EngineUpdate,
    Failed,
    ToIO,
    ToWorker,
)
from tsfront.ipc.submit import (
    ABORT_ENTRY,
    SUBMIT_ABORT,
    SUBMIT_ADD,
    SUBMIT_HEADER,
    WORKER_IDENTITY,
    next_serial,
    ticket_base,
    ticket_of_attach,
)
from tsfront.metrics.recorder import IOStats
from tsfront.region import (
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
    FIN_DEADLINE,
    FIN_DUPLICATE,
    FIN_ENGINE_DEAD,
    FIN_IO_STOPPING,
    FIN_NO_ENGINE,
    FIN_RID_ABORTED,
    FIN_SEND_TIMEOUT,
    IO_METRICS,
    Geometry,
    Region,
)
from tsfront.wire import (
    ABORT,
    ADD,
    decode_ready_message,
    decode_registration,
    encode_abort,
    encode_init,
)

log = logging.getLogger("tsfront.io")

# Frames drained from one socket per turn, so one busy peer cannot starve the others.
DRAIN = 256
# Frames applied from a PULL whose engine connection was just lost, before declaring it dead.
LOST_DRAIN = 64 * DRAIN
# Bytes of control messages a worker may leave unread before it is detached.
MAX_CONTROL_BACKLOG = 4 << 20
# Seconds between two applications of the stall rule (at most; a quarter of stall_timeout if
# that is shorter), so that a stall is seen within stall_timeout + this.
STALL_CHECK_S = 1.0

U32_MAX = 0xFFFFFFFF


def _u32(value: int) -> int:
    """``value`` clamped into an engine-table word (the table is u32; numpy raises outside)."""
    return value if 0 <= value <= U32_MAX else (0 if value < 0 else U32_MAX)


class Stop(Exception):
    """Raised (from the SIGTERM handler) to end the loop."""


class _RateLimitedLog:
    """Logs a kind of problem at most once per interval, counting the rest."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.last: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def __call__(
        self, kind: str, message: str, *args: object, exc_info: BaseException | None = None
    ) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) >= self.interval:
            self.last[kind] = now
            log.warning(message + " (%d so far)", *args, self.counts[kind], exc_info=exc_info)


class Record:
    """A request in flight: its rid, the engine holding it, its worker's ticket, and whether
    its ADD left for the engine (one still in the backlog needs no ABORT: it is just dropped).
    Under disaggregated serving ``engine`` is the decode engine, and the prefill half is
    ``prefill`` (its ADD sent: ``prefill_sent``) with the request's bootstrap ``room``."""

    __slots__ = ("engine", "prefill", "prefill_sent", "rid", "room", "sent", "ticket")

    def __init__(self, rid: bytes, engine: Engine, ticket: int, sent: bool = True) -> None:
        self.rid = rid
        self.engine = engine
        self.ticket = ticket
        self.sent = sent
        self.prefill: Engine | None = None
        self.prefill_sent = False
        self.room = 0


class WorkerConn:
    """One attached worker: its control socket (and what waits to be sent on it), id and
    eventfd."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = control.MessageReader(sock, ToIO)
        self.out = bytearray()
        self.worker: int | None = None
        self.serial = 0
        self.eventfd = -1
        self.pid = 0


class IOLoop:
    """Everything the I/O process owns, and its loop."""

    def __init__(self, config: ClientConfig, token: str) -> None:
        self.config = config
        self.token = token
        self.ctx = zmq.Context(1)
        pd = config.routing.prefill
        num_prefill = pd.num_engines if pd is not None else 0
        self.geometry = Geometry(
            num_workers=config.max_workers,
            slots_per_worker=config.slots_per_worker,
            ring_capacity=config.ring_capacity,
            max_engines=config.num_engines + num_prefill,
        )
        self.spw = config.slots_per_worker
        self.region = Region.create(self.geometry)
        self.stats = IOStats(self.region)  # the metrics area's I/O block
        self.writer = _native.Writer(
            self.region.map,
            config.max_workers,
            config.slots_per_worker,
            config.ring_capacity,
            config.num_engines + num_prefill,
        )
        role = DECODE if pd is not None else "aggregated"
        # The group requests are placed on (and pins name): rows 0..num_engines-1. Under
        # disaggregated serving the prefill group's engines follow it in the engine table.
        self.serving = [
            Engine(row=i, index=config.first_engine_index + i, role=role)
            for i in range(config.num_engines)
        ]
        prefill = (
            [
                Engine(row=config.num_engines + i, index=pd.first_engine_index + i, role=PREFILL)
                for i in range(num_prefill)
            ]
            if pd is not None
            else []
        )
        self.engines = self.serving + prefill
        self.pd = Disaggregated(self, prefill) if pd is not None else None
        self.by_identity = {e.identity: e for e in self.serving}
        self.router = Router(config.routing.load_balance, config.load_ttl, config)
        self.affinity = self.router.affinity
        self.records: dict[int, Record] = {}
        self.workers: dict[int, WorkerConn] = {}  # by control fd
        self.by_submit_identity: dict[bytes, WorkerConn] = {}
        self.free_workers = list(range(config.max_workers - 1, -1, -1))
        self.serial = 0
        self.state = "handshaking"
        self.failure = ""
        self.deadline = time.monotonic() + config.handshake_timeout
        # Rows (not identities: under disaggregated serving both groups may use index 0) of
        # engines that said HELLO while live.
        self.pending_hello: set[int] = set()
        self.dirty: set[int] = set()
        self.warn = _RateLimitedLog()
        self.counts = dict.fromkeys(IO_METRICS, 0)
        self._counts_dirty = False
        self.addresses: dict = {}
        self._sockets: list[zmq.Socket] = []
        self._listener: socket.socket | None = None
        # Registrations kept for a successor (None: no state_dir); `adopting` while engines
        # taken over from a predecessor may still come back (tsfront.io.adoption).
        self.state_dir = StateDir(config) if config.state_dir else None
        self.adopting = False
        self.running = False  # the loop has started serving (a stop may clear state_dir)
        # Stall detection (tsfront.io.engines.stalled_after), applied at the end of a turn
        # once every `stall_every` seconds: nothing per frame but a clock reading per drain.
        self.stall_timeout = config.stall_timeout
        self.stall_every = min(STALL_CHECK_S, (config.stall_timeout or 4.0) / 4)
        self.stall_check_at = 0.0

    # ------------------------------------------------------------------ setup

    def bind(self) -> dict:
        """Bind every socket; return the real addresses (reported to whoever started us)."""
        c = self.config
        if self.state_dir is not None:
            # Locked and checked before anything is bound: a second I/O process of the same
            # group must not take the addresses (an ipc:// path would be stolen, not refused).
            saved = self.state_dir.open()
            adoption.load(self, saved)
        self.handshake = self._socket(zmq.ROUTER)
        self.handshake.setsockopt(zmq.MAXMSGSIZE, c.max_message_size)
        handshake = bind_socket(self.handshake, c.handshake_address)
        self.input = self._socket(zmq.ROUTER)
        self.input.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.input.setsockopt(zmq.MAXMSGSIZE, c.max_message_size)
        self.input.setsockopt(zmq.SNDHWM, c.engine_queue_depth)
        self.input.setsockopt(zmq.LINGER, 200)
        input_address = bind_socket(self.input, c.input_address)
        self.input_advertised = advertised(input_address, c.handshake_address)
        outputs = []
        for e in self.engines:
            pull = self._socket(zmq.PULL)
            pull.setsockopt(zmq.RCVHWM, 0)
            pull.setsockopt(zmq.HEARTBEAT_IVL, int(c.heartbeat_interval * 1000))
            pull.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(c.heartbeat_timeout * 1000))
            pull.setsockopt(zmq.HEARTBEAT_TTL, int(c.heartbeat_timeout * 1000))
            # Prefill engines exist only under disaggregated routing (a prefill group).
            group = cast(EngineGroup, c.routing.prefill) if e.role == PREFILL else c
            rank = e.index - group.first_engine_index
            bound = bind_socket(pull, output_address_for(group.output_address, rank))
            e.pull = pull
            e.output_address = advertised(bound, group.handshake_address)
            e.monitor = pull.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
            self._sockets.append(e.monitor)
            outputs.append(e.output_address)
        self.submit = self._socket(zmq.ROUTER)
        self.submit.setsockopt(zmq.RCVHWM, 0)
        submit = f"ipc://@tsfront-{self.token}-submit"
        self.submit.bind(submit)
        self.submit_address = submit
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        address = f"{control.ADDRESS_PREFIX}tsfront-{self.token}"
        listener.bind(control.socket_name(address))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self.poller = zmq.Poller()
        for e in self.engines:
            self.poller.register(e.pull, zmq.POLLIN)
            self.poller.register(e.monitor, zmq.POLLIN)
        self.poller.register(self.submit, zmq.POLLIN)
        self.poller.register(self.handshake, zmq.POLLIN)
        self.poller.register(self.input, zmq.POLLIN)
        self.poller.register(listener.fileno(), zmq.POLLIN)
        prefill_addresses = self.pd.bind() if self.pd is not None else None
        if self.pd is not None:
            self.pd.register(self.poller)
        self.pull_engine = {e.pull: e for e in self.engines}
        self.monitor_engine = {e.monitor: e for e in self.engines}
        self.addresses = {
            "address": address,
            "handshake_address": handshake,
            "input_address": self.input_advertised,
            "output_addresses": outputs[: c.num_engines],
            "pid": os.getpid(),
        }
        if prefill_addresses is not None:
            self.addresses["prefill"] = prefill_addresses
        for e in self.engines:
            self._publish_engine(e)
        return self.addresses

    def _socket(self, kind: int) -> zmq.Socket:
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        self._sockets.append(s)
        return s

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Serve until `Stop` is raised (SIGTERM) or the process is told to exit."""
        poll = self.poller.poll
        pulls = self.pull_engine
        monitors = self.monitor_engine
        listener_fd = cast(socket.socket, self._listener).fileno()  # bound in bind()
        writer = self.writer
        self.running = True
        while True:
            events = poll(self._timeout_ms())
            for sock, _ in events:
                engine = pulls.get(sock)
                if engine is not None:
                    self._on_output(engine)
            for sock, mask in events:
                if sock is self.submit:
                    self._on_submit()
                elif sock is self.handshake:
                    self._on_handshake(self.handshake, self.by_identity)
                elif sock is self.input:
                    self._on_input(self.input, self.by_identity)
                elif self.pd is not None and self.pd.on_socket(sock):
                    pass
                elif sock in monitors:
                    self._on_monitor(monitors[sock])
                elif sock == listener_fd:
                    self._on_accept()
                elif isinstance(sock, int) and sock in self.workers:
                    self._on_control(self.workers[sock], mask)
            self._after_turn()
            writer.wake()

    def _timeout_ms(self) -> int:
        if self.writer.spilling() or any(e.backlog for e in self.engines):
            return 1
        if any(e.aborts for e in self.engines):
            return 10  # ABORTs the socket did not take (e.g. an input still reconnecting)
        if self.state == "handshaking" or self.adopting:
            return max(0, min(1000, int((self.deadline - time.monotonic()) * 1000) + 1))
        if self.records and self.stall_timeout is not None:
            # Requests in flight: turn in time for the next stall check.
            return max(0, min(1000, int((self.stall_check_at - time.monotonic()) * 1000) + 1))
        return 1000

    def _after_turn(self) -> None:
        now = time.monotonic()
        if now >= self.deadline:
            if self.adopting:
                adoption.expire(self)
            elif self.state == "handshaking":
                self._fail_handshake()
        for e in self.engines:
            try:
                if e.aborts and e.live:
                    self._send_aborts(e)
                if e.backlog:
                    self._retry_backlog(e, now)
            except Exception as exc:
                self._handler_failed(f"engine {e.index}: sending its queued frames", exc)
        if self.writer.spilling():
            self.writer.flush_spills()
        if now >= self.stall_check_at and self.stall_timeout is not None:
            self.stall_check_at = now + self.stall_every
            self._check_stalls(now, self.stall_timeout)
        self._publish_dirty()
        affinity = self.affinity
        if affinity is not None and (
            affinity.fallbacks != self.counts["affinity_fallbacks"]
            or affinity.hashed_here != self.counts["affinity_rehashed"]
        ):
            self.counts["affinity_fallbacks"] = affinity.fallbacks
            self.counts["affinity_rehashed"] = affinity.hashed_here
            self._counts_dirty = True
        if self._counts_dirty:
            self._counts_dirty = False
            self.region.io_metrics[:] = list(self.counts.values())

    def _check_stalls(self, now: float, timeout: float) -> None:
        # The engines requests are placed on; a prefill engine's place is fixed by the
        # request's bootstrap room, so its stall would change nothing.
        for e in self.serving:
            if e.stalled_since or not e.live:
                continue  # cleared only by an output frame, a death or a new handshake
            if stalled_after(e.in_flight, e.output_at, e.busy_since, now, timeout):
                e.stalled_since = now
                self.stats.engine_stalled(e.row)
                self.dirty.add(e.row)
                log.warning(
                    "engine %d is stalled: %d request(s) in flight and no output for %.1fs; "
                    "placing new requests elsewhere until it sends output",
                    e.index,
                    e.in_flight,
                    now - max(e.output_at, e.busy_since),
                )

    def _unstall(self, engine: Engine, why: str) -> None:
        log.warning(
            "engine %d is no longer stalled (%s after %.1fs)",
            engine.index,
            why,
            time.monotonic() - engine.stalled_since,
        )
        engine.stalled_since = 0.0
        self.dirty.add(engine.row)

    def _count(self, name: str) -> None:
        self.counts[name] += 1
        self._counts_dirty = True

    def _handler_failed(self, where: str, exc: Exception) -> None:
        # The boundary around one frame / event / connection: a bug (or an input no decoder
        # foresaw) costs that frame, never the loop. Counted and logged, never silent.
        self._count("handler_errors")
        kind = "handler:" + where.split(":", 1)[0]
        self.warn(kind, "%s: handler failed, frame dropped: %r", where, exc, exc_info=exc)

    def _publish_dirty(self) -> None:
        for row in self.dirty:
            self._publish_engine(self.engines[row])
        self.dirty.clear()

    # ------------------------------------------------------------------ engine output

    def _on_output(self, engine: Engine, limit: int = DRAIN) -> None:
        if engine.role == PREFILL:
            # A prefill engine exists only with a prefill group (self.pd).
            cast(Disaggregated, self.pd).on_output(engine, limit)  # never written to a slot
            return
        recv = cast(zmq.Socket, engine.pull).recv  # every engine's PULL is bound in bind()
        ingest = self.writer.ingest
        index = engine.index
        records = self.records
        for n in range(limit):
            try:
                frame = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if n == 0:
                # Any frame says the engine steps (the stall rule's clock; one reading a drain).
                engine.output_at = time.monotonic()
                if engine.stalled_since:
                    self._unstall(engine, "it sent output")
            try:
                result = ingest(frame, index)
                if result is None:
                    self._kill(engine, EngineEvent.CORE_DEAD, "sent ENGINE_CORE_DEAD")
                    self._forget_registration(engine)
                    return
                _index, running, waiting, kv_active, kv_total, _rows, unknown, finished = result
                for slot in finished:
                    record = records.pop(slot, None)
                    if record is not None:
                        owner = record.engine
                        owner.in_flight -= 1
                if unknown and engine.inherited:
                    adoption.orphans(self, engine, frame)
                self.dirty.add(engine.row)
                if kv_total:
                    # In u32: the native decoder refuses a frame whose load tail is not.
                    engine.tail = (running, waiting, kv_active, kv_total)
                    engine.tail_at = time.monotonic()
                    engine.in_flight_at_tail = engine.in_flight
            except WireDecodeError as exc:
                self.warn("bad-output", "engine %d: dropped an output frame: %s", engine.index, exc)
            except Exception as exc:
                self._handler_failed(f"engine {engine.index}: output frame", exc)

    # ------------------------------------------------------------------ submissions

    def _on_submit(self) -> None:
        recv = self.submit.recv_multipart
        for _ in range(DRAIN):
            try:
                frames = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            worker = self.by_submit_identity.get(frames[0].bytes)
            if worker is None or len(frames) < 3:
                if self._late_abort(frames):
                    continue
                self.warn("bad-submit", "dropped a submission from an unknown or stale worker")
                continue
            try:
                kind = frames[1].bytes
                if kind == SUBMIT_ADD and len(frames) in (4, 5):
                    # A fifth frame: the prompt's block hashes (prefix-affinity routing).
                    hashes = frames[4] if len(frames) == 5 else None
                    self._add(worker, frames[2].bytes, frames[3], hashes)
                elif kind == SUBMIT_ABORT:
                    self._abort(worker, frames[2].bytes)
                else:
                    self.warn(
                        "bad-submit", "dropped a malformed submission from worker %s", worker.worker
                    )
            except Exception as exc:
                self._handler_failed(f"worker {worker.worker}: submission", exc)

    def _late_abort(self, frames: list) -> bool:
        # A worker closing its client sends its last aborts on the submit socket and then
        # closes its control socket; the detach can win the race. Its requests ended at the
        # detach, so this is our own teardown, not a problem worth a warning.
        identity = frames[0].bytes
        if len(frames) != 3 or frames[1].bytes != SUBMIT_ABORT:
            return False
        if len(identity) != WORKER_IDENTITY.size:
            return False
        if not 0 < WORKER_IDENTITY.unpack(identity)[1] <= self.serial:
            return False
        log.debug("dropped the last aborts of a detached worker")
        return True

    def _add(
        self,
        worker: WorkerConn,
        header: bytes,
        payload: zmq.Frame,
        hashes: zmq.Frame | None = None,
    ) -> None:
        if len(header) < SUBMIT_HEADER.size:
            self.warn("bad-submit", "dropped a submission with a short header")
            return
        local, ticket, pin, with_lp, expires, bootstrap_at = SUBMIT_HEADER.unpack_from(header)
        if local >= self.spw or ticket == 0:
            self.warn("bad-submit", "dropped a submission for slot %d", local)
            return
        if not ticket_of_attach(ticket, worker.serial):
            self.warn(
                "bad-submit", "worker %s: dropped a submission with a foreign ticket", worker.worker
            )
            return
        rid = header[SUBMIT_HEADER.size :]
        # Submissions come only from attached workers (by_submit_identity), which have a number.
        slot = cast(int, worker.worker) * self.spw + local
        if slot in self.records:
            # The worker reused a slot whose request we still hold: its ABORT for the old one
            # is behind this ADD (a worker flushes aborts once per loop iteration). Forget the
            # old request now, which queues that ABORT, rather than crossing streams.
            self._forget(slot, abort=True)
        if pin >= 0:
            engine = self.serving[pin] if pin < len(self.serving) else None
            if engine is not None and not engine.live:
                engine = None
            if engine is not None and self.affinity is not None:
                self.affinity.note(engine, payload, hashes)
        else:
            engine = self.router.choose(self.serving, payload, hashes)
        # Bound to the engine it goes to: only rows from that engine's PULL reach its slot.
        index = engine.index if engine is not None else -1
        if not self.writer.bind(rid, slot, ticket, bool(with_lp), FIN_DUPLICATE, index):
            log.info(
                "refused request %r: its rid is in flight already", rid.decode("utf-8", "replace")
            )
            return  # the rid is in flight already; the slot now says so
        if engine is None:
            log.info(
                "refused request %r: no live engine%s",
                rid.decode("utf-8", "replace"),
                f" at rank {pin}" if pin >= 0 else "",
            )
            self.writer.finish(slot, FIN_NO_ENGINE, -1)
            return
        if engine.aborted and engine.aborted.age(rid, time.monotonic()) is not None:
            # The engine would drop it silently (it remembers aborted rids for 300 s), and
            # our ABORT of the old one may even reach it after this ADD: refuse, with a reason.
            self._count("reused_rids")
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
            self._fail(slot, FIN_DEADLINE, engine.index)
            return
        out: zmq.Frame | bytes = payload
        if self.pd is not None:
            filled = self.pd.add(record, slot, payload, bootstrap_at, expires)
            if filled is None:
                return  # ended already
            out = filled
        self._send_add(engine, slot, record, out, expires)

    def _send_add(
        self,
        engine: Engine,
        slot: int,
        record: Record,
        payload: zmq.Frame | bytes,
        expires: float,
        prefill: bool = False,
    ) -> None:
        if engine.backlog:
            self._queue(engine, slot, payload, expires, prefill)
            return
        try:
            (engine.input or self.input).send_multipart(
                [engine.identity, ADD, payload], zmq.NOBLOCK, copy=False
            )
            if prefill:
                record.prefill_sent = True
            else:
                record.sent = True
            engine.input_pending = False
        except zmq.Again:
            self._queue(engine, slot, payload, expires, prefill)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH and engine.input_pending:
                self._queue(engine, slot, payload)  # taken over: its input is reconnecting
            elif exc.errno == zmq.EHOSTUNREACH:
                self._lost(engine, EngineEvent.INPUT_UNREACHABLE, "input connection unreachable")
            else:
                raise

    def _queue(
        self,
        engine: Engine,
        slot: int,
        payload: zmq.Frame | bytes,
        expires: float = 0.0,
        prefill: bool = False,
    ) -> None:
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

    def _fail(self, slot: int, code: int, engine_index: int) -> None:
        # End a request here (a send that timed out, a deadline, a prefill failure): forget it
        # (ABORTs go where its ADDs left) and publish the end in its slot.
        self._forget(slot, abort=True)
        self.writer.finish(slot, code, engine_index)

    def _retry_backlog(self, engine: Engine, now: float) -> None:
        while engine.backlog:
            pending = engine.backlog[0]
            record = self.records.get(pending.slot)
            if record is None or record.ticket != pending.ticket:
                # Aborted while queued (its slot may already carry a newer request).
                engine.backlog.popleft()
                continue
            if pending.expires and now >= pending.expires:
                engine.backlog.popleft()
                self._fail(pending.slot, FIN_DEADLINE, engine.index)
                continue
            if now >= pending.deadline:
                engine.backlog.popleft()
                self.warn(
                    "send-timeout", "engine %d took no request within send_timeout", engine.index
                )
                code = FIN_SEND_TIMEOUT
                if pending.prefill:
                    code = cast(Disaggregated, self.pd).fail_code(code)
                self._fail(pending.slot, code, engine.index)
                continue
            try:
                (engine.input or self.input).send_multipart(
                    [engine.identity, ADD, pending.payload], zmq.NOBLOCK, copy=False
                )
            except zmq.Again:
                return
            except zmq.ZMQError:
                if engine.input_pending:
                    return  # taken over: its input is reconnecting (send_timeout bounds it)
                self._lost(engine, EngineEvent.INPUT_UNREACHABLE, "input connection unreachable")
                return
            engine.backlog.popleft()
            if pending.prefill:
                record.prefill_sent = True
            else:
                record.sent = True
            engine.input_pending = False

    def _abort(self, worker: WorkerConn, data: bytes) -> None:
        usable = len(data) - len(data) % ABORT_ENTRY.size
        for local, ticket in ABORT_ENTRY.iter_unpack(data[:usable]):
            if local >= self.spw:
                continue
            slot = cast(int, worker.worker) * self.spw + local  # an attached worker (see _add)
            record = self.records.get(slot)
            if record is None or record.ticket != ticket:
                continue  # finished already (or never bound): nothing to tell the engine
            self._forget(slot, abort=True)

    def _forget(self, slot: int, *, abort: bool) -> None:
        # An ADD still in the backlog never reaches the engine (its entry no longer matches a
        # record and is skipped), so only a sent one needs an ABORT.
        record = self.records.pop(slot)
        engine = record.engine
        engine.in_flight -= 1
        self.writer.unbind(slot)
        self.dirty.add(engine.row)
        if abort and record.sent:
            self._queue_abort(engine, record.rid)
        if record.prefill is not None:  # a prefill half: there is a prefill group
            cast(Disaggregated, self.pd).forget(record, abort=abort)

    def _queue_abort(self, engine: Engine, rid: bytes) -> None:
        # Sent at the end of the turn (one frame per engine); remembered from now on, so that
        # no ADD reusing the rid reaches this engine process while it would drop it.
        engine.aborts.append(rid.decode("utf-8", "replace"))
        engine.aborted.add(rid, time.monotonic())

    def _send_aborts(self, engine: Engine) -> None:
        try:
            (engine.input or self.input).send_multipart(
                [engine.identity, ABORT, encode_abort(engine.aborts)], zmq.NOBLOCK
            )
        except zmq.Again:
            return  # next turn
        except zmq.ZMQError:
            return  # unreachable: kept until it comes back or re-handshakes
        engine.aborts = []

    # ------------------------------------------------------------------ handshake

    def _on_handshake(self, sock: zmq.Socket, by_identity: dict[bytes, Engine]) -> None:
        for _ in range(DRAIN):
            try:
                msgs = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            frames = [m.bytes for m in msgs]
            try:
                self._on_handshake_frame(frames, by_identity, msgs[-1])
            except Exception as exc:
                self._handler_failed(f"handshake from {frames[0].hex()}: frame", exc)

    def _on_handshake_frame(
        self,
        frames: list[bytes],
        by_identity: dict[bytes, Engine] | None = None,
        frame: zmq.Frame | None = None,
    ) -> None:
        identity = frames[0]
        group = list((by_identity if by_identity is not None else self.by_identity).values())
        engine = (by_identity if by_identity is not None else self.by_identity).get(identity)
        if engine is None:
            self.warn(
                "bad-identity",
                "refused a handshake from identity %s: not in engines %d..%d",
                identity.hex(),
                group[0].index,
                group[-1].index,
            )
            return
        if len(frames) < 2:
            return
        try:
            message = decode_ready_message(frames[-1])
        except WireDecodeError as exc:
            self.warn("bad-handshake", "engine %d: bad handshake frame: %s", engine.index, exc)
            return
        if message.status == "HELLO":
            if frame is not None:
                # Where the engine dialled from: a prefill engine's default bootstrap host.
                try:
                    # pyzmq's stub types get() as int | str; a string property is a str.
                    engine.peer_host = frame.get("Peer-Address") or ""  # type: ignore[assignment]
                except zmq.ZMQError:
                    engine.peer_host = ""
            if engine.live:
                # Either a duplicate of a live engine, or a restart we have not noticed
                # yet; answer once the old connection is known dead.
                self.pending_hello.add(engine.row)
                self.warn(
                    "dup-identity",
                    "engine %d said HELLO while live; INIT deferred until it is dead",
                    engine.index,
                )
                return
            self._send_init(engine)
        # READY needs no reply: the registration on the input socket is what counts.

    def _send_init(self, engine: Engine) -> None:
        init = encode_init(
            [engine.input_advertised or self.input_advertised], [engine.output_address]
        )
        try:
            (engine.handshake or self.handshake).send_multipart(
                [engine.identity, init], zmq.NOBLOCK
            )
        except zmq.ZMQError as exc:
            self.warn("init", "engine %d: INIT not sent: %s", engine.index, exc)
            return
        engine.apply(EngineEvent.HELLO)  # a new process: no longer inherited, nor stalled
        # Connections accepted from now on belong to the process we just answered; the
        # earlier ones (its predecessor's, a stray peer's) can no longer kill it.
        engine.generation += 1
        engine.aborts = []  # a new engine process knows none of the old rids
        engine.aborted.clear()
        if self.affinity is not None:
            self.affinity.forget(engine)  # nor is anything in its (new) prefix cache
        self._forget_registration(engine)  # the old process's; the new one's is saved when it comes
        self.dirty.add(engine.row)

    def _on_input(self, sock: zmq.Socket, by_identity: dict[bytes, Engine]) -> None:
        for _ in range(DRAIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                self._on_registration(frames, by_identity)
            except Exception as exc:
                self._handler_failed(f"input from {frames[0].hex()}: frame", exc)

    def _on_registration(
        self, frames: list[bytes], by_identity: dict[bytes, Engine] | None = None
    ) -> None:
        engine = (by_identity if by_identity is not None else self.by_identity).get(frames[0])
        if engine is None or engine.state is not EngineState.HANDSHAKING or len(frames) < 2:
            self.warn("bad-input", "dropped an unexpected frame on the input socket")
            return
        try:
            registration = decode_registration(frames[-1])
        except WireDecodeError as exc:
            self.warn("bad-registration", "engine %d: bad registration: %s", engine.index, exc)
            return
        self.stats.engine_registered(engine.row, again=engine.registration is not None)
        engine.registration = registration
        engine.apply(EngineEvent.REGISTERED)
        if self.affinity is not None:
            self.affinity.registered(engine)
        engine.dead_reason = ""
        self.dirty.add(engine.row)
        log.info("engine %d registered (rank %d)", engine.index, engine.row)
        if self.state_dir is not None:
            try:
                self.state_dir.save(engine.index, engine.row, engine.output_address, registration)
            except OSError as exc:
                # Serving goes on; only a successor could not take this engine over.
                self.warn("state-dir", "engine %d: registration not saved: %s", engine.index, exc)
        self._engine_live(engine)

    def _engine_live(self, engine: Engine) -> None:
        # Taking engines over, one live engine is enough to serve: the others come back (or
        # are declared dead) one by one.
        if self.state == "handshaking":
            if self.adopting or all(e.live for e in self.engines):
                self.state = "ready"
                self._broadcast(Engines(self._engine_infos()))
        elif self.state == "ready":
            self._broadcast(EngineUpdate(self._engine_info(engine)))

    def _forget_registration(self, engine: Engine) -> None:
        """The engine is known dead (or replaced): a successor must not wait for it."""
        if self.state_dir is not None:
            try:
                self.state_dir.remove(engine.index)
            except OSError as exc:
                self.warn("state-dir", "engine %d: registration not removed: %s", engine.index, exc)

    def _on_monitor(self, engine: Engine) -> None:
        while True:
            try:
                event = recv_monitor_message(cast(zmq.Socket, engine.monitor), zmq.NOBLOCK)
            except zmq.Again:
                return
            except Exception:  # a malformed monitor message cannot come from a peer
                return
            try:
                self._on_connection_event(engine, event["event"], event["value"])
            except Exception as exc:
                self._handler_failed(f"engine {engine.index}: output connection event", exc)

    def _on_connection_event(self, engine: Engine, kind: int, fd: int) -> None:
        if kind == zmq.EVENT_DISCONNECTED:
            generation = engine.connections.pop(fd, None)
            if generation is None:
                return
            self._count("output_disconnects")
            if generation != engine.generation:
                # A connection of an earlier engine process (accepted before we sent the
                # current one its INIT): its end says nothing about the current process.
                self._count("stale_disconnects")
                return
            # Only the last connection going counts: anyone may connect to a PULL, and a
            # stray peer leaving must not kill the engine that is still connected.
            current = engine.generation
            if engine.live and current not in engine.connections.values():
                self._lost(
                    engine,
                    EngineEvent.OUTPUT_LOST,
                    "lost its output connection (exit, crash or missed heartbeat)",
                )
            return
        if kind == zmq.EVENT_ACCEPTED:
            engine.connections[fd] = engine.generation
            if engine.state is EngineState.ADOPTING:
                adoption.on_accepted(self, engine)
                return
        if (
            kind == zmq.EVENT_ACCEPTED
            and engine.state is EngineState.LOST
            and engine.row not in self.pending_hello
        ):
            # Same process, reconnected after a transient loss: it keeps its registration.
            engine.apply(EngineEvent.RECONNECTED)
            engine.dead_reason = ""
            self.dirty.add(engine.row)
            log.warning("engine %d reconnected", engine.index)

    def _lost(self, engine: Engine, event: EngineEvent, reason: str) -> None:
        # The engine's connection went, but what it sent before may still sit in its PULL
        # (frames that finish requests among them): apply all of it first, so that only what
        # was truly unfinished ends with EngineDied. Bounded, in case a peer keeps pushing.
        self._on_output(engine, limit=LOST_DRAIN)
        self._kill(engine, event, reason)

    def _kill(self, engine: Engine, event: EngineEvent, reason: str) -> None:
        # A death the engine's state has no move for is no news: it is down already (an
        # ENGINE_CORE_DEAD drained from the PULL of a lost engine, say).
        if not engine.can(event):
            return
        log.warning("engine %d is dead: %s", engine.index, reason)
        self.stats.engine_died(engine.row)
        engine.apply(event)
        engine.dead_reason = reason
        if engine.role == PREFILL:  # a prefill engine: there is a prefill group
            cast(Disaggregated, self.pd).kill(engine)
        # The records are the one account of what is in flight where; a death is rare enough
        # to find its requests by a scan rather than keep a second per-engine set.
        for slot in [s for s, r in self.records.items() if r.engine is engine]:
            record = self.records.pop(slot)
            self.writer.finish(slot, FIN_ENGINE_DEAD, engine.index)
            if record.sent:
                self._queue_abort(engine, record.rid)
            if record.prefill is not None:
                cast(Disaggregated, self.pd).forget(record, abort=True)
        engine.backlog.clear()
        engine.in_flight = 0
        engine.tail = (0, 0, 0, 0)
        if self.affinity is not None:
            self.affinity.forget(engine)
        self.dirty.add(engine.row)
        if engine.row in self.pending_hello:
            self.pending_hello.discard(engine.row)
            self._send_init(engine)

    def _fail_handshake(self) -> None:
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
        attached = any(conn.worker is not None for conn in self.workers.values())
        log.log(logging.INFO if attached else logging.ERROR, "handshake failed: %s", self.failure)
        self._broadcast(Failed(kind="timeout", error=self.failure))

    # ------------------------------------------------------------------ workers

    def _on_accept(self) -> None:
        while True:
            try:
                sock, _ = cast(socket.socket, self._listener).accept()  # bound in bind()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.warn("accept", "control accept failed: %s", exc)
                return
            sock.setblocking(False)
            conn = WorkerConn(sock)
            self.workers[sock.fileno()] = conn
            self.poller.register(sock.fileno(), zmq.POLLIN)

    def _on_control(self, conn: WorkerConn, mask: int = zmq.POLLIN) -> None:
        try:
            if mask & zmq.POLLOUT:
                self._on_control_writable(conn)
            if mask & ~zmq.POLLOUT and conn.sock.fileno() in self.workers:
                self._on_control_messages(conn)
        except Exception as exc:
            # A connection whose handling failed half-way is in no state to keep: drop it
            # (its worker sees end of file, as if we had died, and may attach again).
            self._handler_failed(f"worker {conn.worker}: control connection", exc)
            try:
                self._detach(conn)
            except Exception as again:
                self._handler_failed(f"worker {conn.worker}: detaching it", again)

    def _on_control_messages(self, conn: WorkerConn) -> None:
        try:
            messages = conn.reader.feed()
        except control.ControlError as exc:
            self.warn("bad-control", "worker %s: %s; detaching it", conn.worker, exc)
            self._detach(conn)
            return
        for message in messages:
            if isinstance(message, Attach) and conn.worker is None:
                self._attach(conn, message)
            else:
                self.warn("bad-control", "worker %s: unexpected %r", conn.worker, message)
        if conn.reader.eof:
            self._detach(conn)

    def _attach(self, conn: WorkerConn, message: Attach) -> None:
        fds = conn.reader.take_fds()
        if len(fds) != 1 or not self.free_workers:
            for fd in fds:
                os.close(fd)
            why = "no eventfd attached" if len(fds) != 1 else "every worker place is taken"
            self._send(conn, Failed(kind="refused", error=why))
            self._detach(conn)
            return
        worker = self.free_workers.pop()
        self.serial = next_serial(self.serial)
        conn.worker = worker
        conn.serial = self.serial
        conn.eventfd = fds[0]
        conn.pid = message.pid
        self.writer.reset_worker(worker)
        self.writer.set_worker_fd(worker, conn.eventfd)
        self.stats.worker_attached(worker, conn.pid)
        identity = WORKER_IDENTITY.pack(worker, conn.serial)
        self.by_submit_identity[identity] = conn
        g = self.geometry
        reply = Attached(
            worker=worker,
            serial=conn.serial,
            ticket_base=ticket_base(conn.serial),
            geometry=(g.num_workers, g.slots_per_worker, g.ring_capacity, g.max_engines),
            submit=self.submit_address,
            config=self.config.to_dict(),
            addresses=self.addresses,
        )
        if not self._send(conn, reply, [self.region.fd]):
            return
        if self.state == "ready":
            self._send(conn, Engines(self._engine_infos()))
        elif self.state == "failed":
            self._send(conn, Failed(kind="timeout", error=self.failure))
        log.info("worker %d attached (pid %d)", worker, conn.pid)

    def _detach(self, conn: WorkerConn) -> None:
        fd = conn.sock.fileno()
        if fd in self.workers:
            del self.workers[fd]
            self.poller.unregister(fd)
        conn.reader.close_fds()
        if conn.worker is not None:
            w = conn.worker
            base = w * self.spw
            for slot in range(base, base + self.spw):
                if slot in self.records:
                    self._forget(slot, abort=True)
            # Its queued sends go too: none may reach an engine, nor be mistaken for a request
            # of the next worker given this number.
            for e in self.engines:
                if e.backlog:
                    e.backlog = collections.deque(
                        p for p in e.backlog if not base <= p.slot < base + self.spw
                    )
            self.writer.reset_worker(w)
            self.stats.worker_detached(w)
            self.by_submit_identity.pop(WORKER_IDENTITY.pack(w, conn.serial), None)
            self.free_workers.append(w)
            conn.worker = None  # detached once, whatever calls this again
            log.info("worker %d detached", w)
        if conn.eventfd >= 0:
            os.close(conn.eventfd)
            conn.eventfd = -1
        conn.sock.close()

    def _send(self, conn: WorkerConn, message: ToWorker, fds: list[int] | None = None) -> bool:
        """Queue one control message and send what the socket takes now; False if the
        connection was dropped. Never blocks: what does not fit waits in ``conn.out`` and
        goes when the socket is writable, so a message is never torn."""
        data = control.pack(message)
        if conn.out:
            conn.out += data  # behind what is already waiting (fds only ride the first)
        else:
            try:
                sent = socket.send_fds(conn.sock, [data], fds) if fds else conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                if fds:  # only the first message carries fds: a fresh socket takes it
                    self._detach(conn)
                    return False
                sent = 0
            except OSError:
                self._detach(conn)
                return False
            if sent == len(data):
                return True
            conn.out += memoryview(data)[sent:]
            self.poller.modify(conn.sock.fileno(), zmq.POLLIN | zmq.POLLOUT)
        if len(conn.out) > MAX_CONTROL_BACKLOG:
            # A worker that does not read its control socket loses it; never block on it.
            self.warn(
                "control-backlog",
                "worker %s: %d bytes of control messages unread; detaching it",
                conn.worker,
                len(conn.out),
            )
            self._detach(conn)
            return False
        return True

    def _on_control_writable(self, conn: WorkerConn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._detach(conn)
            return
        del conn.out[:sent]
        if not conn.out:
            self.poller.modify(conn.sock.fileno(), zmq.POLLIN)

    def _broadcast(self, message: ToWorker) -> None:
        # Workers act on a message at once: the engine table must already say what it says.
        self._publish_dirty()
        for conn in list(self.workers.values()):
            if conn.worker is not None:
                self._send(conn, message)

    # ------------------------------------------------------------------ publishing

    def _engine_info(self, engine: Engine) -> EngineEntry:
        return EngineEntry(
            index=engine.index,
            rank=engine.row if engine.role != PREFILL else engine.row - len(self.serving),
            role=engine.role,
            output_address=engine.output_address,
            registration=engine.registration,
        )

    def _engine_infos(self) -> list[EngineEntry]:
        return [self._engine_info(e) for e in self.engines]

    def _publish_engine(self, e: Engine) -> None:
        # Every word is clamped into u32: numpy raises on an out-of-range store, and nothing
        # here may raise in the loop (the tail is range-checked on arrival; this is the
        # last line of defence).
        row = self.region.engines[e.row]
        running, waiting, active, total = e.tail
        load_ms = int(e.tail_at * 1000) if e.tail_at else 0
        row[E_INDEX] = _u32(e.index)
        row[E_IN_FLIGHT] = _u32(e.in_flight)
        row[E_RUNNING] = _u32(running)
        row[E_WAITING] = _u32(waiting)
        row[E_KV_ACTIVE] = _u32(active)
        row[E_KV_TOTAL] = _u32(total)
        row[E_LOAD_MS_LO] = load_ms & 0xFFFFFFFF
        row[E_LOAD_MS_HI] = load_ms >> 32
        row[E_REQUESTS_LO] = e.requests_total & 0xFFFFFFFF
        row[E_REQUESTS_HI] = e.requests_total >> 32
        # A stall is published as a state of its own; here it is a condition of a LIVE engine.
        row[E_STATE] = e.published_state

    # ------------------------------------------------------------------ shutdown

    def close(self, *, keep_state: bool = False) -> None:
        """End every open stream, tell the engines, release every socket, fd and mapping.

        A stop on purpose forgets the saved registrations, unless ``keep_state`` (a handover
        to a successor, e.g. for an upgrade); a start that failed never touches them.
        """
        if self.state_dir is not None:
            if self.running and not keep_state:
                try:
                    self.state_dir.clear()
                except OSError as exc:
                    log.warning("state_dir: registrations not removed: %s", exc)
            self.state_dir.close()
        for slot, record in list(self.records.items()):
            self.writer.finish(slot, FIN_IO_STOPPING, record.engine.index)
            if record.sent:
                record.engine.aborts.append(record.rid.decode("utf-8", "replace"))
            if record.prefill is not None and record.prefill_sent:
                record.prefill.aborts.append(record.rid.decode("utf-8", "replace"))
        self.records.clear()
        self.writer.wake()
        for e in self.engines:
            if e.aborts and e.live:
                self._send_aborts(e)
        for conn in list(self.workers.values()):
            self._detach(conn)
        if self._listener is not None:
            self._listener.close()
        for s in self._sockets:
            s.close(linger=200 if s is getattr(self, "input", None) else 0)
        self.ctx.term()
        del self.writer  # releases its view of the region's mapping, which closes next
        self.region.close()
