"""The per-engine backlog of sends an engine's queue refused (unit level: the I/O core, its
ports recorded)."""

from __future__ import annotations

import zmq
from support.io_core import bring_live, core_rig

from tsfront.io.core import FULL, SENT, Record
from tsfront.io.engines import PendingSend
from tsfront.ipc.region import FIN_SEND_TIMEOUT
from tsfront.ipc.submit import SUBMIT_HEADER, ticket_base


class _Finishes:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def finish(self, slot: int, code: int, engine_index: int) -> bool:
        self.calls.append((slot, code))
        return True

    def unbind(self, slot: int) -> bool:
        return True


def test_a_reused_slot_does_not_inherit_the_aborted_requests_send_deadline():
    finishes = _Finishes()
    with core_rig(writer=finishes) as core:
        engine = core.engines[0]
        bring_live(core, engine)
        core.ports.add_status = FULL  # the engine's queue takes nothing
        # Request A (ticket 1) was queued on slot 5, then aborted; request B (ticket 2) took
        # the same slot on the same engine and was queued behind it with a later deadline.
        engine.backlog.append(PendingSend(5, 1, zmq.Frame(b"A"), deadline=10.0))
        engine.backlog.append(PendingSend(5, 2, zmq.Frame(b"B"), deadline=20.0))
        core.records[5] = Record(b"rid-b", engine, 2)
        engine.in_flight = 1

        core.retry_backlog(engine, now=15.0)  # past A's deadline, not B's

        assert finishes.calls == []  # B is not failed on A's deadline
        assert core.records[5].ticket == 2
        assert [p.ticket for p in engine.backlog] == [2]

        core.retry_backlog(engine, now=21.0)
        assert finishes.calls == [(5, FIN_SEND_TIMEOUT)]
        assert 5 not in core.records and engine.in_flight == 0


class _Writer(_Finishes):
    """The Writer calls attach, submit and detach make."""

    def bind(self, rid, slot, ticket, with_logprobs, dup_code, engine_index) -> bool:
        return True

    def reset_worker(self, worker: int) -> None:
        pass

    def set_worker_fd(self, worker: int, fd: int) -> None:
        pass

    def spilling(self) -> int:
        return 0


def test_a_departed_workers_queued_sends_never_reach_the_engine_nor_touch_the_next_worker():
    with core_rig(writer=_Writer()) as core:
        engine, ports = core.engines[0], core.ports
        bring_live(core, engine)
        ports.add_status = FULL
        # Worker A queues a request on slot 0 (the engine's queue is full), then departs.
        a = core.on_attach(pid=1, eventfd=-1)
        a_ticket = ticket_base(a.serial) + 1
        core.on_add(
            a, SUBMIT_HEADER.pack(0, a_ticket, 0, 0, 0.0, 0) + b"from-a", zmq.Frame(b"ADD a")
        )
        assert len(engine.backlog) == 1
        core.on_detach(a)
        assert not engine.backlog  # purged: it can never be sent
        assert engine.aborts == [] and engine.in_flight == 0  # never sent: nothing to abort
        # Worker B gets the same number and slot; its tickets cannot be A's.
        b = core.on_attach(pid=2, eventfd=-1)
        b_ticket = ticket_base(b.serial) + 1
        assert b.number == a.number and b_ticket != a_ticket
        core.on_add(
            b, SUBMIT_HEADER.pack(0, a_ticket, 0, 0, 0.0, 0) + b"stale", zmq.Frame(b"ADD stale")
        )
        assert not core.records  # a ticket outside B's range is refused
        core.on_add(
            b, SUBMIT_HEADER.pack(0, b_ticket, 0, 0, 0.0, 0) + b"from-b", zmq.Frame(b"ADD b")
        )
        ports.add_status = SENT
        core.retry_backlog(engine, now=0.0)
        assert ports.adds == [(engine.index, b"ADD b")]
        assert core.records[0].sent and engine.in_flight == 1
