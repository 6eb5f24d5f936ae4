"""A stuck engine: a rank that stops stepping while its sockets stay up (`SimEngine.stall`).

The rule (`tsfront.io.engines.stalled_after`) and the placement around stalled engines
(`Engine.placeable`, every `LoadBalance` policy) as unit tests on hand-made `Engine` objects;
then end to end through a real I/O process with two sim ranks and ``stall_timeout`` 1 s: the
frozen rank is reported ``"stalled"`` in `EngineClient.load` and the metrics, new requests go
to the other rank, the frozen rank's streams end by their deadline (never by the stall), and
its first output after `resume` makes it ``"live"`` again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    engine_rids,
    expected_tokens,
    in_thread,
    next_chunk,
    request,
    rig,
    wait_until,
)

from tsfront import DeadlineExceeded, LoadBalance
from tsfront.io.engines import Engine, EngineState, stalled_after
from tsfront.io.routing import Router
from tsfront.metrics.exposition import families

ALL_POLICIES = list(LoadBalance)
STALL = 1.0  # stall_timeout of the end-to-end tests


# ------------------------------------------------------------------------------ the rule


def test_rule_needs_requests_in_flight():
    assert not stalled_after(0, output_at=0.0, busy_since=0.0, now=1e6, timeout=30.0)


def test_rule_counts_from_the_last_output_frame():
    assert not stalled_after(3, output_at=100.0, busy_since=50.0, now=129.9, timeout=30.0)
    assert stalled_after(3, output_at=100.0, busy_since=50.0, now=130.0, timeout=30.0)


def test_rule_gives_an_engine_idle_for_long_the_whole_timeout_for_its_first_request():
    # Last output an hour ago, but it became busy only now: not stalled yet.
    assert not stalled_after(1, output_at=0.0, busy_since=3600.0, now=3629.0, timeout=30.0)
    assert stalled_after(1, output_at=0.0, busy_since=3600.0, now=3630.0, timeout=30.0)


def test_placeable_excludes_a_stalled_engine_only_while_it_holds_requests():
    e = Engine(row=0, index=0, state=EngineState.LIVE)
    assert e.placeable
    e.stalled_since, e.in_flight = 5.0, 2
    assert not e.placeable
    e.in_flight = 0  # its requests ended (by their deadlines): one probe may go
    assert e.placeable
    e.state, e.stalled_since = EngineState.DEAD, 0.0
    assert not e.placeable


# ------------------------------------------------------------------------------ placement


def _engines(n: int) -> list[Engine]:
    return [Engine(row=i, index=i, state=EngineState.LIVE) for i in range(n)]


def _stall(e: Engine, in_flight: int = 1) -> None:
    e.stalled_since = 1.0
    e.in_flight = in_flight


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_no_policy_places_on_a_stalled_engine_holding_requests(policy):
    router = Router(policy, load_ttl=2.0)
    engines = _engines(3)
    _stall(engines[1], in_flight=1)
    engines[0].in_flight = engines[2].in_flight = 50  # far busier, yet chosen
    assert set(router.choose(engines).row for _ in range(30)) == {0, 2}


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_live_engine_stalled_still_places_on_the_least_loaded(policy):
    router = Router(policy, load_ttl=2.0)
    engines = _engines(2)
    _stall(engines[0], in_flight=5)
    _stall(engines[1], in_flight=1)
    # Not refused: the request's deadline bounds what a stuck rank costs.
    chosen = [router.choose(engines) for _ in range(4)]
    assert all(e is not None for e in chosen)
    rows = [e.row for e in chosen if e is not None]
    if policy is LoadBalance.ROUND_ROBIN:
        assert sorted(rows) == [0, 0, 1, 1]  # its own turns, over the stalled ranks
    else:
        assert rows == [1, 1, 1, 1]  # the least in flight among the stalled


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_a_stalled_engine_with_nothing_in_flight_takes_its_turn(policy):
    # The probe: with its requests gone, only its next output can clear the stall.
    router = Router(policy, load_ttl=2.0)
    engines = _engines(2)
    _stall(engines[1], in_flight=0)
    assert Counter(router.choose(engines).row for _ in range(20)) == {0: 10, 1: 10}


# ------------------------------------------------------------------------------ end to end


def _load(r, rank: int):
    return r.client.load()[rank]


def _families(r) -> dict:
    return {f.name: f for f in families(r.client.metrics())}


def _sample(fams: dict, name: str, engine: int) -> float:
    family = fams[name]
    for s in family.samples:
        if s.labels.get("engine") == str(engine) and s.name in (name, name + "_total"):
            return s.value
    raise AssertionError(f"no {name} sample for engine {engine}")


async def _placed_on(r, rid: str) -> int:
    index, _ = await in_thread(r.sim.wait_request, rid, DEADLINE)
    return index


async def test_stalled_rank_is_reported_and_skipped_and_its_streams_end_by_their_deadline():
    async with rig(2, config={"stall_timeout": STALL}) as r:
        # A long stream on each rank (least in flight puts the second on the other rank).
        streams = [await r.client.generate(request(f"long-{i}", FOREVER)) for i in range(2)]
        ranks = [await _placed_on(r, f"long-{i}") for i in range(2)]
        assert sorted(ranks) == [0, 1]
        for s in streams:
            await next_chunk(s)
        stuck = ranks[0]
        other = 1 - stuck
        # A request with a deadline on the rank about to freeze, then the freeze.
        bounded = await r.client.generate(request("bounded", FOREVER, pin=stuck), deadline=4.0)
        await in_thread(r.sim.wait_request, "bounded", DEADLINE)
        t_stall = time.monotonic()
        await in_thread(r.sim.engine(stuck).stall)
        await wait_until(lambda: _load(r, stuck).state == "stalled", "the stall to be seen")
        seen = time.monotonic() - t_stall
        assert STALL <= seen < STALL + DEADLINE / 2
        load = _load(r, stuck)
        assert load.alive and load.in_flight == 2  # connected, holding its requests
        assert _load(r, other).state == "live"
        fams = _families(r)
        assert _sample(fams, "tsfront:engine_stalled", stuck) == 1
        assert _sample(fams, "tsfront:engine_stalled", other) == 0
        assert _sample(fams, "tsfront:engine_stalls", stuck) == 1
        assert r.client.metrics().engines[stuck].stalls == 1
        # New unpinned requests all go to the other rank, however busy it is, and complete.
        before = len(engine_rids(r.sim, stuck))
        fresh = [await r.client.generate(request(f"new-{i}", 5)) for i in range(10)]
        for i, s in enumerate(fresh):
            tokens, chunks = await collect(s)
            assert tokens == expected_tokens(f"new-{i}", 5)
            assert chunks[-1].engine_index == other
        assert len(engine_rids(r.sim, stuck)) == before
        # The stall ends nothing by itself: the frozen rank's stream without a deadline is
        # still open; the one with a deadline ends with DeadlineExceeded when it passes.
        with pytest.raises(DeadlineExceeded):
            await collect(bounded)
        assert not streams[ranks.index(stuck)].finished
        assert _load(r, stuck).state == "stalled"
        # Resumed: its output clears the stall, and its open stream goes on.
        r.sim.engine(stuck).resume()
        await wait_until(lambda: _load(r, stuck).state == "live", "the stall to clear")
        chunk = await next_chunk(streams[ranks.index(stuck)])
        assert chunk.engine_index == stuck and chunk.output_ids
        assert _sample(_families(r), "tsfront:engine_stalled", stuck) == 0
        for s in streams:
            s.abort()


async def test_resumed_rank_whose_requests_all_ended_is_placed_on_again():
    async with rig(2, config={"stall_timeout": STALL}) as r:
        stuck = 1
        s = await r.client.generate(request("doomed", FOREVER, pin=stuck), deadline=STALL * 3)
        await next_chunk(s)
        await in_thread(r.sim.engine(stuck).stall)
        await wait_until(lambda: _load(r, stuck).state == "stalled", "the stall to be seen")
        with pytest.raises(DeadlineExceeded):
            await collect(s)
        await wait_until(lambda: _load(r, stuck).in_flight == 0, "the abort to reach the I/O")
        r.sim.engine(stuck).resume()
        await in_thread(r.sim.wait_abort, "doomed", DEADLINE)  # it read what queued meanwhile
        # It holds nothing and sent nothing since (an aborted request ends silently): still
        # stalled, but it takes its turn, and its first output clears the stall.
        assert _load(r, stuck).state == "stalled"
        ends = []
        for i in range(4):
            tokens, chunks = await collect(await r.client.generate(request(f"after-{i}", 3)))
            assert tokens == expected_tokens(f"after-{i}", 3)
            ends.append(chunks[-1].engine_index)
        assert stuck in ends
        await wait_until(lambda: _load(r, stuck).state == "live", "the stall to clear")
        assert r.client.metrics().engines[stuck].stalls == 1


async def test_every_rank_stalled_still_places_and_a_pin_to_a_stalled_rank_is_taken():
    async with rig(2, config={"stall_timeout": STALL}) as r:
        held = []
        for rank in (0, 1):
            s = await r.client.generate(request(f"hold-{rank}", FOREVER, pin=rank))
            await next_chunk(s)
            held.append(s)
        await asyncio.gather(*(in_thread(r.sim.engine(rank).stall) for rank in (0, 1)))
        await wait_until(
            lambda: [x.state for x in r.client.load()] == ["stalled", "stalled"],
            "both stalls to be seen",
        )
        # Not refused (a false alarm on every rank must not become an outage)...
        late = await r.client.generate(request("late", 3))
        pinned = await r.client.generate(request("pinned", 3, pin=1))
        for rank in (0, 1):
            r.sim.engine(rank).resume()
        # ...and served once the ranks step again.
        assert (await collect(late))[0] == expected_tokens("late", 3)
        tokens, chunks = await collect(pinned)
        assert tokens == expected_tokens("pinned", 3) and chunks[-1].engine_index == 1
        await wait_until(
            lambda: [x.state for x in r.client.load()] == ["live", "live"], "the stalls to clear"
        )
        for s in held:
            s.abort()


async def test_stall_timeout_none_never_marks_a_rank_stalled():
    async with rig(2, config={"stall_timeout": None}) as r:
        s = await r.client.generate(request("quiet", FOREVER, pin=1), deadline=STALL * 2.5)
        await next_chunk(s)
        await in_thread(r.sim.engine(1).stall)
        with pytest.raises(DeadlineExceeded):
            await collect(s)  # well past 1 s of silence, and
        assert _load(r, 1).state == "live"  # never stalled
        assert r.client.metrics().engines[1].stalls == 0
        r.sim.engine(1).resume()
