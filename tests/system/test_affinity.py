"""`LoadBalance.PREFIX_AFFINITY`: the native block hasher, the per-engine index (bounds,
forgetting) and the policy (affinity, imbalance fallback, rotation), as unit tests on hand-made
`Engine` objects with real ADD payloads, then end to end through the I/O process: a second turn
reaches the first turn's rank (and its cache), and a restarted rank's index is forgotten."""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter

import pytest
from support.core_fixtures import FOREVER, collect, next_chunk, request, rig
from support.hardening import io_rig, wait_state

from tsfront import LoadBalance, Routing, _native
from tsfront.config import ClientConfig
from tsfront.errors import ConfigError
from tsfront.io.affinity import PrefixIndex, group_block_tokens, packed_hashes
from tsfront.io.engines import Engine, EngineState
from tsfront.io.routing import Router
from tsfront.wire import EngineRegistration, SamplingParams, TokenizedGenerateReqInput, encode_add

BLOCK = 256  # index block of a group registered with prefix_granularity 64 (the default min)


def _payload(ids: list[int], rid: str = "r") -> bytes:
    return encode_add(
        TokenizedGenerateReqInput(rid=rid, input_ids=ids, sampling_params=SamplingParams())
    )


def _router(n: int = 4, **config) -> tuple[Router, list[Engine]]:
    cfg = ClientConfig(
        num_engines=n, routing=Routing.aggregated(LoadBalance.PREFIX_AFFINITY), **config
    )
    router = Router(LoadBalance.PREFIX_AFFINITY, 2.0, cfg)
    reg = EngineRegistration(prefix_granularity=64, kv_cache_size_tokens=1 << 22)
    engines = [Engine(row=i, index=i, state=EngineState.LIVE, registration=reg) for i in range(n)]
    for e in engines:
        router.affinity.registered(e)
    return router, engines


def _send(router: Router, engines: list[Engine], ids: list[int], *, packed: bool = True) -> int:
    """Route one prompt and count it in flight on its engine; the chosen row."""
    hashes = packed_hashes(ids, router.affinity.block_tokens) if packed else None
    e = router.choose(engines, _payload(ids), hashes)
    e.in_flight += 1
    return e.row


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 32000) for _ in range(n)]


# ------------------------------------------------------------------------------ hasher


def test_block_hashes_name_whole_prefixes_and_agree_between_payload_and_ids():
    rng = random.Random(1)
    ids = [*_tokens(rng, 1000), 0, 127, 128, 65535, 65536, 2**31 - 1]
    other = ids[:640] + [5] * 400  # same first 10 blocks of 64, then different
    for g in (1, 3, 64, 256):
        h = _native.block_hashes(_payload(ids), g, 1 << 20)
        assert len(h) == len(ids) // g
        packed = packed_hashes(ids, g)
        assert memoryview(packed)[:8].cast("Q")[0] == g
        assert memoryview(packed)[8:].cast("Q").tolist() == h
    a = _native.block_hashes(_payload(ids), 64, 1 << 20)
    b = _native.block_hashes(_payload(other, rid="another rid"), 64, 1 << 20)
    assert a[:10] == b[:10] and all(x != y for x, y in zip(a[10:], b[10:]))
    # A block's hash depends on every block before it, not only on its own tokens.
    shifted = _native.block_hashes(_payload([9] * 64 + ids[:64]), 64, 4)
    assert shifted[1] != a[0]
    assert _native.block_hashes(_payload(ids), 64, 3) == a[:3]


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc0", b"\x91\xa1x", _payload(list(range(300)))[:200], b"\xdc\x00\x19" + b"\xc1" * 30],
)
def test_block_hasher_turns_unreadable_payloads_into_no_blocks(payload):
    assert _native.block_hashes(payload, 64, 1 << 20) == []


def test_a_payload_without_input_ids_routes_like_a_fresh_prompt():
    router, engines = _router(2)
    req = TokenizedGenerateReqInput(rid="x", input_ids=None, sampling_params=SamplingParams())
    assert router.choose(engines, encode_add(req)) is not None


# ------------------------------------------------------------------------------ policy


def test_second_turn_lands_on_the_first_turns_rank():
    rng = random.Random(2)
    router, engines = _router(4)
    sessions = [_tokens(rng, 900) for _ in range(16)]
    first = [_send(router, engines, ids) for ids in sessions]
    assert Counter(first) == {0: 4, 1: 4, 2: 4, 3: 4}  # new sessions spread by load
    for s, ids in enumerate(sessions):
        ids += _tokens(rng, 500)  # + reply + next user message
        assert _send(router, engines, ids) == first[s]
        assert _send(router, engines, ids + [7] * 300, packed=False) == first[s]


def test_a_shared_system_prompt_spreads_once_the_thresholds_say_so():
    # The first engine to get a system prompt draws the new conversations that share it
    # until it is imbalanced; the engine that takes the next one then holds it too, and
    # from then on those engines tie on it and load decides among them.
    rng = random.Random(12)
    router, engines = _router(4, affinity_abs_threshold=2, affinity_rel_threshold=1.5)
    system = _tokens(rng, 600)
    first = [_send(router, engines, system + _tokens(rng, 300)) for _ in range(40)]
    counts = Counter(first)
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) - min(counts.values()) <= 3, counts
    assert router.affinity.fallbacks == 3  # one per engine that did not hold it yet


def test_affinity_wins_over_small_load_differences():
    rng = random.Random(3)
    router, engines = _router(3)
    ids = _tokens(rng, 1000)
    home = _send(router, engines, ids)
    engines[home].in_flight = 8  # abs threshold 8: not more than 8 above the others' 0
    assert _send(router, engines, ids + _tokens(rng, 100)) == home


def test_imbalance_falls_back_to_least_in_flight():
    rng = random.Random(4)
    router, engines = _router(3, affinity_abs_threshold=4, affinity_rel_threshold=2.0)
    ids = _tokens(rng, 1000)
    home = _send(router, engines, ids)
    others = [e for e in engines if e.row != home]
    for e in others:
        e.in_flight = 5
    # 4 above the least (not > 4), though more than twice it: affinity holds.
    engines[home].in_flight = 7
    engines[others[0].row].in_flight = 3
    assert _send(router, engines, ids + [1] * 300) == home
    # 5 above the least (> 4) but not more than twice it (5 * 2 = 10): affinity holds.
    for e in others:
        e.in_flight = 5
    engines[home].in_flight = 10
    assert _send(router, engines, ids + [1] * 301) == home
    assert router.affinity.fallbacks == 0
    # 6 above (> 4) and more than twice (11 > 10): the least loaded engine takes it.
    for e in others:
        e.in_flight = 5
    engines[home].in_flight = 11
    others[1].in_flight = 4
    assert _send(router, engines, ids + [2] * 300) == others[1].row
    assert router.affinity.fallbacks == 1
    # ... which now holds the prefix too (it was sent there), so the next turn can stay.
    engines[home].in_flight = 100
    assert _send(router, engines, ids + [2] * 600) == others[1].row


def test_ties_rotate_and_never_favour_rank_0():
    rng = random.Random(5)
    router, engines = _router(4)
    fresh = Counter(router.choose(engines, _payload(_tokens(rng, 300))).row for _ in range(400))
    assert fresh == {0: 100, 1: 100, 2: 100, 3: 100}
    # A prefix held by ranks 1 and 3 only: equal match, equal load, so they alternate.
    ids = _tokens(rng, 512)
    index = router.affinity.index
    hashes = router.affinity.hashes(_payload(ids))
    index.record(1, hashes)
    index.record(3, hashes)
    held = Counter(router.choose(engines, _payload(ids)).row for _ in range(100))
    assert held == {1: 50, 3: 50}


def test_dead_engines_are_skipped_and_forgotten():
    rng = random.Random(6)
    router, engines = _router(2)
    ids = _tokens(rng, 1000)
    home = _send(router, engines, ids)
    engines[home].state = EngineState.DEAD
    assert _send(router, engines, ids) == 1 - home
    for e in engines:
        e.state = EngineState.DEAD
    assert router.choose(engines, _payload(ids)) is None


def test_forgetting_an_engine_drops_its_whole_index():
    rng = random.Random(7)
    router, engines = _router(2)
    ids = _tokens(rng, 2000)
    home = _send(router, engines, ids)
    index = router.affinity.index
    assert index.size(home) == 2000 // BLOCK
    router.affinity.forget(engines[home])
    assert index.size(home) == 0 and index.owners == {}
    engines[home].in_flight = 1  # now only load decides
    assert _send(router, engines, ids + [1] * 300) == 1 - home


def test_worker_hashes_of_another_block_size_are_not_trusted():
    rng = random.Random(8)
    router, engines = _router(2)
    ids = _tokens(rng, 1000)
    home = _send(router, engines, ids)
    wrong = packed_hashes(ids + [1] * 300, 64)  # the worker saw other registrations
    engines[home].in_flight = 1
    assert router.choose(engines, _payload(ids + [1] * 300), wrong).row == home
    assert router.affinity.hashed_here == 1


@pytest.mark.parametrize("packed", [b"", b"\x00" * 7, b"\x00" * 12, memoryview(b"\x01" * 8)])
def test_a_malformed_hashes_frame_is_not_trusted(packed):
    rng = random.Random(13)
    router, engines = _router(2)
    ids = _tokens(rng, 1000)
    home = _send(router, engines, ids)
    engines[home].in_flight = 1
    assert router.choose(engines, _payload(ids + [1] * 300), packed).row == home
    assert router.affinity.hashed_here == 1


def test_block_hasher_survives_any_bytes():
    rng = random.Random(14)
    valid = _payload(_tokens(rng, 700))
    for _ in range(3000):
        n = rng.randrange(0, 64)
        junk = bytes(rng.randrange(256) for _ in range(n))
        cut = valid[: rng.randrange(len(valid))]
        flipped = bytearray(valid)
        flipped[rng.randrange(len(valid))] = rng.randrange(256)
        for data in (junk, cut, valid[:20] + junk, bytes(flipped)):
            hashes = _native.block_hashes(data, rng.choice([1, 7, 64, 256]), 1 << 20)
            assert isinstance(hashes, list)
    with pytest.raises(ValueError):
        _native.block_hashes(valid, 0, 10)
    with pytest.raises(ValueError):
        _native.packed_block_hashes([1, 2], 0, 10)


def test_group_block_size_is_a_whole_number_of_engine_blocks():
    assert group_block_tokens([64, 64], 256) == 256
    assert group_block_tokens([0, 48], 256) == 288
    assert group_block_tokens([0, 0], 100) == 128  # none registered: 64 assumed
    assert group_block_tokens([1024], 256) == 1024


# ------------------------------------------------------------------------------ bounds


def test_eviction_keeps_every_engine_under_its_budget_in_entries_and_bytes():
    budget = 200
    rng = random.Random(9)
    tracemalloc.start()
    try:
        router, engines = _router(4, prefix_index_blocks=budget)
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(200):  # 200 sessions x 8 blocks: twice the total budget
            ids = _tokens(rng, 8 * BLOCK)
            e = router.choose(engines, _payload(ids), packed_hashes(ids, BLOCK))
            assert router.affinity.index.size(e.row) <= budget
        index = router.affinity.index
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert all(index.size(e.row) == budget for e in engines)
    assert index.evictions == 200 * 8 - 4 * budget
    assert len(index.owners) <= 4 * budget
    # The documented bound, 400 bytes an entry (ClientConfig.prefix_index_blocks).
    assert used < 4 * budget * 400, used


def test_capacity_follows_the_engines_kv_cache():
    router, engines = _router(1, prefix_index_blocks=1000)
    reg = EngineRegistration(prefix_granularity=64, kv_cache_size_tokens=100 * 256)
    engines[0].registration = reg
    router.affinity.registered(engines[0])
    assert router.affinity.index.capacity[0] == 100


def test_eviction_takes_the_deepest_blocks_first():
    index = PrefixIndex(1, capacity=4)
    index.record(0, [1, 2, 3, 4])
    index.record(0, [9, 8])  # evicts 4 and 3 (the leaves), never 1 before 2
    assert index.match([1, 2, 3, 4], 1) == (2, 1)


def test_affinity_config_is_checked():
    with pytest.raises(ConfigError, match="affinity_rel_threshold"):
        ClientConfig(affinity_rel_threshold=0.5)
    with pytest.raises(ConfigError, match="affinity_abs_threshold"):
        ClientConfig(affinity_abs_threshold=-1)
    with pytest.raises(ConfigError, match="prefix_index_blocks"):
        ClientConfig(prefix_index_blocks=0)


# ------------------------------------------------------------------------------ end to end

AFFINITY = {"routing": Routing.aggregated(LoadBalance.PREFIX_AFFINITY)}


async def test_second_turn_reaches_the_first_turns_rank_and_its_cache():
    rng = random.Random(10)
    async with rig(3, config=AFFINITY) as r:
        turn1 = _tokens(rng, 700)
        _, chunks = await collect(await r.client.generate(request("t1", 4, prompt=turn1)))
        home = chunks[-1].engine_index
        # Load the home rank: least in flight would now send the next turn elsewhere.
        held = await r.client.generate(request("held", FOREVER, pin=home))
        await next_chunk(held)
        turn2 = turn1 + _tokens(rng, 400)
        _, chunks = await collect(await r.client.generate(request("t2", 4, prompt=turn2)))
        assert chunks[-1].engine_index == home
        assert chunks[-1].cached_tokens == 640  # the engine's own report: 10 pages of 64
        # A fresh conversation goes by load: never to the loaded home rank.
        fresh = _tokens(rng, 700)
        _, chunks = await collect(await r.client.generate(request("f1", 4, prompt=fresh)))
        assert chunks[-1].engine_index != home
        assert r.client.metrics()["affinity_fallbacks"] == 0
        # Imbalance: 9 requests in flight on home, 0 elsewhere (> 8 more, > 1.5 times as
        # many): the next turn goes to the least loaded rank, and the loop counts it.
        more = [await r.client.generate(request(f"h{i}", FOREVER, pin=home)) for i in range(8)]
        for stream in more:
            await next_chunk(stream)
        turn3 = turn2 + _tokens(rng, 300)
        _, chunks = await collect(await r.client.generate(request("t3", 4, prompt=turn3)))
        assert chunks[-1].engine_index != home
        metrics = r.client.metrics()
        assert metrics["affinity_fallbacks"] == 1
        assert metrics["affinity_rehashed"] == 0  # the worker's block hashes were used
        for stream in [held, *more]:
            stream.abort()


async def test_a_restarted_rank_forgets_what_it_was_sent():
    rng = random.Random(11)
    async with io_rig(2, **AFFINITY) as r:
        client = await r.attach()
        turn1 = _tokens(rng, 700)
        _, chunks = await collect(await client.generate(request("t1", 4, prompt=turn1)))
        home = chunks[-1].engine_index
        r.ranks[home].stop()
        await wait_state(client, home, "dead")
        r.start_rank(home)
        await wait_state(client, home, "live", 30)
        held = await client.generate(request("held", FOREVER, pin=home))
        await next_chunk(held)
        # Remembered, the prefix would win over a load difference of 1; forgotten, it does not.
        turn2 = turn1 + _tokens(rng, 400)
        _, chunks = await collect(await client.generate(request("t2", 4, prompt=turn2)))
        assert chunks[-1].engine_index == 1 - home
        assert chunks[-1].cached_tokens == 0
        held.abort()
