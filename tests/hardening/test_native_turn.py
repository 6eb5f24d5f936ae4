"""The I/O process's native turn (`tsfront._native.Turn`, native/turn.c) against the Python path
it stands in for, in process (`support.turn_rig`) and against writer processes.

Pins: with one and with four writer processes at full occupancy (the ring kept full, bursts
rung once, pauses that let the turn park), every record is taken exactly once and in its
worker's order, by the turn (an ADD placed on the engine's lane) or by `Intake.take` (what it
left: every ABORT, and anything after a record it declined), and no wake-up is lost (no record
waits a second for a turn that would have taken it); the W doorbells of one instant wake the
parked turn once (eventfd writes never outnumber parks); the turn places a request exactly as
`Router.choose` would under each policy it mirrors (random engine states), and leaves the
core's accounts as `IOCore.on_add` does (record, engine counts, router cursor, slot, engine
row); each reason to decline leaves the record and everything after it in the ring with nothing
changed, for the Python path.
"""

from __future__ import annotations

import copy
import json
import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.turn_rig import TurnRig, abort_entries, add_header, ticket
from support.turn_writer import STAMP, payload

from tsfront import _native
from tsfront.config import LoadBalance
from tsfront.io.engines import EngineState, Stall
from tsfront.ipc.submit import ABORT_ENTRY
from tsfront.wire import ADD

WRITER = Path(__file__).parents[1] / "support" / "turn_writer.py"
LOST = 1.5  # seconds a record may wait for the turn that takes it (the writer waits 2 s at its end)


# ---------------------------------------------------------------- processes, rings kept full


def _hammer(workers: int, seconds: float = 3.0) -> dict:
    spw, ring = 4096, 16384
    r = TurnRig(workers, 1, spw=spw, ring=ring)
    children = [
        subprocess.Popen(
            [sys.executable, str(WRITER), *map(str, (r.memfd, r.efd, w, workers, spw, ring)),
             "3000000", str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(r.memfd, r.efd),
        )
        for w in range(workers)
    ]  # fmt: skip
    by_fd = {c.stdout.fileno(): w for w, c in enumerate(children)}
    for fd in by_fd:
        r.epoll.register(fd, select.EPOLLIN)
    # The engine's end too, as the loop's poll has an engine's connections: a message the turn
    # placed wakes this side at once, so each record's wait is seen when it ends.
    engine_end = r.ends[0].sock.fileno()
    r.epoll.register(engine_end, select.EPOLLIN)
    expected = [0] * workers  # each worker's next seq
    native = python = aborts = 0
    worst = 0.0
    done: dict[int, dict] = {}
    engine = r.engines[0]
    seen_declined = 0

    def taken(worker: int, seq: int) -> None:
        assert seq == expected[worker], f"worker {worker}: record {seq}, {expected[worker]} due"
        expected[worker] += 1

    def ended(slot: int, tick: int) -> None:
        # As the engine's last row, or an abort: the request goes, its slot is free.
        record = r.records.get(slot)
        if record is not None and record.ticket == tick:
            del r.records[slot]
            r.writer.unbind(slot)
            engine.in_flight -= 1

    try:
        limit = time.monotonic() + seconds + 60
        while len(done) < workers:
            assert time.monotonic() < limit, "the writers did not finish"
            events = r.turn.run(-1)
            now = time.monotonic_ns()
            # What the turn placed (in the order it took them), then what it left to Python.
            for kind, body in r.drain_lanes()[0]:
                assert kind == ADD
                w, seq, at = STAMP.unpack_from(body)
                assert body == payload(w, seq, at), "a payload changed on its way"
                taken(w, seq)
                native += 1
                worst = max(worst, (now - at) / 1e9)
                ended(w * spw + seq % spw, ticket(w, seq))
            # Python takes only what the turn left (the loop takes what is published whenever it
            # runs, which would leave the turn little to do here).
            declined = sum(v for k, v in r.turn.stats().items() if k.startswith("declined"))
            left = r.intake.take(1 << 30) if declined != seen_declined else []
            seen_declined = declined
            for number, kind, a, b, _c in left:
                if kind == _native.SUB_ADD:
                    w, seq, at = STAMP.unpack_from(b)
                    assert w == number
                    taken(w, seq)
                    python += 1
                    worst = max(worst, (now - at) / 1e9)
                else:
                    assert kind == _native.SUB_ABORT, f"a corrupt ring: {a!r}"
                    local, tick = ABORT_ENTRY.unpack(a)
                    taken(number, tick - ticket(number, 0) + 1)  # the ADD's seq + 1
                    aborts += 1
                    ended(number * spw + local, tick)
            for fd, _mask in events:
                if fd == engine_end:
                    continue
                w = by_fd[fd]
                r.epoll.unregister(fd)
                line = children[w].stdout.readline()
                assert line, f"writer {w} ended without its report (exit {children[w].wait(30)})"
                done[w] = json.loads(line)
    finally:
        for c in children:
            try:
                c.wait(30)
            except subprocess.TimeoutExpired:  # a failed run: no writer outlives the test
                c.kill()
                c.wait()
        stats = r.turn.stats()
        # Every park publishes parked once, a refused one too (a waker may see it meanwhile).
        parks = r.intake.stats()["parks"] + r.intake.stats()["refused_parks"]
        r.close()
    assert all(c.returncode == 0 for c in children)
    assert expected == [done[w]["written"] for w in range(workers)], "records lost"
    assert worst < LOST, f"a record waited {worst:.2f} s: a lost wake-up"
    wakes = sum(d["wakes"] for d in done.values())
    assert wakes <= parks, f"{wakes} eventfd writes for {parks} parks"
    assert wakes >= 100, f"the turn was woken {wakes} times: it seldom parked"
    assert stats["adds"] == native
    print(
        f"{sum(expected)} records: {native} placed natively, {python} ADDs and {aborts} ABORTs "
        f"left to Python; {wakes} wakes for {parks} parks; {stats['turns']} native turns, "
        f"{stats['returns']} returns; worst wait {worst * 1e3:.1f} ms"
    )
    return {"native": native, "python": python, "wakes": wakes, "parks": parks, **stats}


def test_one_writer_process_every_record_once_in_order_no_lost_wakeup() -> None:
    out = _hammer(1)
    assert out["native"] + out["python"] >= 10_000, "too few records in 3 s"
    assert out["native"] > out["python"], "the turn placed too few"


def test_four_writer_processes_every_record_once_in_order_and_one_wakeup_a_park() -> None:
    out = _hammer(4)
    assert out["native"] + out["python"] >= 10_000, "too few records in 3 s"
    assert out["native"] > out["python"], "the turn placed too few"


# ---------------------------------------------------------------- the core's accounts


@pytest.fixture
def rig():
    made: list[TurnRig] = []

    def make(*args, **kw) -> TurnRig:
        made.append(TurnRig(*args, **kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_a_placed_add_leaves_the_accounts_on_add_leaves(rig) -> None:
    r = rig(1, 2, policy=LoadBalance.ROUND_ROBIN)
    sub = r.submitter()
    r.engines[1].input_pending = True
    assert sub.add(add_header(5, ticket(0, 0), b"rid-a", logprobs=1), b"payload-a") == 0
    t0 = time.monotonic()
    assert r.turn.run(0) == []
    record = r.records[5]
    assert type(record) is _native.Record
    assert (record.rid, record.ticket, record.sent) == (b"rid-a", ticket(0, 0), True)
    engine = record.engine
    assert engine is r.engines[0]  # round robin from the first
    assert (engine.in_flight, engine.requests_total) == (1, 1)
    assert t0 <= engine.busy_since <= time.monotonic()
    assert (r.router.rotation, r.router.rr_next) == (1, 1)
    assert r.drain_lanes() == [[(ADD, b"payload-a")], []]
    words = r.row_words(0)
    assert (words[_native.E_IN_FLIGHT], words[_native.E_REQUESTS_LO]) == (1, 1)
    assert r.writer.stats()["bound"] == 1
    assert r.io_count("ring_submissions") == 1 and r.counts["ring_submissions"] == 1
    # The next goes to engine 1, whose reconnecting input is then known to work.
    assert sub.add(add_header(6, ticket(0, 1), b"rid-b"), b"payload-b") == 0
    r.turn.run(0)
    assert r.records[6].engine is r.engines[1] and r.engines[1].input_pending is False
    assert r.drain_lanes() == [[], [(ADD, b"payload-b")]]
    assert r.turn.stats()["adds"] == 2


def _engine_states(rng: random.Random, engines: list, now: float) -> None:
    for e in engines:
        e.state = rng.choice([EngineState.LIVE] * 4 + [EngineState.DEAD, EngineState.LOST])
        e.stall = rng.choice([Stall.STEPPING] * 5 + [Stall.STALLED])
        e.in_flight = rng.randrange(0, 6)
        e.in_flight_at_tail = rng.randrange(0, 6)
        total = rng.choice([0, 100, 200])
        e.tail = (rng.randrange(0, 5), rng.randrange(0, 5), rng.randrange(0, total + 1), total)
        e.tail_at = rng.choice([0.0, now - 0.5, now - 5.0])


@pytest.mark.parametrize(
    "policy",
    [
        LoadBalance.ROUND_ROBIN,
        LoadBalance.LEAST_IN_FLIGHT,
        LoadBalance.SHORTEST_QUEUE,
        LoadBalance.MIN_CACHE_USAGE,
    ],
)
def test_placement_is_the_routers_under_each_policy(rig, policy) -> None:
    r = rig(1, 4, policy=policy, spw=4)
    sub = r.submitter()
    rng = random.Random(policy.value)
    placed = declined = 0
    for n in range(600):
        _engine_states(rng, r.engines, time.monotonic())
        # The router's choice on copies of the same state (its cursors move as the turn's).
        twin = copy.deepcopy((r.router, r.engines))
        want = twin[0].choose(twin[1])
        assert sub.add(add_header(0, ticket(0, n), b"rid-%d" % n), b"p") == 0
        r.turn.run(0)
        if want is None:
            # Nothing placeable: left for the Python path (which refuses it), nothing moved.
            assert 0 not in r.records and len(r.intake.take()) == 1
            assert r.router.rotation == twin[0].rotation - 1 or policy is LoadBalance.ROUND_ROBIN
            declined += 1
            continue
        record = r.records.pop(0)
        assert record.engine.row == want.row, f"request {n}"
        assert (r.router.rotation, r.router.rr_next) == (twin[0].rotation, twin[0].rr_next)
        r.writer.unbind(0)
        placed += 1
    assert placed > 300 and declined > 10


# ---------------------------------------------------------------- what is left to Python


def _decline(r: TurnRig, why: str) -> tuple[bytes, bytes]:
    """Set the rig up so that the next ADD (slot 3, ticket 0, rid ``rid-x``) is declined for
    ``why``; the header to publish."""
    header = add_header(3, ticket(0, 0), b"rid-x")
    engine = r.engines[0]
    if why == "held":
        r.records[3] = _native.Record(b"old", engine, ticket(0, 99))
    elif why == "probe":
        r.probes[b"tsfront-probe-0-x"] = engine
    elif why == "deadline":
        header = add_header(3, ticket(0, 0), b"rid-x", expires=time.monotonic() - 1)
    elif why == "bound":
        r.writer.bind(b"rid-x", 9, 77, False, _native.FIN_DUPLICATE, 0)
    elif why == "pin":
        engine.state = EngineState.DEAD
        header = add_header(3, ticket(0, 0), b"rid-x", pin=0)
    elif why == "no_engine":
        engine.stall = Stall.STALLED
    elif why == "backlog":
        engine.backlog.append(object())
    elif why == "aborted":
        engine.aborted.add(b"rid-x", time.monotonic())
    elif why == "lane":
        r.lanes.close(0)
    elif why == "slot":
        header = add_header(3, ticket(1, 0), b"rid-x")  # another attach's ticket
    elif why == "header":
        header = header[:20]
    elif why == "off":
        r.turn.enabled = False
    return header, b"payload-x"


REASONS = [
    "held", "probe", "deadline", "bound", "pin", "no_engine", "backlog", "aborted", "lane",
    "slot", "header", "off",
]  # fmt: skip


@pytest.mark.parametrize("why", REASONS)
def test_a_declined_add_and_what_follows_it_are_left_in_order_with_nothing_changed(rig, why):
    r = rig(1, 1)
    sub = r.submitter()
    header, body = _decline(r, why)
    records_before = dict(r.records)
    engine = r.engines[0]
    before = (engine.in_flight, engine.requests_total, r.router.rotation, r.writer.stats())
    assert sub.add(header, body) == 0
    assert sub.add(add_header(4, ticket(0, 1), b"rid-y"), b"payload-y") == 0  # placeable
    assert sub.abort(abort_entries((4, ticket(0, 1)))) == 0
    assert r.turn.run(0) == []
    assert r.turn.stats()[f"declined_{why}"] == 1
    assert r.records == records_before
    assert (engine.in_flight, engine.requests_total, r.router.rotation, r.writer.stats()) == before
    if why != "lane":
        assert r.drain_lanes() == [[]]
    left = r.intake.take()
    assert [(k, a) for _, k, a, _, _ in left] == [
        (_native.SUB_ADD, header),
        (_native.SUB_ADD, add_header(4, ticket(0, 1), b"rid-y")),
        (_native.SUB_ABORT, abort_entries((4, ticket(0, 1)))),
    ]


def test_an_abort_is_always_left_and_the_adds_before_it_are_placed(rig) -> None:
    r = rig(1, 1)
    sub = r.submitter()
    assert sub.add(add_header(1, ticket(0, 0), b"a"), b"pa") == 0
    assert sub.abort(abort_entries((1, ticket(0, 0)))) == 0
    assert sub.add(add_header(2, ticket(0, 1), b"b"), b"pb") == 0
    r.turn.run(0)
    assert list(r.records) == [1]
    assert r.drain_lanes() == [[(ADD, b"pa")]]
    assert [k for _, k, _, _, _ in r.intake.take()] == [_native.SUB_ABORT, _native.SUB_ADD]


def test_a_full_lane_is_left_to_python_and_takes_again_once_the_engine_reads(rig) -> None:
    r = rig(1, 1, depth=2, ring=4 << 20)
    sub = r.submitter()
    # A payload larger than the socket takes: the lane holds its messages unsent.
    big = os.urandom(4 << 20)
    for n in range(3):
        assert sub.add(add_header(n, ticket(0, n), b"r%d" % n), big[: (1 << 20)]) == 0
        r.turn.run(0)
    assert sorted(r.records) == [0, 1] and r.turn.stats()["declined_lane"] == 1
    assert len(r.intake.take()) == 1
    assert [len(p) for _, p in r.drain_lanes()[0]] == [1 << 20, 1 << 20]
    assert sub.add(add_header(5, ticket(0, 5), b"r5"), b"p") == 0
    r.turn.run(0)
    assert 5 in r.records
