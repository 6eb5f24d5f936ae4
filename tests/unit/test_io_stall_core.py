"""A stalled engine in the I/O core (no sockets: `IOCore` over a real region and native writer,
its ports recorded, a worker's `Reader` reading the slots): the probe of the I/O process's own,
the bound past which a stalled engine's streams fail with `EngineStalled`, and placement.

Time is the core's own argument (`IOCore.end_of_turn(now)`), so every step is exact: no sleep,
no real timeout waited for.
"""

from __future__ import annotations

import time

import pytest
import zmq
from support.io_core import bring_live, core_rig

from tsfront import ClientConfig, EngineGroup, LoadBalance, Routing, _native
from tsfront.io.core import FULL, SENT, UNREACHABLE
from tsfront.io.disagg import Disaggregated
from tsfront.io.engines import Stall
from tsfront.io.probes import PROBE_PREFIX
from tsfront.ipc.region import (
    E_STATE,
    ENGINE_LIVE,
    ENGINE_STALLED,
    FIN_DUPLICATE,
    FIN_ENGINE_STALLED,
    FIN_NO_ENGINE,
)
from tsfront.ipc.submit import SUBMIT_HEADER, ticket_base
from tsfront.wire import (
    BatchTokenIDOutSlim,
    decode_abort,
    decode_add,
    encode_output,
    validate_request,
)

STALL = 30.0  # stall_timeout
FAIL = 100.0  # stall_fail_timeout


def _config(**extra) -> ClientConfig:
    values = {
        "handshake_address": "tcp://127.0.0.1:0",
        "num_engines": 2,
        "stall_timeout": STALL,
        "stall_fail_timeout": FAIL,
        "max_workers": 2,
        "slots_per_worker": 16,
        **extra,
    }
    return ClientConfig(**values)


class Rig:
    """A core with every engine live, one attached worker and its reader."""

    def __init__(self, core) -> None:
        self.core = core
        self.ports = core.ports
        for i, e in enumerate(core.engines):
            bring_live(core, e, fd=10 + i)
        self.worker = core.on_attach(pid=1, eventfd=-1)
        g = core.region.geometry
        self.reader = _native.Reader(
            core.region.map,
            self.worker.number,
            g.num_workers,
            g.slots_per_worker,
            g.ring_capacity,
            g.max_engines,
        )
        self.next_local = 0
        # The origin of `turn`: the latest ADD (each one moves it), so that the engine's busy
        # time, read from the real clock, is never after it however slow the machine is.
        self.t0 = time.monotonic()

    def add(self, rid: str, pin: int = -1, payload: bytes | None = None) -> int:
        """A worker's ADD of ``rid``; its local slot."""
        local = self.next_local
        self.next_local += 1
        ticket = ticket_base(self.worker.serial) + 1 + local
        self.reader.expect(local, ticket)
        header = SUBMIT_HEADER.pack(local, ticket, pin, 0, 0.0, 0) + rid.encode()
        self.core.on_add(self.worker, header, zmq.Frame(payload or f"ADD {rid}".encode()))
        self.t0 = time.monotonic()
        return local

    def turn(self, after: float) -> None:
        """One end of turn, ``after`` seconds after the latest ADD (or the rig's making)."""
        self.core.end_of_turn(self.t0 + after)

    def ends(self) -> dict[int, tuple[int, int]]:
        """Local slot → (finish code, engine index) of every slot that ended since last read."""
        return {u[0]: (u[4], u[8]) for u in self.reader.poll() if u[4]}

    def probes_to(self, index: int) -> list[bytes]:
        """The probes sent to engine ``index`` (their rids), in order."""
        out = []
        for at, payload in self.ports.adds:
            if at == index and payload.startswith(b"\xdc"):  # an encoded request, not "ADD .."
                out.append(decode_add(payload).rid.encode())
        return out

    def output(self, engine, rid: bytes, tokens: list[int], finish: str = "") -> None:
        """One output frame of ``engine`` with one row, drained as the shell drains."""
        frame = encode_output(
            BatchTokenIDOutSlim(
                [rid.decode()], [tokens], [finish], [1], [len(tokens)], [0], [[]], [[]], 0
            )
        )
        self.ports.output[engine.row] = [frame]
        self.ports.drain_output(engine, 10)


def _added_to(rig: Rig, index: int) -> list[bytes]:
    return [p for at, p in rig.ports.adds if at == index and not p.startswith(b"\xdc")]


# ------------------------------------------------------------------------------ the probe


def test_a_stalled_engine_is_probed_by_a_request_of_the_io_process_and_its_output_clears_it():
    with core_rig(_config()) as core:
        rig = Rig(core)
        stuck = core.engines[1]
        rig.add("held", pin=1)
        rig.turn(STALL - 1)
        assert stuck.stall is Stall.STEPPING and rig.probes_to(1) == []
        rig.turn(STALL + 0.5)
        assert stuck.stall is Stall.STALLED
        assert core.region.engines[1][E_STATE] == ENGINE_STALLED  # what /health shows
        # The probe: the I/O process's own request, one token of id 0 asked for one token.
        [rid] = rig.probes_to(1)
        assert rid.startswith(f"{PROBE_PREFIX}1-".encode()) and rid != b"held"
        probe = decode_add(next(p for at, p in rig.ports.adds if at == 1 and rid in p))
        assert probe.input_ids == [0] and probe.sampling_params.max_new_tokens == 1
        validate_request(probe, max_model_len=stuck.registration.max_model_len)
        assert stuck.in_flight == 1  # the client's request only: a probe is not load
        # One outstanding: no second probe before this one has gone unanswered for STALL.
        rig.turn(STALL + 10)
        assert rig.probes_to(1) == [rid]
        # Its answer reaches no slot (its rid is bound to none) and clears the stall; the
        # client's request, kept, goes on.
        unknown = core.writer.stats()["unknown_rows"]
        rig.output(stuck, rid, [7], "length")
        assert core.writer.stats()["unknown_rows"] == unknown + 1
        assert rig.reader.poll() == []
        assert stuck.stall is Stall.STEPPING and stuck.placeable and stuck.probe is None
        assert rid.decode() in stuck.aborts  # aborted: harmless if it had ended, as it had
        assert 0 in core.records and not core.probes
        core.publish_dirty()
        assert core.region.engines[1][E_STATE] == ENGINE_LIVE
        assert core.region.metrics()["stall_probes"] == 1


def test_an_unanswered_probe_is_superseded_and_aborted_and_any_output_clears_the_stall():
    with core_rig(_config()) as core:
        rig = Rig(core)
        stuck = core.engines[0]
        rig.add("a", pin=0)
        rig.turn(STALL)
        [first] = rig.probes_to(0)
        rig.turn(2 * STALL)  # unanswered for stall_timeout: a fresh one, the old one aborted
        assert rig.probes_to(0) == [first, rig.probes_to(0)[1]]
        second = rig.probes_to(0)[1]
        assert first.decode() in stuck.aborts and list(core.probes) == [second]
        rig.turn(2 * STALL + 1)  # the aborts leave at the next end of turn
        sent = [decode_abort(payload) for at, payload in rig.ports.aborts if at == 0]
        assert [first.decode()] in sent
        # Output of the client's request (not the probe's) clears it too; the probe goes.
        rig.output(stuck, b"a", [5])
        assert stuck.stall is Stall.STEPPING and second.decode() in stuck.aborts
        assert rig.reader.poll()[0][1] == [5]


def test_a_probe_the_engine_input_refuses_is_tried_again_and_an_unreachable_input_kills():
    with core_rig(_config()) as core:
        rig = Rig(core)
        stuck = core.engines[1]
        rig.add("a", pin=1)
        rig.ports.add_status = FULL
        rig.turn(STALL)
        assert stuck.stall is Stall.STALLED and stuck.probe is None  # nothing queued for it
        rig.ports.add_status = SENT
        rig.turn(STALL + 1)  # the next check
        assert len(rig.probes_to(1)) == 1 and stuck.probe is not None
        rig.ports.add_status = UNREACHABLE
        rig.turn(2 * STALL + 2)  # superseding it finds the input gone: the engine is dead
        assert not stuck.live and rig.ends() == {0: (_native.FIN_ENGINE_DEAD, 1)}
        assert stuck.probe is None and not core.probes


def test_a_worker_add_reusing_a_probes_rid_is_refused_and_never_sent():
    with core_rig(_config()) as core:
        rig = Rig(core)
        rig.add("a", pin=1)
        rig.turn(STALL)
        [rid] = rig.probes_to(1)
        local = rig.add(rid.decode())
        assert rig.ends() == {local: (FIN_DUPLICATE, -1)}
        assert _added_to(rig, 0) == [] and core.engines[1].probe.rid == rid


def test_death_and_rehandshake_of_a_stalled_engine_clear_the_stall_and_its_probe():
    with core_rig(_config()) as core:
        rig = Rig(core)
        stuck = core.engines[1]
        rig.add("a", pin=1)
        rig.turn(STALL)
        [rid] = rig.probes_to(1)
        core.on_connection(stuck, zmq.EVENT_DISCONNECTED, 11)
        assert stuck.stall is Stall.STEPPING and stuck.probe is None and not core.probes
        assert rid.decode() in stuck.aborts  # kept for it, should the same process come back
        assert rig.ends() == {0: (_native.FIN_ENGINE_DEAD, 1)}
        core.on_connection(stuck, zmq.EVENT_ACCEPTED, 12)  # it did: live, not stalled
        assert stuck.live and stuck.placeable


# ------------------------------------------------------------------------------ the bound


def test_a_rank_stalled_past_the_bound_fails_its_streams_once_and_aborts_them_on_it():
    with core_rig(_config()) as core:
        rig = Rig(core)
        stuck, other = core.engines[1], core.engines[0]
        held = [rig.add(f"held-{i}", pin=1) for i in range(3)]
        elsewhere = rig.add("elsewhere", pin=0)
        rig.output(other, b"elsewhere", [1])  # engine 0 steps
        rig.reader.poll()
        rig.turn(STALL)
        marked = core.engines[1].stalled_since
        assert stuck.stall is Stall.STALLED and rig.ends() == {}
        rig.output(other, b"elsewhere", [2])
        rig.reader.poll()
        rig.turn(STALL + FAIL - 1.5)  # (the rule runs once every stall_every, 1 s)
        assert rig.ends() == {} and stuck.in_flight == 3  # kept until the bound
        core.end_of_turn(marked + FAIL)
        # Each of its streams ends, once, with the stall's code and its engine; the other
        # rank's is untouched; its slots are no longer ours.
        assert rig.ends() == {slot: (FIN_ENGINE_STALLED, 1) for slot in held}
        assert stuck.stall is Stall.ABANDONED and stuck.in_flight == 0
        assert set(core.records) == {elsewhere}
        assert {f"held-{i}" for i in range(3)} <= set(stuck.aborts)
        # (The other rank finishes its request: in this test's clock it would stall too.)
        rig.output(other, b"elsewhere", [3], "length")
        assert rig.ends() == {elsewhere: (_native.FIN_LENGTH, 0)}
        rig.turn(STALL + FAIL + 1)  # the ABORTs leave; ABANDONED has no deadline to fire again
        sent = [rid for at, p in rig.ports.aborts if at == 1 for rid in decode_abort(p)]
        assert {f"held-{i}" for i in range(3)} <= set(sent)
        assert rig.ends() == {}
        # A worker's late abort of one of them finds nothing: no second ABORT, no second end.
        before = len(stuck.aborts)
        core.on_abort(rig.worker, b"".join(_entry(rig, s) for s in held))
        assert len(stuck.aborts) == before and rig.ends() == {}
        # Still stalled, still probed; published stalled; nothing placed on it.
        assert core.region.engines[1][E_STATE] == ENGINE_STALLED
        assert core.region.metrics()["stall_failures"] == 1
        late = rig.add("late")
        assert core.records[core.spw * rig.worker.number + late].engine is other
        # Its late output for a failed rid reaches no slot, and says it steps again.
        rig.output(stuck, b"held-0", [9])
        assert rig.reader.poll() == [] and stuck.stall is Stall.STEPPING


def _entry(rig: Rig, local: int) -> bytes:
    from tsfront.ipc.submit import ABORT_ENTRY

    return ABORT_ENTRY.pack(local, ticket_base(rig.worker.serial) + 1 + local)


def test_stall_fail_timeout_none_keeps_a_stalled_ranks_requests():
    with core_rig(_config(stall_fail_timeout=None)) as core:
        rig = Rig(core)
        rig.add("held", pin=1)
        rig.turn(STALL)
        rig.turn(STALL + 10_000)
        assert rig.ends() == {} and core.engines[1].stall is Stall.STALLED
        assert len(rig.probes_to(1)) > 1  # probed all along


def test_the_poll_turns_in_time_to_probe_a_stalled_rank_that_holds_nothing():
    with core_rig(_config(stall_timeout=2.0, stall_fail_timeout=1.0)) as core:
        rig = Rig(core)
        rig.add("held", pin=1)
        rig.turn(2.0)
        rig.turn(3.5)  # past the bound: its request failed, nothing of a client's in flight
        assert not core.records and core.engines[1].stall is Stall.ABANDONED
        assert core.timeout_ms(rig.t0 + 3.5) <= core.stall_every * 1000 + 1


# ------------------------------------------------------------------------------ placement


@pytest.mark.parametrize("policy", list(LoadBalance))
def test_no_client_request_is_placed_on_a_stalled_rank_even_one_holding_nothing(policy):
    with core_rig(_config(routing=Routing.aggregated(policy))) as core:
        rig = Rig(core)
        stuck, other = core.engines[1], core.engines[0]
        first = rig.add("first", pin=1)
        rig.turn(STALL)
        core.on_abort(rig.worker, _entry(rig, first))  # its one request goes: it holds none
        assert stuck.in_flight == 0 and stuck.stall is Stall.STALLED
        slots = [rig.add(f"r{i}") for i in range(12)]
        base = core.spw * rig.worker.number
        assert {core.records[base + s].engine.index for s in slots} == {other.index}
        assert _added_to(rig, 1) == [b"ADD first"]  # nothing but probes since
        # A pin to it is refused at once, retryably, naming it.
        pinned = rig.add("pinned", pin=1)
        assert rig.ends() == {pinned: (FIN_ENGINE_STALLED, 1)}
        assert _added_to(rig, 1) == [b"ADD first"]


@pytest.mark.parametrize("policy", list(LoadBalance))
def test_every_live_rank_stalled_refuses_new_requests_with_engine_stalled(policy):
    with core_rig(_config(routing=Routing.aggregated(policy))) as core:
        rig = Rig(core)
        rig.add("a", pin=0)
        rig.add("b", pin=1)
        rig.turn(STALL)
        assert [e.stall for e in core.engines] == [Stall.STALLED, Stall.STALLED]
        unpinned = rig.add("new")
        assert rig.ends() == {unpinned: (FIN_ENGINE_STALLED, -1)}
        assert _added_to(rig, 0) == [b"ADD a"] and _added_to(rig, 1) == [b"ADD b"]
        # One rank dead, the other stalled: still "stalled", not "no engine".
        core.on_connection(core.engines[0], zmq.EVENT_DISCONNECTED, 10)
        rig.reader.poll()
        again = rig.add("again")
        assert rig.ends() == {again: (FIN_ENGINE_STALLED, -1)}
        core.on_connection(core.engines[1], zmq.EVENT_DISCONNECTED, 11)
        rig.reader.poll()
        none = rig.add("none")
        assert rig.ends() == {none: (FIN_NO_ENGINE, -1)}


def test_a_resumed_rank_is_placed_on_again():
    with core_rig(_config(routing=Routing.aggregated(LoadBalance.ROUND_ROBIN))) as core:
        rig = Rig(core)
        stuck = core.engines[1]
        rig.add("a", pin=1)
        rig.turn(STALL)
        [rid] = rig.probes_to(1)
        rig.output(stuck, rid, [3], "length")
        slots = [rig.add(f"r{i}") for i in range(4)]
        base = core.spw * rig.worker.number
        assert {core.records[base + s].engine.index for s in slots} == {0, 1}


# ------------------------------------------------------------------------------ disaggregated


def test_a_stalled_decode_rank_is_probed_by_a_pair_and_both_halves_are_aborted_when_answered():
    private = "ipc://@tsfront-unit-stall"
    prefill_group = EngineGroup(
        "tcp://127.0.0.1:0",
        input_address=f"{private}-pin",
        output_address=f"{private}-pout",
        first_engine_index=8,
        num_engines=1,
    )
    decode_group = EngineGroup(
        "tcp://127.0.0.1:0",
        input_address=f"{private}-din",
        output_address=f"{private}-dout",
        num_engines=1,
    )
    cfg = ClientConfig(
        routing=Routing.disaggregated(prefill=prefill_group, decode=decode_group),
        stall_timeout=STALL,
        stall_fail_timeout=FAIL,
        max_workers=2,
        slots_per_worker=16,
    )
    with core_rig(cfg) as core:
        core.prefill = disagg = Disaggregated(core, core.groups[1])
        rig = Rig(core)
        decode, prefill = core.engines
        decode.in_flight = 1  # a request of a client, as far as the rule is concerned
        decode.busy_since = rig.t0
        rig.turn(STALL)
        assert decode.stall is Stall.STALLED
        halves = [(at, decode_add(p)) for at, p in rig.ports.adds if p.startswith(b"\xdc")]
        assert [at for at, _ in halves] == [prefill.index, decode.index]
        (_, p_half), (_, d_half) = halves
        assert p_half.rid == d_half.rid and p_half.rid.startswith(PROBE_PREFIX)
        assert p_half.bootstrap_room == d_half.bootstrap_room is not None
        assert d_half.bootstrap_room in disagg.rooms and prefill.in_flight == 0
        # The prefill half's terminal row is not ours; the decode half's answer clears it.
        frame = encode_output(
            BatchTokenIDOutSlim([p_half.rid], [[4]], ["length"], [1], [1], [0], [[]], [[]], 8)
        )
        assert disagg.on_frame(prefill, frame)
        assert decode.stall is Stall.STALLED and rig.reader.poll() == []
        rig.output(decode, p_half.rid.encode(), [4], "length")
        assert decode.stall is Stall.STEPPING and not disagg.rooms
        assert p_half.rid in decode.aborts and p_half.rid in prefill.aborts
        assert rig.reader.poll() == []  # nothing reached a slot
