"""The adoption rules at unit level: one `IOLoop`, an engine taken over by hand."""

from __future__ import annotations

import zmq
from test_io_handlers import _Pull, loop  # noqa: F401

from tsfront.io import adoption
from tsfront.io.state import SavedEngine
from tsfront.region import ENGINE_DEAD, ENGINE_HANDSHAKING, ENGINE_LIVE
from tsfront.wire import ENGINE_CORE_DEAD, EngineRegistration


def _adopt(loop) -> None:  # noqa: F811
    adoption.load(loop, [SavedEngine(0, 0, "ipc://@x", EngineRegistration(max_model_len=7))])


def test_a_taken_over_engine_is_live_when_its_output_connection_comes_back(loop):  # noqa: F811
    _adopt(loop)
    engine = loop.engines[0]
    assert engine.state == ENGINE_HANDSHAKING and loop.adopting
    loop._on_connection_event(engine, zmq.EVENT_ACCEPTED, 9)
    assert engine.state == ENGINE_LIVE and loop.state == "ready"
    assert engine.registration.max_model_len == 7 and engine.input_pending


def test_a_sentinel_applied_before_the_reconnection_event_keeps_the_engine_dead(loop):  # noqa: F811
    # Its ENGINE_CORE_DEAD was queued in the gap: the frame can be handled in the turn before
    # the monitor's ACCEPTED of the same connection, which must not revive it.
    _adopt(loop)
    engine = loop.engines[0]
    engine.pull = _Pull([ENGINE_CORE_DEAD])
    loop._on_output(engine)
    assert engine.state == ENGINE_DEAD
    loop._on_connection_event(engine, zmq.EVENT_ACCEPTED, 9)
    assert engine.state == ENGINE_DEAD


def test_ranks_not_back_by_the_deadline_are_dead_and_the_live_ones_serve(loop):  # noqa: F811
    _adopt(loop)
    adoption.expire(loop)
    assert loop.engines[0].state == ENGINE_DEAD and not loop.adopting
    assert "did not come back within handshake_timeout" in loop.engines[0].dead_reason
    assert loop.state == "failed"  # none live: the start fails as a handshake would
