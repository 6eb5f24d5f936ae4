"""The shell of the I/O process: one thread, one epoll (`tsfront.io.poll`), every socket.

The state and its rules are `tsfront.io.core.IOCore`; this module owns what it does not: the
sockets (one `GroupSockets` per engine group: its handshake ROUTER, its input address, a
`tsfront.io.inputs.InputPort` written and read on this thread, not a libzmq ROUTER, and each
engine's output address, a `tsfront.io.outputs.OutputPort`, not a libzmq PULL; the submit
ROUTER, the control listener and each worker's control connection), the poll, the drain
limits, the native ``ingest`` call on each output frame, the error boundary and the
rate-limited log, and `IOLoop` implements the core's `Ports` on them.

Each turn handles, in this order: engine output (decode → slot rings, in native code), worker
submissions (route, queue the payload for its engine's input connection), the handshake
socket and the input connections (registrations), the ports' new connections, the workers'
control sockets; then, once per turn, the core's `end_of_turn` (batched ABORTs, queued sends,
spilled tokens, the stall rule, the engine table), one send per engine input connection of
what the turn queued for it, and a wake of the parked workers that got news. Nothing a peer
or a worker sends can raise out of a handler: bad input is logged (rate-limited) and dropped,
and each frame (or event, or control connection) is handled inside a boundary that catches
anything else, counts it (`handler_errors`), logs it with a traceback (rate-limited) naming
the engine or worker, drops that frame and goes on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import cast

import zmq

from tsfront import _native
from tsfront.config import ClientConfig, LoadBalance
from tsfront.errors import WireDecodeError
from tsfront.io.adoption import Adoption
from tsfront.io.core import SENT, EngineGroup, IOCore, Worker
from tsfront.io.disagg import Disaggregated
from tsfront.io.engines import PREFILL, STEPPING, Engine, EngineState
from tsfront.io.inputs import InputPort
from tsfront.io.outputs import OutputPort
from tsfront.io.poll import READ, WRITE, Poll
from tsfront.io.state import StateDir
from tsfront.ipc import channel
from tsfront.ipc.control import Attach, Attached, Failed, ToIO, ToWorker
from tsfront.ipc.region import IO_METRICS, Geometry, Region
from tsfront.ipc.submit import SUBMIT_ABORT, SUBMIT_ADD, ticket_base
from tsfront.metrics.recorder import IOStats
from tsfront.wire import ABORT, ADD
from tsfront.wire.addresses import advertised, bind_socket, output_address_for

log = logging.getLogger("tsfront.io")

# Frames drained from one socket per turn, so one busy peer cannot starve the others.
DRAIN = 256
# Bytes of control messages a worker may leave unread before it is detached.
MAX_CONTROL_BACKLOG = 4 << 20
# The placement policies the native turn mirrors (native/turn.c), by its codes; any other
# (prefix affinity) places every unpinned request on the Python path.
NATIVE_POLICY = {
    LoadBalance.ROUND_ROBIN: 0,
    LoadBalance.LEAST_IN_FLIGHT: 1,
    LoadBalance.SHORTEST_QUEUE: 2,
    LoadBalance.MIN_CACHE_USAGE: 3,
}
# The I/O counters the native turn adds to itself (the metrics words of `IO_METRICS`).
NATIVE_COUNTS = ("ring_submissions", "ring_wakeups", "turns", "native_turns")
# TSFRONT_NATIVE_TURN=0: the loop waits and turns in Python only (the native turn's reference,
# for measurements and the tests that compare the two).
NATIVE_TURN = os.environ.get("TSFRONT_NATIVE_TURN", "1") != "0"


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


class WorkerConn:
    """One worker's control connection (and what waits to be sent on it); ``worker`` once
    attached."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = channel.MessageReader(sock, ToIO)
        self.out = bytearray()
        self.worker: Worker | None = None


class GroupSockets:
    """One engine group's sockets, bound alike for each group: its handshake ROUTER, its
    input port (`tsfront.io.inputs.InputPort`, a ROUTER of our own), and each engine's output
    port (by rank)."""

    def __init__(self, group: EngineGroup) -> None:
        self.group = group
        self.handshake: zmq.Socket | None = None
        self.input: InputPort | None = None
        self.outputs: list[OutputPort] = []

    def bind(self, loop: IOLoop) -> dict:
        """Bind the handshake ROUTER and the group's input and output ports; the real
        addresses."""
        c, spec = loop.config, self.group.spec
        self.handshake = hs = loop.socket(zmq.ROUTER)
        hs.setsockopt(zmq.MAXMSGSIZE, c.max_message_size)
        handshake = bind_socket(hs, spec.handshake_address)
        self.input = inp = InputPort(
            spec.input_address,
            c.max_message_size,
            c.engine_queue_depth,
            c.heartbeat_interval + c.heartbeat_timeout,
            warn=loop.warn,
            on_close=loop.forget_input,
            on_write=loop.poll_input,
        )
        self.group.input_address = advertised(inp.address, spec.handshake_address)
        for e in self.group.engines:
            rank = self.group.rank(e)
            port = OutputPort(
                output_address_for(spec.output_address, rank),
                c.heartbeat_interval,
                c.heartbeat_timeout,
                warn=loop.warn,
                on_close=loop.forget_output,
            )
            self.outputs.append(port)
            e.output_address = advertised(port.address, spec.handshake_address)
        return {
            "handshake_address": handshake,
            "input_address": self.group.input_address,
            "output_addresses": [e.output_address for e in self.group.engines],
        }


class IOLoop:
    """The I/O process's sockets and its loop around one `IOCore`; the core's `Ports`."""

    def __init__(self, config: ClientConfig, token: str) -> None:
        self.config = config
        self.token = token
        self.ctx = zmq.Context(1)
        pd = config.routing.prefill
        max_engines = config.num_engines + (pd.num_engines if pd is not None else 0)
        self.geometry = Geometry(
            num_workers=config.max_workers,
            slots_per_worker=config.slots_per_worker,
            ring_capacity=config.ring_capacity,
            max_engines=max_engines,
            submit_ring_bytes=config.submit_ring_bytes,
        )
        self.region = Region.create(self.geometry)
        shape = (config.max_workers, config.slots_per_worker, config.ring_capacity, max_engines)
        writer = _native.Writer(self.region.map, *shape, submit_ring_bytes=config.submit_ring_bytes)
        # The workers' submission rings (None: every submission comes over ZMQ), and the
        # eventfd a worker writes when it finds this process parked in its poll.
        self.intake: _native.Intake | None = None
        self.intake_fd = -1
        if config.submit_ring_bytes:
            self.intake = _native.Intake(self.region.map, *shape, config.submit_ring_bytes)
            self.intake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.warn = _RateLimitedLog()
        # Registrations kept for a successor (None: no state_dir).
        state_dir = StateDir(config) if config.state_dir else None
        self.core = core = IOCore(
            config, self, writer, self.region, IOStats(self.region), state_dir
        )
        self.adoption = Adoption(core) if state_dir is not None else None
        core.adopter = self.adoption
        self.disagg = Disaggregated(core, core.groups[1]) if pd is not None else None
        core.prefill = self.disagg
        self.groups = [GroupSockets(g) for g in core.groups]
        # Filled by bind(): each engine's output port by row, each group's input port and
        # handshake ROUTER by group number, and the reverse maps the poll loop reads: the
        # ports' listening fds and their connections' fds, to their engine (output) or group
        # (input).
        self.outputs: dict[int, OutputPort] = {}
        self.input_of: list[InputPort] = []
        self.handshake_of: list[zmq.Socket] = []
        self.input_listener: dict[int, EngineGroup] = {}
        self.input_conn: dict[int, EngineGroup] = {}
        self.inputs_due = float("inf")  # the input ports' next handshake deadline
        self.listener_engine: dict[int, Engine] = {}
        self.output_engine: dict[int, Engine] = {}
        self.outputs_due = 0.0  # the ports' next heartbeat check
        # Engines whose port holds items a drain left (its limit): drained next turn, first.
        self.backlog: dict[int, Engine] = {}
        self.conns: dict[int, WorkerConn] = {}  # by control fd
        self.conn_of: dict[int, WorkerConn] = {}  # by worker number, once attached
        self.addresses: dict = {}
        self.sockets: list[zmq.Socket] = []
        self.poller = Poll()
        # The wait and every turn that needs no Python (native/turn.c), made in bind().
        self.turn: _native.Turn | None = None
        self._listener: socket.socket | None = None
        self.running = False  # the loop has started serving (a stop may clear state_dir)

    # ------------------------------------------------------------------ setup

    def bind(self) -> dict:
        """Bind every socket; return the real addresses (reported to whoever started us)."""
        core = self.core
        if core.state_dir is not None:
            # Locked and checked before anything is bound: a second I/O process of the same
            # group must not take the addresses (an ipc:// path would be stolen, not refused).
            saved = core.state_dir.open()
            cast(Adoption, self.adoption).load(saved)  # there is one with a state_dir
        bound = [g.bind(self) for g in self.groups]
        self.submit = self.socket(zmq.ROUTER)
        self.submit.setsockopt(zmq.RCVHWM, 0)
        submit = f"ipc://@tsfront-{self.token}-submit"
        self.submit.bind(submit)
        self.submit_address = submit
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        address = f"{channel.ADDRESS_PREFIX}tsfront-{self.token}"
        listener.bind(channel.socket_name(address))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self.poller.register_zmq(self.submit)
        self.handshakes: dict[zmq.Socket, EngineGroup] = {}
        for g in self.groups:
            hs, inp = cast(zmq.Socket, g.handshake), cast(InputPort, g.input)  # bound just now
            self.handshakes[hs] = g.group
            self.handshake_of.append(hs)
            self.input_of.append(inp)
            self.input_listener[inp.listener.fileno()] = g.group
            self.poller.register(inp.listener.fileno())
            for e, port in zip(g.group.engines, g.outputs, strict=True):
                self.outputs[e.row] = port
                fd = port.listener.fileno()
                self.listener_engine[fd] = e
                self.poller.register(fd)
        for sock in self.handshakes:
            self.poller.register_zmq(sock)
        self.poller.register(listener.fileno())
        if self.intake is not None:
            self.poller.register(self.intake_fd)
        self.addresses = {"address": address, **bound[0], "pid": os.getpid()}
        if len(bound) > 1:
            self.addresses["prefill"] = bound[1]
        core.addresses = self.addresses
        for e in core.engines:
            core.publish_engine(e)
        if NATIVE_TURN:
            self.turn = self.native_turn()
        return self.addresses

    def native_turn(self) -> _native.Turn:
        """The native turn over the serving group's input lanes and the core's accounts."""
        core = self.core
        serving = cast(InputPort, self.groups[0].input)
        return _native.Turn(
            core.writer,
            self.intake,
            serving.lanes,
            self.poller.fileno(),
            self.intake_fd,
            core.records,
            core.attached,
            core.probes,
            core.counts,
            tuple((name, IO_METRICS.index(name)) for name in NATIVE_COUNTS),
            core.serving,
            core.router,
            NATIVE_POLICY.get(core.router.policy, 4),
            self.config.load_ttl,
            EngineState.LIVE,
            STEPPING,
            ADD,
            self.config.slots_per_worker,
            # Disaggregated serving fills each ADD's bootstrap fields: the Python path's.
            self.disagg is None,
        )

    def socket(self, kind: int) -> zmq.Socket:
        """A socket of this loop's context, closed with it."""
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        self.sockets.append(s)
        return s

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Serve until `Stop` is raised (SIGTERM) or the process is told to exit."""
        poll = self.poller.poll
        output_engine, listener_engine = self.output_engine, self.listener_engine
        backlog = self.backlog
        handshakes = self.handshakes
        input_conn, input_listener = self.input_conn, self.input_listener
        input_ports = [(g.group, cast(InputPort, g.input)) for g in self.groups]
        listener_fd = cast(socket.socket, self._listener).fileno()  # bound in bind()
        core = self.core
        writer = core.writer
        intake, intake_fd = self.intake, self.intake_fd
        self.running = True
        # One clock reading a turn: the end of the last turn's says how long this poll waits.
        timeout = core.timeout_ms(time.monotonic())
        turn = self.turn
        due_ready, resolve = self.poller.due_ready, self.poller.resolve
        while True:
            if turn is not None:
                # The wait and every turn that needs no Python, in native code (native/turn.c):
                # it parks the rings, places the common ADDs and ends its turns itself, and
                # returns what needs this turn (a due ZMQ socket with a message: no wait).
                ready = due_ready()
                events = resolve(turn.run(0 if ready else timeout), ready)
            else:
                # The submission rings' wake-up (DESIGN.md, "The submission rings"): parked is
                # published, then the rings re-checked, before the poll may block; a worker
                # that publishes a record after that check finds parked set and writes
                # intake_fd.
                if intake is not None and timeout and not intake.park():
                    timeout = 0
                events = poll(timeout)
            if backlog:
                for engine in list(backlog.values()):
                    del backlog[engine.row]
                    self.drain_output(engine)
            rest = []  # what is not an output connection: handled after the rings
            for sock, mask in events:
                reader = output_engine.get(sock) if type(sock) is int else None
                if reader is not None:
                    self.on_output(reader, cast(int, sock))
                else:
                    rest.append((sock, mask))
            if intake is not None:
                self.on_rings()
            for sock, mask in rest:
                if sock is self.submit:
                    self.on_submit()
                elif sock in handshakes:
                    self.on_handshake(sock, handshakes[sock])
                elif sock in input_conn:
                    self.on_input(input_conn[sock], sock, mask)
                elif sock in input_listener:
                    self.on_input_accept(input_listener[sock])
                elif sock in listener_engine:
                    self.on_output_accept(listener_engine[sock])
                elif sock == listener_fd:
                    self.on_accept()
                elif sock == intake_fd:
                    core.count("ring_wakeups")
                    try:
                        os.read(intake_fd, 8)  # the rings were read above, every turn
                    except BlockingIOError:
                        pass
                elif isinstance(sock, int) and sock in self.conns:
                    self.on_control(self.conns[sock], mask)
            core.count("turns")
            now = time.monotonic()
            if now >= self.outputs_due:
                self.tick_outputs(now)
            if now >= self.inputs_due:
                self.tick_inputs(now)
            core.end_of_turn(now)
            news = False
            for group, port in input_ports:  # what the turn queued for the engines: a send each
                port.flush()
                if port.items:
                    # A waiting connection took an identity over (the flush's write ended the
                    # first): its registration, applied now, is published by the next turn's
                    # end, which does not wait.
                    self.drain_input(group)
                    news = True
            writer.wake()
            timeout = core.timeout_ms(now)
            if backlog or news:
                timeout = 0
            else:
                due = min(self.outputs_due, self.inputs_due)
                if due - now < timeout / 1000:
                    timeout = max(0, int((due - now) * 1000) + 1)

    # ------------------------------------------------------------------ engine output

    def on_output(self, engine: Engine, fd: int) -> None:
        """Read the engine's output connection ``fd``, then apply what it brought."""
        port = self.outputs[engine.row]
        port.read(fd, time.monotonic())  # an end calls forget_output
        if port.due < self.outputs_due:  # a handshake done: its first PING is due
            self.outputs_due = port.due
        self.drain_output(engine)

    def on_output_accept(self, engine: Engine) -> None:
        """New connections on the engine's output address: polled from now on."""
        port = self.outputs[engine.row]
        for fd in port.accept(time.monotonic()):
            self.output_engine[fd] = engine
            self.poller.register(fd)
        self.outputs_due = min(self.outputs_due, port.due)  # their handshake's deadline

    def tick_outputs(self, now: float) -> None:
        """The output connections' heartbeats (`OutputPort.tick`), then what they ended."""
        due = float("inf")
        for engine in self.listener_engine.values():
            port = self.outputs[engine.row]
            if not port.connections:
                continue
            port.tick(now)  # what it drops calls forget_output
            if port.items:
                self.drain_output(engine)
            due = min(due, port.due)
        self.outputs_due = due

    def forget_output(self, fd: int) -> None:
        """An output connection is closing (`OutputPort`'s ``on_close``): out of the poll at
        once, before any accept can be given the same fd."""
        if self.output_engine.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def drain_output(self, engine: Engine, limit: int = DRAIN) -> None:
        """Apply up to ``limit`` items of the engine's output port (the core's `Ports`, too):
        frames, and its connections' events in their order; past the limit the rest waits in
        `backlog` for the next turn, which does not block."""
        take = self.outputs[engine.row].take
        core = self.core
        dead = False
        seen = False
        for _ in range(limit):
            item = take()
            if item is None:
                return
            if type(item) is tuple:
                self.on_connection(engine, *item)
                continue
            frame = cast(bytes, item)
            if dead:
                continue  # after ENGINE_CORE_DEAD: nothing more of this engine is applied
            if engine.role == PREFILL:
                # Decoded here, never written to a slot; there is a prefill group (self.disagg).
                try:
                    dead = not cast(Disaggregated, self.disagg).on_frame(engine, frame)
                except WireDecodeError as exc:
                    self.warn(
                        "bad-output", "engine %d: dropped an output frame: %s", engine.index, exc
                    )
                except Exception as exc:
                    core.handler_failed(f"prefill engine {engine.index}: output frame", exc)
                continue
            if not seen:
                # Any frame says the engine steps (the stall rule's clock; one reading a drain).
                seen = True
                core.on_output_seen(engine, time.monotonic())
            try:
                result = core.writer.ingest(frame, engine.index, engine.row)  # + its tail
                core.on_output(engine, result, frame)
                dead = result is None  # ENGINE_CORE_DEAD: the engine is dead
            except WireDecodeError as exc:
                self.warn("bad-output", "engine %d: dropped an output frame: %s", engine.index, exc)
            except Exception as exc:
                core.handler_failed(f"engine {engine.index}: output frame", exc)
        if self.outputs[engine.row].items:
            self.backlog[engine.row] = engine

    def on_connection(self, engine: Engine, kind: int, conn: int) -> None:
        """An output connection of the engine began (its handshake done) or ended."""
        try:
            self.core.on_connection(engine, kind, conn)
        except Exception as exc:
            self.core.handler_failed(f"engine {engine.index}: output connection event", exc)

    # ------------------------------------------------------------------ submissions

    def on_rings(self, worker: int = -1, limit: int = DRAIN) -> None:
        """Take the records of every worker's submission ring (or of one), to the core."""
        core = self.core
        attached, count = core.attached, core.count
        for number, kind, a, b, c in cast(_native.Intake, self.intake).take(limit, worker):
            w = attached.get(number)
            if w is None:
                continue  # cannot happen: the intake reads only attached workers' rings
            try:
                if kind == _native.SUB_ADD:
                    count("ring_submissions")
                    core.on_add(w, cast(bytes, a), cast(bytes, b), c)
                elif kind == _native.SUB_ABORT:
                    count("ring_submissions")
                    core.on_abort(w, cast(bytes, a))
                else:
                    count("bad_ring_records")
                    self.warn(
                        "bad-submit",
                        "worker %s: submission ring: %s; dropped what it held",
                        number,
                        a,
                    )
            except Exception as exc:
                core.handler_failed(f"worker {number}: submission", exc)

    def on_submit(self) -> None:
        """Drain the submit ROUTER: each worker's ADDs and ABORTs, to the core.

        With submission rings, a worker's ring is drained before each of its ZMQ submissions
        is handled, and the handled count published after (`Intake.applied`): the worker
        sends over ZMQ while that count is behind, so its submissions are applied in the
        order it made them, whichever path each took (DESIGN.md, "The submission rings")."""
        recv = self.submit.recv_multipart
        core = self.core
        intake = self.intake
        self.poller.touched(self.submit)  # its events are read again before the next wait
        for _ in range(DRAIN):
            try:
                frames = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            worker = core.submitter(frames[0].bytes)
            if worker is None or len(frames) < 3:
                late = len(frames) == 3 and frames[1].bytes == SUBMIT_ABORT
                if late and core.is_late_abort(frames[0].bytes):
                    log.debug("dropped the last aborts of a detached worker")
                    continue
                self.warn("bad-submit", "dropped a submission from an unknown or stale worker")
                if worker is not None and intake is not None:
                    self.on_rings(worker.number, 1 << 30)
                    intake.applied(worker.number)
                continue
            core.count("zmq_submissions")
            if intake is not None:
                # Every record the worker put in its ring before this one goes first.
                self.on_rings(worker.number, 1 << 30)
            try:
                kind = frames[1].bytes
                if kind == SUBMIT_ADD and len(frames) in (4, 5):
                    # A fifth frame: the prompt's block hashes (prefix-affinity routing).
                    hashes = frames[4] if len(frames) == 5 else None
                    core.on_add(worker, frames[2].bytes, frames[3], hashes)
                elif kind == SUBMIT_ABORT:
                    core.on_abort(worker, frames[2].bytes)
                else:
                    self.warn(
                        "bad-submit", "dropped a malformed submission from worker %s", worker.number
                    )
            except Exception as exc:
                core.handler_failed(f"worker {worker.number}: submission", exc)
            if intake is not None:
                intake.applied(worker.number)

    # ------------------------------------------------------------------ Ports

    def send_add(self, engine: Engine, payload: zmq.Frame | bytes) -> int:
        """`Ports.send_add` through the engine's group's input port (sent at the turn's end)."""
        data = payload if isinstance(payload, bytes) else payload.buffer
        return self.input_of[engine.group].send(engine.identity, ADD, data)

    def send_abort(self, engine: Engine, payload: bytes) -> bool:
        """`Ports.send_abort`: False if the port refused it (kept for the next turn)."""
        return self.input_of[engine.group].send(engine.identity, ABORT, payload) == SENT

    def send_init(self, engine: Engine, payload: bytes) -> bool:
        """`Ports.send_init` on the engine's group's handshake ROUTER."""
        sock = self.handshake_of[engine.group]
        self.poller.touched(sock)
        try:
            sock.send_multipart([engine.identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.warn("init", "engine %d: INIT not sent: %s", engine.index, exc)
            return False
        return True

    def send_control(self, worker: int, message: ToWorker, fds: list[int] | None = None) -> bool:
        """`Ports.send_control`: to the attached worker ``worker``."""
        conn = self.conn_of.get(worker)
        return conn is not None and self.send(conn, message, fds)

    # ------------------------------------------------------------------ handshake

    def on_handshake(self, sock: zmq.Socket, group: EngineGroup) -> None:
        """Drain a group's handshake ROUTER into the core."""
        self.poller.touched(sock)
        for _ in range(DRAIN):
            try:
                msgs = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            frames = [m.bytes for m in msgs]
            try:
                # Where the engine dialled from: a prefill engine's default bootstrap host.
                try:
                    # pyzmq's stub types get() as int | str; a string property is a str.
                    peer = cast(str, msgs[-1].get("Peer-Address")) or ""
                except zmq.ZMQError:
                    peer = ""
                self.core.on_hello(group, frames, peer)
            except Exception as exc:
                self.core.handler_failed(f"handshake from {frames[0].hex()}: frame", exc)

    def on_input(self, group: EngineGroup, fd: int, mask: int) -> None:
        """An input connection of the group is writable or readable: what it holds goes, what
        it sent (registrations) goes to the core."""
        port = self.input_of[group.number]
        if mask & WRITE:
            port.writable(fd)
        if mask & ~WRITE and fd in port.connections:
            port.read(fd)  # an end calls forget_input
        self.drain_input(group)

    def drain_input(self, group: EngineGroup) -> None:
        """What the group's input connections sent (registrations), to the core."""
        take = self.input_of[group.number].take
        while (frames := take()) is not None:
            try:
                self.core.on_registration(group, frames)
            except Exception as exc:
                self.core.handler_failed(f"input from {frames[0].hex()}: frame", exc)

    def on_input_accept(self, group: EngineGroup) -> None:
        """New connections on the group's input address: polled from now on."""
        port = self.input_of[group.number]
        for fd in port.accept(time.monotonic()):
            self.input_conn[fd] = group
            if fd not in self.poller.masks:  # its greeting may have asked for WRITE already
                self.poller.register(fd)
        self.inputs_due = min(self.inputs_due, port.due)  # their handshake's deadline

    def tick_inputs(self, now: float) -> None:
        """Drop the input connections past their handshake's deadline (`InputPort.tick`)."""
        due = float("inf")
        for port in self.input_of:
            port.tick(now)
            due = min(due, port.due)
        self.inputs_due = due

    def forget_input(self, fd: int) -> None:
        """An input connection is closing (`InputPort`'s ``on_close``): out of the poll."""
        if self.input_conn.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def poll_input(self, fd: int, wanted: bool) -> None:
        """`InputPort`'s ``on_write``: poll connection ``fd`` for writing too, or no more."""
        self.poller.want(fd, READ | WRITE if wanted else READ)

    # ------------------------------------------------------------------ workers

    def on_accept(self) -> None:
        """Accept the control connections waiting on the listener."""
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
            self.conns[sock.fileno()] = conn
            self.poller.register(sock.fileno())

    def on_control(self, conn: WorkerConn, mask: int = READ) -> None:
        """A worker's control connection is readable or writable (inside the boundary)."""
        try:
            if mask & WRITE:
                self.on_control_writable(conn)
            if mask & ~WRITE and conn.sock.fileno() in self.conns:
                self.on_control_messages(conn)
        except Exception as exc:
            # A connection whose handling failed half-way is in no state to keep: drop it
            # (its worker sees end of file, as if we had died, and may attach again).
            number = conn.worker.number if conn.worker is not None else None
            self.core.handler_failed(f"worker {number}: control connection", exc)
            try:
                self.detach(conn)
            except Exception as again:
                self.core.handler_failed(f"worker {number}: detaching it", again)

    def on_control_messages(self, conn: WorkerConn) -> None:
        """Read what the worker sent: an `Attach`, or its end of file."""
        number = conn.worker.number if conn.worker is not None else None
        try:
            messages = conn.reader.feed()
        except channel.ControlError as exc:
            self.warn("bad-control", "worker %s: %s; detaching it", number, exc)
            self.detach(conn)
            return
        for message in messages:
            if isinstance(message, Attach) and conn.worker is None:
                self.attach(conn, message)
            else:
                self.warn("bad-control", "worker %s: unexpected %r", number, message)
        if conn.reader.eof:
            self.detach(conn)

    def attach(self, conn: WorkerConn, message: Attach) -> None:
        """Give the worker a place (the core's), the region and where the group stands."""
        fds = conn.reader.take_fds()
        worker = self.core.on_attach(message.pid, fds[0]) if len(fds) == 1 else None
        if worker is None:
            for fd in fds:
                os.close(fd)
            why = "no eventfd attached" if len(fds) != 1 else "every worker place is taken"
            self.send(conn, Failed(kind="refused", error=why))
            self.detach(conn)
            return
        conn.worker = worker
        self.conn_of[worker.number] = conn
        g = self.geometry
        fds = [self.region.fd]
        if self.intake is not None:
            # Reset before the worker can see the region: nothing its place's last worker left
            # (a record half-written when it died) is read.
            self.intake.open(worker.number)
            fds.append(self.intake_fd)
        reply = Attached(
            worker=worker.number,
            serial=worker.serial,
            ticket_base=ticket_base(worker.serial),
            geometry=(
                g.num_workers,
                g.slots_per_worker,
                g.ring_capacity,
                g.max_engines,
                g.submit_ring_bytes,
            ),
            submit=self.submit_address,
            config=self.config.to_dict(),
            addresses=self.addresses,
        )
        if not self.send(conn, reply, fds):
            return
        self.core.welcome(worker)
        log.info("worker %d attached (pid %d)", worker.number, worker.pid)

    def detach(self, conn: WorkerConn) -> None:
        """Drop a control connection; an attached worker's requests end (the core's)."""
        fd = conn.sock.fileno()
        if fd in self.conns:
            del self.conns[fd]
            self.poller.unregister(fd)
        conn.reader.close_fds()
        worker = conn.worker
        if worker is not None:
            conn.worker = None  # detached once, whatever calls this again
            self.conn_of.pop(worker.number, None)
            if self.intake is not None:
                self.intake.close(worker.number)
            self.core.on_detach(worker)
            if worker.eventfd >= 0:
                os.close(worker.eventfd)
                worker.eventfd = -1
        conn.sock.close()

    def send(self, conn: WorkerConn, message: ToWorker, fds: list[int] | None = None) -> bool:
        """Queue one control message and send what the socket takes now; False if the
        connection was dropped. Never blocks: what does not fit waits in ``conn.out`` and
        goes when the socket is writable, so a message is never torn."""
        data = channel.pack(message)
        if conn.out:
            conn.out += data  # behind what is already waiting (fds only ride the first)
        else:
            try:
                sent = socket.send_fds(conn.sock, [data], fds) if fds else conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                if fds:  # only the first message carries fds: a fresh socket takes it
                    self.detach(conn)
                    return False
                sent = 0
            except OSError:
                self.detach(conn)
                return False
            if sent == len(data):
                return True
            conn.out += memoryview(data)[sent:]
            self.poller.modify(conn.sock.fileno(), READ | WRITE)
        if len(conn.out) > MAX_CONTROL_BACKLOG:
            # A worker that does not read its control socket loses it; never block on it.
            self.warn(
                "control-backlog",
                "worker %s: %d bytes of control messages unread; detaching it",
                conn.worker.number if conn.worker is not None else None,
                len(conn.out),
            )
            self.detach(conn)
            return False
        return True

    def on_control_writable(self, conn: WorkerConn) -> None:
        """Send what waits in the connection's buffer."""
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.detach(conn)
            return
        del conn.out[:sent]
        if not conn.out:
            self.poller.modify(conn.sock.fileno(), READ)

    # ------------------------------------------------------------------ shutdown

    def close(self, *, keep_state: bool = False) -> None:
        """End every open stream, tell the engines, release every socket, fd and mapping.

        A stop on purpose forgets the saved registrations, unless ``keep_state`` (a handover
        to a successor, e.g. for an upgrade); a start that failed never touches them.
        """
        state_dir = self.core.state_dir
        if state_dir is not None:
            if self.running and not keep_state:
                try:
                    state_dir.clear()
                except OSError as exc:
                    log.warning("state_dir: registrations not removed: %s", exc)
            state_dir.close()
        self.core.close()
        for conn in list(self.conns.values()):
            self.detach(conn)
        if self._listener is not None:
            self._listener.close()
        for port in self.outputs.values():
            port.close()
        for g in self.groups:
            if g.input is not None:
                g.input.close(linger=0.2)  # the ABORTs just queued, as the ROUTER's LINGER
        self.poller.close()
        for s in self.sockets:
            s.close(linger=0)
        self.ctx.term()
        # Releases the writer's view of the region's mapping, which closes next.
        self.core.writer = None  # type: ignore[assignment]
        self.intake = None
        if self.intake_fd >= 0:
            os.close(self.intake_fd)
            self.intake_fd = -1
        self.region.close()
