"""Placement: pinning and every `LoadBalance` policy, as unit tests of `Router` on hand-made
`Engine` objects and end to end through the I/O process (checked in each sim rank's log)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from support.core_fixtures import (
    FOREVER,
    collect,
    engine_rids,
    next_chunk,
    request,
    rig,
    wait_until,
)

from tsfront import LoadBalance, Routing
from tsfront.io.engines import Engine, EngineState
from tsfront.io.routing import Router

ALL_POLICIES = list(LoadBalance)


def _engines(n: int, **fields) -> list[Engine]:
    return [Engine(row=i, index=10 + i, state=EngineState.LIVE, **fields) for i in range(n)]


def _fresh(e: Engine, running: int, waiting: int, active: int, total: int) -> None:
    e.tail = (running, waiting, active, total)
    e.tail_at = time.monotonic()
    e.in_flight_at_tail = e.in_flight


def _choices(router: Router, engines: list[Engine], k: int) -> list[int]:
    return [router.choose(engines).row for _ in range(k)]


# ------------------------------------------------------------------------------ Router unit


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_router_ties_never_favour_rank_0(policy):
    router = Router(policy, load_ttl=2.0)
    engines = _engines(4)  # identical: every choice is a tie
    assert Counter(_choices(router, engines, 400)) == {0: 100, 1: 100, 2: 100, 3: 100}


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_router_skips_dead_and_handshaking_engines(policy):
    router = Router(policy, load_ttl=2.0)
    engines = _engines(3)
    engines[0].state = EngineState.DEAD
    engines[2].state = EngineState.HANDSHAKING
    assert set(_choices(router, engines, 20)) == {1}


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_router_returns_none_when_no_engine_is_live(policy):
    engines = _engines(2)
    for e in engines:
        e.state = EngineState.DEAD
    assert Router(policy, load_ttl=2.0).choose(engines) is None


def test_round_robin_takes_each_live_engine_in_turn():
    router = Router(LoadBalance.ROUND_ROBIN, load_ttl=2.0)
    engines = _engines(3)
    engines[2].in_flight = 1000  # load is no concern of round robin
    assert _choices(router, engines, 6) == [0, 1, 2, 0, 1, 2]


def test_round_robin_shares_equally_among_live_engines_when_one_is_dead():
    router = Router(LoadBalance.ROUND_ROBIN, load_ttl=2.0)
    engines = _engines(3)
    engines[1].state = EngineState.DEAD
    assert Counter(_choices(router, engines, 300)) == {0: 150, 2: 150}


def test_least_in_flight_picks_the_fewest_in_flight():
    router = Router(LoadBalance.LEAST_IN_FLIGHT, load_ttl=2.0)
    engines = _engines(3)
    engines[0].in_flight, engines[1].in_flight, engines[2].in_flight = 5, 2, 3
    for _ in range(5):
        assert router.choose(engines).row == 1
    # Load tails do not matter to it.
    _fresh(engines[0], 0, 0, 0, 100)
    assert router.choose(engines).row == 1


def test_shortest_queue_uses_fresh_tails_plus_requests_sent_since():
    router = Router(LoadBalance.SHORTEST_QUEUE, load_ttl=2.0)
    engines = _engines(2)
    engines[0].in_flight = engines[1].in_flight = 4
    _fresh(engines[0], running=4, waiting=3, active=10, total=100)  # 7 queued at the engine
    _fresh(engines[1], running=4, waiting=0, active=10, total=100)  # 4
    assert router.choose(engines).row == 1
    engines[1].in_flight += 3  # three sent since its tail: 4 + 3 = 7, a tie
    assert sorted(_choices(router, engines, 2)) == [0, 1]
    engines[1].in_flight += 1  # 8 > 7
    assert set(_choices(router, engines, 4)) == {0}


def test_shortest_queue_ignores_stale_and_empty_tails():
    router = Router(LoadBalance.SHORTEST_QUEUE, load_ttl=0.5)
    engines = _engines(2)
    engines[0].in_flight, engines[1].in_flight = 1, 3
    _fresh(engines[0], running=50, waiting=50, active=1, total=100)
    engines[0].tail_at -= 1.0  # stale: its own in-flight count (1) stands in
    assert router.choose(engines).row == 0
    engines[0].tail = (50, 50, 0, 0)  # kv_total 0: no load info (pre-0.1.1 engine)
    engines[0].tail_at = time.monotonic()
    assert router.choose(engines).row == 0


def test_min_cache_usage_picks_the_lowest_fresh_usage():
    router = Router(LoadBalance.MIN_CACHE_USAGE, load_ttl=2.0)
    engines = _engines(3)
    engines[0].in_flight, engines[1].in_flight, engines[2].in_flight = 0, 9, 9
    _fresh(engines[0], 1, 0, 80, 100)
    _fresh(engines[1], 9, 0, 20, 100)
    _fresh(engines[2], 9, 0, 30, 100)
    assert router.choose(engines).row == 1


def test_min_cache_usage_breaks_ties_and_stale_tails_by_in_flight():
    router = Router(LoadBalance.MIN_CACHE_USAGE, load_ttl=0.5)
    engines = _engines(3)
    engines[0].in_flight, engines[1].in_flight, engines[2].in_flight = 3, 1, 2
    for e in engines:
        _fresh(e, 1, 0, 50, 100)  # equal usage
    assert router.choose(engines).row == 1
    for e in engines:
        e.tail_at -= 1.0  # all stale: usage counts as full, in-flight decides
    assert router.choose(engines).row == 1
    _fresh(engines[0], 1, 0, 99, 100)  # a fresh tail, however high, beats a stale one
    assert router.choose(engines).row == 0


# ------------------------------------------------------------------------------ end to end


async def test_pinned_requests_go_to_that_rank():
    async with rig(3, first_engine_index=4) as r:
        for rank in (2, 0, 1, 2):
            rid = f"pin-{rank}-{len(engine_rids(r.sim, 4 + rank))}"
            tokens, chunks = await collect(await r.client.generate(request(rid, 2, pin=rank)))
            assert len(tokens) == 2
            assert chunks[-1].engine_index == 4 + rank
            assert rid in engine_rids(r.sim, 4 + rank)
        assert [len(engine_rids(r.sim, 4 + k)) for k in range(3)] == [1, 1, 2]


async def _hold(r, rid: str, **kw):
    stream = await r.client.generate(request(rid, FOREVER, **kw))
    await next_chunk(stream)
    return stream


def _placement(r, rids: list[str]) -> dict[str, int]:
    out = {}
    for e in r.sim.engines:
        for rid in engine_rids(r.sim, e.engine_index):
            if rid in rids:
                out[rid] = e.engine_index
    return out


async def test_least_in_flight_fills_the_emptier_rank_first():
    async with rig(2) as r:
        held = [await _hold(r, f"busy-{i}", pin=0) for i in range(2)]
        new = [await r.client.generate(request(f"new-{i}", FOREVER)) for i in range(4)]
        for s in new:
            await next_chunk(s)
        placed = _placement(r, [s.rid for s in new])
        # 2/0 in flight: the first two go to rank 1; then 2/2 ties split one each.
        assert placed["new-0"] == placed["new-1"] == 1
        assert sorted([placed["new-2"], placed["new-3"]]) == [0, 1]
        for s in held + new:
            s.abort()


async def test_least_in_flight_spreads_sequential_requests_over_every_rank():
    async with rig(4) as r:
        for i in range(8):  # each finishes before the next: always a tie
            await collect(await r.client.generate(request(f"seq-{i}", 1)))
        assert [len(engine_rids(r.sim, k)) for k in range(4)] == [2, 2, 2, 2]


async def test_round_robin_gives_each_rank_the_same_share():
    config = {"routing": Routing.aggregated(LoadBalance.ROUND_ROBIN)}
    async with rig(3, config=config) as r:
        # Load is ignored: rank 0 holds three requests and still gets its turn.
        held = [await _hold(r, f"held-{i}", pin=0) for i in range(3)]
        streams = [await r.client.generate(request(f"rr-{i}", 2)) for i in range(9)]
        for s in streams:
            await collect(s)
        placed = _placement(r, [s.rid for s in streams])
        assert Counter(placed.values()) == {0: 3, 1: 3, 2: 3}
        for s in held:
            s.abort()


async def test_shortest_queue_avoids_the_rank_with_a_waiting_queue():
    # Rank 0 decodes one request at a time, so of its 3 requests 2 wait: queue 3 + 2 = 5.
    # Rank 1 runs its 3: queue 3. In-flight counts are equal (least-in-flight would split).
    config = {"routing": Routing.aggregated(LoadBalance.SHORTEST_QUEUE)}
    async with rig(2, config=config, rank_options={0: {"max_batch": 1}}) as r:
        held = [await r.client.generate(request(f"q0-{i}", FOREVER, pin=0)) for i in range(3)]
        held += [await _hold(r, f"q1-{i}", pin=1) for i in range(3)]
        await wait_until(
            lambda: [(x.num_running, x.num_waiting) for x in r.client.load()] == [(3, 2), (3, 0)],
            "both ranks' load tails",
        )
        new = [await r.client.generate(request(f"sq-{i}", FOREVER)) for i in range(2)]
        for s in new:
            await next_chunk(s)
        assert _placement(r, ["sq-0", "sq-1"]) == {"sq-0": 1, "sq-1": 1}
        for s in held + new:
            s.abort()


async def test_min_cache_usage_avoids_the_rank_with_the_fuller_cache():
    # Rank 0 holds one long prompt (51 KV pages), rank 1 two short ones (2 pages): fewer in
    # flight on rank 0, but far more cache in use.
    config = {"routing": Routing.aggregated(LoadBalance.MIN_CACHE_USAGE)}
    async with rig(2, config=config) as r:
        held = [await _hold(r, "long", pin=0, prompt=list(range(3, 3 + 64 * 50)))]
        held += [await _hold(r, f"short-{i}", pin=1) for i in range(2)]
        await wait_until(
            lambda: [x.kv_active_pages for x in r.client.load()] == [51, 2], "both load tails"
        )
        new = [await r.client.generate(request(f"mc-{i}", FOREVER)) for i in range(3)]
        for s in new:
            await next_chunk(s)
        assert set(_placement(r, [s.rid for s in new]).values()) == {1}
        for s in held + new:
            s.abort()
