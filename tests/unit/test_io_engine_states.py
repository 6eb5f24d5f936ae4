"""The engine lifecycle (`tsfront.io.engines`): walked from its one table, pair by pair; and
the stall condition of a live engine, walked from its own (`STALL_TRANSITIONS`)."""

from __future__ import annotations

import itertools

import pytest
import zmq
from support.io_core import bring_live, core_rig

from tsfront.io.engines import (
    DOWN,
    STALL_TRANSITIONS,
    TRANSITIONS,
    Engine,
    EngineEvent,
    EngineState,
    InvalidTransition,
    Stall,
    StallEvent,
)
from tsfront.ipc.codes import ENGINE_DEAD, ENGINE_HANDSHAKING, ENGINE_LIVE, ENGINE_STALLED

S, E = EngineState, EngineEvent


def _engine_in(state: EngineState) -> Engine:
    """An engine brought to ``state`` along the table itself (never by assignment)."""
    paths = {
        S.ABSENT: [],
        S.HANDSHAKING: [E.HELLO],
        S.ADOPTING: [E.LOADED],
        S.LIVE: [E.HELLO, E.REGISTERED],
        S.LOST: [E.HELLO, E.REGISTERED, E.OUTPUT_LOST],
        S.DEAD: [E.HELLO, E.REGISTERED, E.CORE_DEAD],
    }
    engine = Engine(row=0, index=0)
    for event in paths[state]:
        engine.apply(event)
    assert engine.state is state
    return engine


@pytest.mark.parametrize(
    ("state", "event"), list(itertools.product(EngineState, EngineEvent)), ids=str
)
def test_every_pair_moves_as_the_table_says_or_is_refused(state, event):
    engine = _engine_in(state)
    if (state, event) in TRANSITIONS:
        assert engine.can(event)
        assert engine.apply(event) is TRANSITIONS[(state, event)]
        assert engine.state is TRANSITIONS[(state, event)]
    else:
        assert not engine.can(event)
        with pytest.raises(InvalidTransition, match=event.value):
            engine.apply(event)
        assert engine.state is state  # a refused event changes nothing


def test_every_state_is_reachable_from_absent_and_none_is_a_trap():
    reached, frontier = {S.ABSENT}, [S.ABSENT]
    while frontier:
        state = frontier.pop()
        for (source, _event), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(EngineState)
    # From every state but LIVE a HELLO starts over (a restarted process); LIVE defers it.
    for state in EngineState:
        assert ((state, E.HELLO) in TRANSITIONS) is (state is not S.LIVE)


def test_only_a_lost_output_connection_may_come_back_by_a_reconnect():
    # Deaths of a live engine: the state each leads to, and whether a reconnection revives it.
    revived = {}
    for death in (E.OUTPUT_LOST, E.INPUT_UNREACHABLE, E.CORE_DEAD):
        engine = _engine_in(S.LIVE)
        engine.apply(death)
        assert engine.state in DOWN and engine.published_state == ENGINE_DEAD
        revived[death] = engine.can(E.RECONNECTED)
    assert revived == {E.OUTPUT_LOST: True, E.INPUT_UNREACHABLE: False, E.CORE_DEAD: False}
    # Nor does one that did not come back in time after a takeover.
    engine = _engine_in(S.ADOPTING)
    engine.apply(E.EXPIRED)
    assert engine.state is S.DEAD and not engine.can(E.RECONNECTED)


def test_what_workers_see_of_each_state():
    published = {state: _engine_in(state).published_state for state in EngineState}
    assert published == {
        S.ABSENT: 0,
        S.HANDSHAKING: ENGINE_HANDSHAKING,
        S.ADOPTING: ENGINE_HANDSHAKING,
        S.LIVE: ENGINE_LIVE,
        S.LOST: ENGINE_DEAD,
        S.DEAD: ENGINE_DEAD,
    }
    engine = _engine_in(S.LIVE)
    engine.stall_move(StallEvent.SILENT, 5.0)
    assert engine.published_state == ENGINE_STALLED and engine.live  # a condition of LIVE
    engine.stall_move(StallEvent.EXPIRED)
    assert engine.published_state == ENGINE_STALLED and not engine.placeable
    engine.apply(E.OUTPUT_LOST)
    assert engine.stall is Stall.STEPPING and engine.stalled_since == 0.0
    assert engine.published_state == ENGINE_DEAD


def _stalled_engine(stall: Stall) -> Engine:
    """A live engine brought to ``stall`` along the stall table itself."""
    paths = {
        Stall.STEPPING: [],
        Stall.STALLED: [StallEvent.SILENT],
        Stall.ABANDONED: [StallEvent.SILENT, StallEvent.EXPIRED],
    }
    engine = _engine_in(S.LIVE)
    for event in paths[stall]:
        engine.stall_move(event, 1.0)
    assert engine.stall is stall
    return engine


@pytest.mark.parametrize(("stall", "event"), list(itertools.product(Stall, StallEvent)), ids=str)
def test_every_stall_pair_moves_as_its_table_says_or_is_refused(stall, event):
    engine = _stalled_engine(stall)
    if (stall, event) in STALL_TRANSITIONS:
        assert engine.stall_move(event, 2.0) is STALL_TRANSITIONS[(stall, event)]
        target = STALL_TRANSITIONS[(stall, event)]
        assert engine.stall is target
        # Placed on only while stepping; published stalled otherwise; since when, kept.
        assert engine.placeable is (target is Stall.STEPPING)
        assert (engine.published_state == ENGINE_STALLED) is (target is not Stall.STEPPING)
        assert (engine.stalled_since == 0.0) is (target is Stall.STEPPING)
    else:
        with pytest.raises(InvalidTransition, match=event.value):
            engine.stall_move(event, 2.0)
        assert engine.stall is stall


def test_a_stall_ends_only_by_output_or_by_leaving_live_and_the_deadline_fires_once():
    # From a stall there is no way back but output (or DOWN); the deadline (EXPIRED) is a move
    # of STALLED alone, so it cannot fail an engine's requests twice.
    for stall in (Stall.STALLED, Stall.ABANDONED):
        back = {e for (s, e), t in STALL_TRANSITIONS.items() if s is stall and t is Stall.STEPPING}
        assert back == {StallEvent.OUTPUT, StallEvent.DOWN}
    assert [s for (s, e) in STALL_TRANSITIONS if e is StallEvent.EXPIRED] == [Stall.STALLED]
    # Leaving LIVE, by any event of the lifecycle, clears it.
    for death in (E.OUTPUT_LOST, E.INPUT_UNREACHABLE, E.CORE_DEAD):
        engine = _stalled_engine(Stall.ABANDONED)
        engine.apply(death)
        assert engine.stall is Stall.STEPPING


def test_a_taken_over_engine_is_inherited_until_it_says_hello():
    engine = _engine_in(S.ADOPTING)
    assert engine.inherited and engine.input_pending
    engine.apply(E.RECONNECTED)
    assert engine.inherited and engine.live  # the same process: its orphans are its own
    engine.apply(E.OUTPUT_LOST)
    engine.apply(E.HELLO)
    assert not engine.inherited and not engine.input_pending  # a new process


def test_the_core_revives_a_lost_engine_on_reconnect_but_not_an_unreachable_one():
    with core_rig() as core:
        engine = core.engines[0]
        bring_live(core, engine, fd=7)
        core.on_connection(engine, zmq.EVENT_DISCONNECTED, 7)
        assert engine.state is S.LOST
        core.on_connection(engine, zmq.EVENT_ACCEPTED, 8)
        assert engine.state is S.LIVE  # the same process, back: it keeps its registration
        core.lost(engine, E.INPUT_UNREACHABLE, "input connection unreachable")
        assert engine.state is S.DEAD
        core.on_connection(engine, zmq.EVENT_ACCEPTED, 9)
        assert engine.state is S.DEAD  # an output connection says nothing of its input
