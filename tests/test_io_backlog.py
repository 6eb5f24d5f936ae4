"""The per-engine backlog of sends an engine's queue refused (unit level, one I/O loop)."""

from __future__ import annotations

import zmq

from tsfront import ClientConfig
from tsfront.io.engines import PendingSend
from tsfront.io.loop import IOLoop, Record
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


def test_a_reused_slot_does_not_inherit_the_aborted_requests_send_deadline():
    loop = IOLoop(ClientConfig(handshake_address="tcp://127.0.0.1:0"), "backlog-test")
    try:
        engine = loop.engines[0]
        loop.input = _FullInput()
        finishes = _Finishes()
        loop.writer = finishes  # the native Writer goes, releasing the region's buffer
        # Request A (ticket 1) was queued on slot 5, then aborted; request B (ticket 2) took
        # the same slot on the same engine and was queued behind it with a later deadline.
        engine.backlog.append(PendingSend(5, 1, zmq.Frame(b"A"), deadline=10.0))
        engine.backlog.append(PendingSend(5, 2, zmq.Frame(b"B"), deadline=20.0))
        loop.records[5] = Record(b"rid-b", engine, 2)
        engine.in_flight = 1

        loop._retry_backlog(engine, now=15.0)  # past A's deadline, not B's

        assert finishes.calls == []  # B is not failed on A's deadline
        assert loop.records[5].ticket == 2
        assert [p.ticket for p in engine.backlog] == [2]

        loop._retry_backlog(engine, now=21.0)
        assert finishes.calls == [(5, FIN_SEND_TIMEOUT)]
        assert 5 not in loop.records and engine.in_flight == 0
    finally:
        # Never bound: only the native writer, the region and the context to release.
        loop.region.close()
        loop.ctx.term()
