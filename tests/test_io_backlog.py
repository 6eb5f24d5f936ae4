"""The per-engine backlog of sends an engine's queue refused (unit level, one I/O loop)."""

from __future__ import annotations

import os
import socket

import zmq

from tsfront import ClientConfig, control
from tsfront.io.core import Record
from tsfront.io.engines import EngineState, PendingSend
from tsfront.io.loop import IOLoop, WorkerConn
from tsfront.ipc.control import Attach, ToWorker
from tsfront.ipc.submit import SUBMIT_HEADER
from tsfront.region import FIN_SEND_TIMEOUT


class _FullInput:
    """An input socket whose engine queue is always full."""

    def send_multipart(self, *args, **kwargs):
        raise zmq.Again()


class _Finishes:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def finish(self, slot: int, code: int, engine_index: int) -> bool:
        self.calls.append((slot, code))
        return True

    def unbind(self, slot: int) -> bool:
        return True


def test_a_reused_slot_does_not_inherit_the_aborted_requests_send_deadline():
    loop = IOLoop(ClientConfig(handshake_address="tcp://127.0.0.1:0"), "backlog-test")
    try:
        engine = loop.core.engines[0]
        loop.groups[0].input = _FullInput()
        finishes = _Finishes()
        loop.core.writer = finishes  # the native Writer goes, releasing the region's buffer
        # Request A (ticket 1) was queued on slot 5, then aborted; request B (ticket 2) took
        # the same slot on the same engine and was queued behind it with a later deadline.
        engine.backlog.append(PendingSend(5, 1, zmq.Frame(b"A"), deadline=10.0))
        engine.backlog.append(PendingSend(5, 2, zmq.Frame(b"B"), deadline=20.0))
        loop.core.records[5] = Record(b"rid-b", engine, 2)
        engine.in_flight = 1

        loop.core.retry_backlog(engine, now=15.0)  # past A's deadline, not B's

        assert finishes.calls == []  # B is not failed on A's deadline
        assert loop.core.records[5].ticket == 2
        assert [p.ticket for p in engine.backlog] == [2]

        loop.core.retry_backlog(engine, now=21.0)
        assert finishes.calls == [(5, FIN_SEND_TIMEOUT)]
        assert 5 not in loop.core.records and engine.in_flight == 0
    finally:
        # Never bound: only the native writer, the region and the context to release.
        loop.region.close()
        loop.ctx.term()


class _Writer(_Finishes):
    """The Writer calls attach, submit and detach make."""

    def bind(self, rid, slot, ticket, with_logprobs, dup_code, engine_index) -> bool:
        return True

    def unbind(self, slot: int) -> bool:
        return True

    def reset_worker(self, worker: int) -> None:
        pass

    def set_worker_fd(self, worker: int, fd: int) -> None:
        pass

    def spilling(self) -> int:
        return 0


class _Input:
    """An input socket that takes everything (after `full` is cleared)."""

    def __init__(self) -> None:
        self.full = True
        self.sent: list[bytes] = []

    def send_multipart(self, frames, *args, **kwargs):
        if self.full:
            raise zmq.Again()
        self.sent.append(bytes(frames[-1].bytes if hasattr(frames[-1], "bytes") else frames[-1]))


def _attach(loop: IOLoop) -> tuple[WorkerConn, socket.socket, int]:
    """Attach a worker over a socketpair as the real one does; (conn, its peer, first ticket)."""
    mine, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.setblocking(False)
    conn = WorkerConn(mine)
    conn.reader.fds = [os.eventfd(0, os.EFD_CLOEXEC)]
    loop.attach(conn, Attach(pid=os.getpid()))
    reader = control.MessageReader(peer, ToWorker)
    (reply,) = reader.feed()
    reader.close_fds()
    # The worker's first ticket: its range's first, or 1 where attaches had no range.
    return conn, peer, reply.ticket_base + 1


def test_a_departed_workers_queued_sends_never_reach_the_engine_nor_touch_the_next_worker():
    loop = IOLoop(ClientConfig(handshake_address="tcp://127.0.0.1:0"), "backlog-detach")
    peers = []
    try:
        engine = loop.core.engines[0]
        engine.state = EngineState.LIVE
        loop.submit_address = "ipc://@unused"  # never bound: workers here are socketpairs
        loop.groups[0].input = _Input()
        loop.core.writer = _Writer()
        # Worker A queues a request on slot 0 (the engine's queue is full), then departs.
        a, peer, a_ticket = _attach(loop)
        peers.append(peer)
        loop.core.on_add(
            a.worker, SUBMIT_HEADER.pack(0, a_ticket, 0, 0, 0.0, 0) + b"from-a", zmq.Frame(b"ADD a")
        )
        assert len(engine.backlog) == 1
        number = a.worker.number
        loop.detach(a)
        assert not engine.backlog  # purged: it can never be sent
        assert engine.aborts == [] and engine.in_flight == 0  # never sent: nothing to abort
        # Worker B gets the same number and slot; its tickets cannot be A's.
        b, peer, b_ticket = _attach(loop)
        peers.append(peer)
        assert b.worker.number == number and b_ticket != a_ticket
        loop.core.on_add(
            b.worker,
            SUBMIT_HEADER.pack(0, a_ticket, 0, 0, 0.0, 0) + b"stale",
            zmq.Frame(b"ADD stale"),
        )
        assert not loop.core.records  # a ticket outside B's range is refused
        loop.core.on_add(
            b.worker, SUBMIT_HEADER.pack(0, b_ticket, 0, 0, 0.0, 0) + b"from-b", zmq.Frame(b"ADD b")
        )
        loop.groups[0].input.full = False
        loop.core.retry_backlog(engine, now=0.0)
        assert loop.groups[0].input.sent == [b"ADD b"]
        assert loop.core.records[0].sent and engine.in_flight == 1
    finally:
        for p in peers:
            p.close()
        loop.region.close()
        loop.ctx.term()
