"""The adoption rules at unit level: one `IOLoop`, an engine taken over by hand."""

from __future__ import annotations

import zmq
from test_io_handlers import _Pull, _rows_frame, loop  # noqa: F401

from tsfront import ClientConfig, _native
from tsfront.io.adoption import Adoption
from tsfront.io.core import Record
from tsfront.io.loop import IOLoop
from tsfront.io.state import SavedEngine
from tsfront.region import ENGINE_DEAD, ENGINE_HANDSHAKING, ENGINE_LIVE, FIN_DUPLICATE
from tsfront.wire import ENGINE_CORE_DEAD, EngineRegistration


def _adopt(loop) -> None:  # noqa: F811
    # A loop without a state directory has no adopter: give its core one.
    loop.core.adopter = Adoption(loop.core)
    loop.core.adopter.load([SavedEngine(0, 0, "ipc://@x", EngineRegistration(max_model_len=7))])


def test_a_taken_over_engine_is_live_when_its_output_connection_comes_back(loop):  # noqa: F811
    _adopt(loop)
    engine = loop.core.engines[0]
    assert engine.published_state == ENGINE_HANDSHAKING and loop.core.adopting
    loop.core.on_connection(engine, zmq.EVENT_ACCEPTED, 9)
    assert engine.published_state == ENGINE_LIVE and loop.core.state == "ready"
    assert engine.registration.max_model_len == 7 and engine.input_pending


def test_a_sentinel_applied_before_the_reconnection_event_keeps_the_engine_dead(loop):  # noqa: F811
    # Its ENGINE_CORE_DEAD was queued in the gap: the frame can be handled in the turn before
    # the monitor's ACCEPTED of the same connection, which must not revive it.
    _adopt(loop)
    engine = loop.core.engines[0]
    engine.pull = _Pull([ENGINE_CORE_DEAD])
    loop.drain_output(engine)
    assert engine.published_state == ENGINE_DEAD
    loop.core.on_connection(engine, zmq.EVENT_ACCEPTED, 9)
    assert engine.published_state == ENGINE_DEAD


def test_ranks_not_back_by_the_deadline_are_dead_and_the_live_ones_serve(loop):  # noqa: F811
    _adopt(loop)
    loop.core.adopter.expire()
    assert loop.core.engines[0].published_state == ENGINE_DEAD and not loop.core.adopting
    assert "did not come back within handshake_timeout" in loop.core.engines[0].dead_reason
    assert loop.core.state == "failed"  # none live: the start fails as a handshake would


def test_rows_of_an_adopted_engine_for_a_rid_bound_to_another_engine_are_its_orphans():
    # The predecessor sent "x" to rank 1; this process bound a new "x" to rank 0. Rank 1's rows
    # for it are unknown (they never reach rank 0's slot) and its "x" is aborted there alone.
    io_loop = IOLoop(ClientConfig(handshake_address="tcp://127.0.0.1:0", num_engines=2), "adopt-2")
    try:
        saved = EngineRegistration(max_model_len=7)
        io_loop.core.adopter = adopter = Adoption(io_loop.core)
        adopter.load([SavedEngine(i, i, f"ipc://@x{i}", saved) for i in (0, 1)])
        rank0, rank1 = io_loop.core.engines
        g = io_loop.geometry
        reader = _native.Reader(
            io_loop.region.map, 0, g.num_workers, g.slots_per_worker, g.ring_capacity, g.max_engines
        )
        reader.expect(0, 1)
        assert io_loop.core.writer.bind(b"x", 0, 1, False, FIN_DUPLICATE, rank0.index)
        io_loop.core.records[0] = Record(b"x", rank0, 1, sent=True)
        rank1.pull = _Pull([_rows_frame("x", [666], 1)])
        io_loop.drain_output(rank1)
        assert rank1.aborts == ["x"] and rank0.aborts == []
        assert io_loop.core.counts["orphan_aborts"] == 1
        assert reader.poll() == []
        # Rank 0's own rows for it are its stream's, not orphans.
        rank0.pull = _Pull([_rows_frame("x", [5], 1)])
        io_loop.drain_output(rank0)
        assert rank0.aborts == [] and io_loop.core.counts["orphan_aborts"] == 1
        assert [u[1] for u in reader.poll()] == [[5]]
    finally:
        io_loop.core.writer = None
        io_loop.region.close()
        io_loop.ctx.term()
