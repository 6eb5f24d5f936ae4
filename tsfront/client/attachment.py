"""`Attachment`: one worker process's connection to the I/O process: its sockets and the drain.

It owns the worker's control socket, its eventfd, its mapping of the slot region with a native
`Reader`, its submission ring (a native `Submitter`, in the same region) and a ZMQ DEALER.
Submissions go into the ring without waiting (a full ring is `Busy`); the first of an event
loop turn schedules the ring's doorbell (`Submitter.ring`) for the end of that turn, so the
submissions of one turn cost the I/O process one wake-up, not one each. One too large for the
ring, and every one made while a ZMQ submission of this worker is not yet handled (the rule
that keeps the two paths in order, DESIGN.md "The submission rings"), goes out on the DEALER,
also without waiting (a full queue is `Busy`); outputs come in through shared memory: the I/O
process writes the worker's eventfd only when the worker has published that it is parked, the
loop's reader callback drains every notified slot in one native call, hands each update to its
stream (`tsfront.client.stream.deliver_all`: pushed plain tokens written in one native pass,
the rest through `RequestStream.deliver`), and parks again. Nothing here blocks the event loop.
Which request holds which slot, until when, and the aborts are the slot table's
(`tsfront.client.slots.SlotTable`, ``Attachment.slots``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, cast

import zmq

from tsfront import _native
from tsfront.client.info import EngineInfo
from tsfront.client.slots import SlotTable
from tsfront.client.stream import RequestStream, deliver_all
from tsfront.config import ClientConfig
from tsfront.errors import (
    Busy,
    ClientClosed,
    Error,
    HandshakeError,
    HandshakeTimeout,
    IOProcessDied,
)
from tsfront.ipc import channel
from tsfront.ipc.control import Attach, Attached, Engines, EngineUpdate, Failed, ToWorker
from tsfront.ipc.region import Geometry, Region
from tsfront.ipc.submit import SUBMIT_ABORT, SUBMIT_ADD, SUBMIT_HEADER, WORKER_IDENTITY
from tsfront.metrics.recorder import Recorder, monotonic_ns

ATTACH_TIMEOUT = 30.0

# Flags of a submission's frames, as plain ints (an enum OR per frame costs microseconds).
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)

# What a worker logs is also raised to its caller (HandshakeTimeout, IOProcessDied, ...), so it
# logs at INFO: visible when asked for, never a second report of one failure. The logger keeps
# the name it had when this module was tsfront/worker.py (the README lists it).
log = logging.getLogger("tsfront.worker")


class Attachment:
    """The worker side of one attach; `EngineClient` is its public face."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.closed = False
        self.failure: Error | None = None
        #: Who holds which slot: the streams by slot and rid, the free list, deadlines, aborts.
        self.slots = SlotTable(loop)
        self.engines: list[EngineInfo] = []
        self._engines_ready = loop.create_future()
        self.sock: socket.socket | None = None
        self.eventfd = -1
        self.region: Region | None = None
        self.reader: Any = None  # this worker's _native.Reader (no stub), once attached
        self.submitter: _native.Submitter | None = None  # its submission ring, if the region has
        self.io_eventfd = -1  # the I/O process's, written when it is parked (by the Submitter)
        self._bell = False  # a record was published this turn: the doorbell is scheduled
        self.ctx: zmq.Context | None = None
        self.dealer: zmq.Socket | None = None
        self.recorder: Recorder | None = None  # this worker's request metrics (shared memory)

    # ------------------------------------------------------------------ attach

    async def open(self, address: str, timeout: float | None, *, registered: bool = True) -> None:
        """Attach to the I/O process at ``address`` and, if ``registered``, wait until every
        engine registered (`wait_registered`)."""
        try:
            name = channel.socket_name(address)
        except ValueError as exc:
            raise ClientClosed(str(exc)) from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock = sock
        try:
            sock.connect(name)
        except OSError as exc:
            sock.close()
            self.sock = None
            raise ClientClosed(
                f"no I/O process at {address!r} ({exc.strerror}); start one with IOProcess.start"
            ) from None
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        channel.send(sock, Attach(pid=os.getpid()), [self.eventfd])
        sock.setblocking(False)
        self._control = channel.MessageReader(sock, ToWorker)
        self._attached = self.loop.create_future()
        self.loop.add_reader(sock.fileno(), self._on_control)
        try:
            await asyncio.wait_for(asyncio.shield(self._attached), ATTACH_TIMEOUT)
        except Error:
            # Before TimeoutError: HandshakeTimeout is one, and its message names the cause.
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise ClientClosed(f"the I/O process at {address!r} did not answer") from None
        except BaseException:
            self.close()
            raise
        if registered:
            await self.wait_registered(timeout)

    @property
    def registered(self) -> bool:
        """Whether every engine of the group registered (the I/O process sent the list)."""
        fut = self._engines_ready
        return fut.done() and not fut.cancelled() and fut.exception() is None

    async def wait_registered(self, timeout: float | None) -> None:
        """Wait until every engine registered (at once if they have); on a timeout or a
        handshake failure the attachment is closed and the error raised."""
        try:
            if timeout is None:
                timeout = self.config.handshake_timeout + 5.0
            await asyncio.wait_for(asyncio.shield(self._engines_ready), timeout)
        except Error:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise HandshakeTimeout(
                f"engines did not all register within {timeout}s of attaching"
            ) from None
        except BaseException:
            self.close()
            raise

    def _on_attached(self, message: Attached) -> None:
        fds = self._control.take_fds()
        geometry = Geometry(*message.geometry)
        if len(fds) != (2 if geometry.submit_ring_bytes else 1):
            for fd in fds:
                os.close(fd)
            raise HandshakeError("the I/O process sent no shared memory (or no eventfd)")
        self.worker = message.worker
        self.config = ClientConfig.from_dict(message.config)
        self.addresses = message.addresses
        self.spw = geometry.slots_per_worker
        if len(fds) == 2:
            self.io_eventfd = fds[1]
        self.region = Region(fds[0], geometry)
        shape = (
            geometry.num_workers,
            geometry.slots_per_worker,
            geometry.ring_capacity,
            geometry.max_engines,
        )
        sub = geometry.submit_ring_bytes
        self.reader = _native.Reader(self.region.map, self.worker, *shape, submit_ring_bytes=sub)
        if sub:
            self.submitter = _native.Submitter(
                self.region.map, self.worker, *shape, sub, self.io_eventfd
            )
        self.recorder = Recorder(self.region, self.worker, self.spw)
        self.slots.attach(
            self.reader,
            self.recorder,
            self.spw,
            message.ticket_base,  # tickets come from this attach's own range
            self._send_aborts,
            disaggregated=self.config.routing.is_disaggregated,
        )
        self.ctx = zmq.Context(1)
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, WORKER_IDENTITY.pack(self.worker, message.serial))
        dealer.setsockopt(zmq.SNDHWM, self.config.submit_queue_depth)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(message.submit)
        self.dealer = dealer
        self.loop.add_reader(self.eventfd, self._on_wake)
        self._drain()
        log.info("attached to the I/O process as worker %d (pid %d)", self.worker, os.getpid())

    def _on_control(self) -> None:
        try:
            messages = self._control.feed()
        except channel.ControlError as exc:
            self._lost(f"the I/O process sent a bad control message: {exc}")
            return
        for message in messages:
            try:
                if isinstance(message, Attached):
                    if not self._attached.done():
                        self._on_attached(message)
                        self._attached.set_result(None)
                elif isinstance(message, Engines):
                    self.engines = [EngineInfo.from_entry(m) for m in message.engines]
                    log.info("every engine registered: %s", [e.index for e in self.engines])
                    if not self._engines_ready.done():
                        self._engines_ready.set_result(None)
                elif isinstance(message, EngineUpdate):
                    info = EngineInfo.from_entry(message.engine)
                    log.info("engine %d (rank %d) registered again", info.index, info.rank)
                    self.engines = [
                        info if (e.index, e.role) == (info.index, info.role) else e
                        for e in self.engines
                    ]
                elif isinstance(message, Failed):
                    kind = HandshakeTimeout if message.kind == "timeout" else HandshakeError
                    log.info("the I/O process reports: %s", message.error)
                    self._fail_waiters(kind(message.error or "the handshake failed"))
            except Error as exc:
                self._fail_waiters(exc)
        if self._control.eof:
            self._lost("the I/O process exited")

    def _fail_waiters(self, exc: Error) -> None:
        self.failure = exc
        for fut in (self._attached, self._engines_ready):
            if not fut.done():
                fut.set_exception(exc)

    def _lost(self, why: str) -> None:
        if self.closed:
            return
        log.info("lost the I/O process (%s); ending %d open streams", why, len(self.slots.streams))
        self._fail_waiters(ClientClosed(why))
        self.slots.fail_all(
            lambda stream: IOProcessDied(f"request {stream.rid!r}: {why}", rid=stream.rid),
            IOProcessDied(why),
        )
        self.close()

    # ------------------------------------------------------------------ outputs

    def _on_wake(self) -> None:
        try:
            os.read(self.eventfd, 8)
        except BlockingIOError:
            pass
        self._drain()

    def _drain(self) -> None:
        reader = self.reader
        refs = self.slots.refs  # weak references by local slot: no Python call per lookup
        record = self.recorder.updates if self.recorder is not None else None
        while True:
            now = monotonic_ns()
            updates = reader.poll()
            if updates:
                deliver_all(updates, refs)
                if record is not None:
                    record(updates, now)
            if reader.park():
                return

    # ------------------------------------------------------------------ submissions

    def submit(
        self,
        rid: str,
        payload: bytes,
        pin: int,
        with_logprobs: bool,
        deadline: float | None = None,
        bootstrap_at: int = 0,
        hashes: bytes | None = None,
    ) -> RequestStream:
        """Send a request's final ADD payload (and its prompt's packed block hashes, for
        prefix-affinity routing) to the I/O process; the stream that reads it.

        ``deadline``: seconds from now after which the request is aborted and its stream ends
        with `DeadlineExceeded` (None: never). ``bootstrap_at``: under disaggregated serving,
        the offset of the payload's nil bootstrap fields, which the I/O process fills in."""
        if self.closed:
            raise ClientClosed(str(self.failure) if self.failure else "the client is closed")
        taken = self.slots.take()
        if taken is None:
            raise Busy(
                f"all {self.spw} slots of this worker are in use; wait for streams to finish "
                "or raise ClientConfig.slots_per_worker"
            )
        slot, ticket = taken
        expires = time.monotonic() + deadline if deadline is not None else 0.0
        header = SUBMIT_HEADER.pack(slot, ticket, pin, with_logprobs, expires, bootstrap_at)
        header += rid.encode()
        ring = self.submitter
        if ring is not None:
            sent = ring.add(header, payload, hashes)
            if sent == _native.SUB_OK:
                if not self._bell:
                    self._schedule_bell()
                return self.slots.open(rid, slot, ticket, expires, deadline)
            if sent == _native.SUB_FULL:
                self.slots.put_back(slot)
                raise Busy(
                    "the submission ring to the I/O process is full "
                    f"(submit_ring_bytes={self.config.submit_ring_bytes}); retry later or shed "
                    "load"
                )
            # Too large for the ring, or a ZMQ submission not yet handled: over ZMQ.
        try:
            # Frame by frame with plain int flags: send_multipart costs ~7 µs more per request
            # (an enum OR per frame). Only the first frame can meet a full queue: ZMQ takes the
            # rest of a message it has started.
            send = cast(zmq.Socket, self.dealer).send  # set at attach (submit needs one)
            send(SUBMIT_ADD, _MORE)
            send(header, _MORE)
            if hashes is None:
                send(payload, _LAST, copy=False)
            else:
                send(payload, _MORE, copy=False)
                send(hashes, _LAST)
        except zmq.Again:
            self.slots.put_back(slot)
            raise Busy(
                "the local submission queue to the I/O process is full "
                f"(submit_queue_depth={self.config.submit_queue_depth}); retry later or shed "
                "load"
            ) from None
        if ring is not None:
            ring.zmq_sent()
        return self.slots.open(rid, slot, ticket, expires, deadline)

    def _schedule_bell(self) -> None:
        # The first record of this loop turn: the doorbell rings once, when the handles ready
        # now have run (call_soon queues it behind them; the loop does not block while a
        # handle is ready), so no record is left unannounced past the end of the turn that
        # published it (DESIGN.md, "The submission rings").
        self._bell = True
        self.loop.call_soon(self._ring_bell)

    def _ring_bell(self) -> None:
        self._bell = False
        if self.submitter is not None:
            self.submitter.ring()

    def _send_aborts(self, batch: bytes) -> bool:
        # The slot table's batch of abort entries; False: the queue is full, try again.
        if self.dealer is None:
            return True  # detached: the I/O process aborts what this worker held
        ring = self.submitter
        if ring is not None:
            sent = ring.abort(batch)
            if sent == _native.SUB_OK:
                if not self._bell:
                    self._schedule_bell()
                return True
            if sent == _native.SUB_FULL:
                return False
        try:
            self.dealer.send_multipart([SUBMIT_ABORT, batch], zmq.NOBLOCK)
        except zmq.Again:
            return False
        if ring is not None:
            ring.zmq_sent()
        return True

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """Detach: end every open stream, release every socket, fd and mapping (idempotent)."""
        if self.closed:
            return
        self.closed = True
        log.info(
            "detaching worker %s from the I/O process (%d open streams aborted)",
            getattr(self, "worker", None),
            len(self.slots.streams),
        )
        batch = self.slots.close()
        if batch and self.dealer is not None:
            try:
                self._send_aborts(batch)  # best effort: the detach aborts them all anyway
            except zmq.ZMQError:
                pass
        if self._bell:
            self._ring_bell()  # now: the scheduled call finds no submitter
        if self.sock is not None:
            try:
                self.loop.remove_reader(self.sock.fileno())
            except (ValueError, RuntimeError):
                pass
            self.sock.close()
        if self.eventfd >= 0:
            try:
                self.loop.remove_reader(self.eventfd)
            except (ValueError, RuntimeError):
                pass
            os.close(self.eventfd)
            self.eventfd = -1
        if self.dealer is not None:
            self.dealer.close(linger=100)
            self.dealer = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
        self.reader = None
        self.submitter = None
        if self.io_eventfd >= 0:
            os.close(self.io_eventfd)
            self.io_eventfd = -1
        self.recorder = None
        if self.region is not None:
            self.region.close()
            self.region = None
