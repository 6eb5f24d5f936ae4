"""The adoption rules at unit level: the I/O core (its ports recorded) and its `Adoption`,
engines taken over from a predecessor's saved registrations."""

from __future__ import annotations

import zmq
from support.io_core import core_rig
from test_io_handlers import _rows_frame

from tsfront import ClientConfig, _native
from tsfront.io.adoption import Adoption
from tsfront.io.core import IOCore, Record
from tsfront.io.state import SavedEngine
from tsfront.ipc.region import ENGINE_DEAD, ENGINE_HANDSHAKING, ENGINE_LIVE, FIN_DUPLICATE
from tsfront.wire import ENGINE_CORE_DEAD, EngineRegistration


def _adopt(core: IOCore, ranks: int = 1) -> Adoption:
    # The shell makes an Adoption when it has a state directory; here the test does.
    core.adopter = adoption = Adoption(core)
    saved = EngineRegistration(max_model_len=7)
    adoption.load([SavedEngine(i, i, f"ipc://@x{i}", saved) for i in range(ranks)])
    return adoption


def _output(core: IOCore, engine, frame: bytes) -> None:
    # What the shell does with one frame of the engine's PULL.
    core.on_output(engine, core.writer.ingest(frame, engine.index), frame)


def test_a_taken_over_engine_is_live_when_its_output_connection_comes_back():
    with core_rig() as core:
        _adopt(core)
        engine = core.engines[0]
        assert engine.published_state == ENGINE_HANDSHAKING and core.adopting
        core.on_connection(engine, zmq.EVENT_ACCEPTED, 9)
        assert engine.published_state == ENGINE_LIVE and core.state == "ready"
        assert engine.registration.max_model_len == 7 and engine.input_pending


def test_a_sentinel_applied_before_the_reconnection_event_keeps_the_engine_dead():
    # Its ENGINE_CORE_DEAD was queued in the gap: the frame can be handled in the turn before
    # the monitor's ACCEPTED of the same connection, which must not revive it.
    with core_rig() as core:
        _adopt(core)
        engine = core.engines[0]
        _output(core, engine, ENGINE_CORE_DEAD)
        assert engine.published_state == ENGINE_DEAD
        core.on_connection(engine, zmq.EVENT_ACCEPTED, 9)
        assert engine.published_state == ENGINE_DEAD


def test_ranks_not_back_by_the_deadline_are_dead_and_the_live_ones_serve():
    with core_rig() as core:
        adoption = _adopt(core)
        core.end_of_turn(core.deadline)  # handshake_timeout after the start
        assert core.engines[0].published_state == ENGINE_DEAD and not core.adopting
        assert "did not come back within handshake_timeout" in core.engines[0].dead_reason
        assert core.state == "failed"  # none live: the start fails as a handshake would
        adoption.expire()  # again: nothing left to expire, nothing changes
        assert core.state == "failed"


def test_rows_of_an_adopted_engine_for_a_rid_bound_to_another_engine_are_its_orphans():
    # The predecessor sent "x" to rank 1; this process bound a new "x" to rank 0. Rank 1's rows
    # for it are unknown (they never reach rank 0's slot) and its "x" is aborted there alone.
    with core_rig(ClientConfig(handshake_address="tcp://127.0.0.1:0", num_engines=2)) as core:
        _adopt(core, ranks=2)
        rank0, rank1 = core.engines
        g = core.region.geometry
        reader = _native.Reader(
            core.region.map, 0, g.num_workers, g.slots_per_worker, g.ring_capacity, g.max_engines
        )
        reader.expect(0, 1)
        assert core.writer.bind(b"x", 0, 1, False, FIN_DUPLICATE, rank0.index)
        core.records[0] = Record(b"x", rank0, 1, sent=True)
        _output(core, rank1, _rows_frame("x", [666], 1))
        assert rank1.aborts == ["x"] and rank0.aborts == []
        assert core.counts["orphan_aborts"] == 1
        assert reader.poll() == []
        # Rank 0's own rows for it are its stream's, not orphans.
        _output(core, rank0, _rows_frame("x", [5], 1))
        assert rank0.aborts == [] and core.counts["orphan_aborts"] == 1
        assert [u[1] for u in reader.poll()] == [[5]]
        del reader
