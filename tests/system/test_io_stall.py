"""A stuck engine: a rank that stops stepping while its sockets stay up (`SimEngine.stall`).

The rule (`tsfront.io.engines.stalled_after`) and the placement around stalled engines
(`Engine.placeable`, every `LoadBalance` policy) as unit tests on hand-made `Engine` objects;
then end to end through a real I/O process with two sim ranks and ``stall_timeout`` 1 s: the
frozen rank is reported ``"stalled"`` in `EngineClient.load` and the metrics, new requests go
to the other rank, the frozen rank is probed by a request of the I/O process's own (never a
client's), its streams end with `EngineStalled` once it has been stalled for
``stall_fail_timeout`` (and are aborted on it), and once it steps again the probe's answer
makes it ``"live"`` and it is placed on again. Every wait has a deadline.
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

from tsfront import DeadlineExceeded, EngineStalled, LoadBalance
from tsfront.io.engines import Engine, EngineState, StallEvent, stalled_after
from tsfront.io.probes import PROBE_PREFIX
from tsfront.io.routing import Router
from tsfront.metrics.exposition import families

ALL_POLICIES = list(LoadBalance)
STALL = 1.0  # stall_timeout of the end-to-end tests
FAIL = 1.5  # stall_fail_timeout of those that test it


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


def test_placeable_excludes_a_stalled_engine_whether_or_not_it_holds_requests():
    e = Engine(row=0, index=0, state=EngineState.LIVE)
    assert e.placeable
    e.in_flight = 2
    e.stall_move(StallEvent.SILENT, 5.0)
    assert not e.placeable
    e.in_flight = 0  # its requests ended: still not a client's to test (the probe is ours)
    assert not e.placeable
    e.stall_move(StallEvent.OUTPUT)
    assert e.placeable
    e.state = EngineState.DEAD
    assert not e.placeable


# ------------------------------------------------------------------------------ placement


def _engines(n: int) -> list[Engine]:
    return [Engine(row=i, index=i, state=EngineState.LIVE) for i in range(n)]


def _stall(e: Engine, in_flight: int = 1) -> None:
    e.in_flight = in_flight
    e.stall_move(StallEvent.SILENT, 1.0)


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_no_policy_places_on_a_stalled_engine_holding_requests(policy):
    router = Router(policy, load_ttl=2.0)
    engines = _engines(3)
    _stall(engines[1], in_flight=1)
    engines[0].in_flight = engines[2].in_flight = 50  # far busier, yet chosen
    assert set(router.choose(engines).row for _ in range(30)) == {0, 2}


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_live_engine_stalled_leaves_no_choice(policy):
    # The I/O core then ends the request with EngineStalled: a client's request is never
    # what tests a stalled rank (tests/unit/test_io_stall_core.py).
    router = Router(policy, load_ttl=2.0)
    engines = _engines(2)
    _stall(engines[0], in_flight=5)
    _stall(engines[1], in_flight=0)
    assert [router.choose(engines) for _ in range(4)] == [None] * 4


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_a_stalled_engine_with_nothing_in_flight_never_takes_a_clients_request(policy):
    # It holds nothing: only the I/O process's probe goes there, never a client's turn.
    router = Router(policy, load_ttl=2.0)
    engines = _engines(2)
    _stall(engines[1], in_flight=0)
    assert Counter(router.choose(engines).row for _ in range(20)) == {0: 20}


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
        # Within stall_fail_timeout (300 s by default) the stall ends nothing by itself: the
        # frozen rank's stream without a deadline is still open; the one with a deadline ends
        # with DeadlineExceeded when it passes.
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


def _client_rids(r, rank: int) -> list[str]:
    """The rids of the clients' ADDs the rank received (every other is a probe)."""
    return [rid for rid in engine_rids(r.sim, rank) if not rid.startswith(PROBE_PREFIX)]


def _probes(r, rank: int) -> list[str]:
    return [rid for rid in engine_rids(r.sim, rank) if rid.startswith(PROBE_PREFIX)]


async def test_a_silent_ranks_streams_end_with_engine_stalled_within_the_bound_and_are_aborted():
    config = {"stall_timeout": STALL, "stall_fail_timeout": FAIL}
    async with rig(2, config=config) as r:
        stuck, other = 1, 0
        held = [await r.client.generate(request(f"held-{i}", FOREVER, pin=stuck)) for i in range(5)]
        kept = [await r.client.generate(request(f"kept-{i}", FOREVER, pin=other)) for i in range(5)]
        for s in (*held, *kept):
            await next_chunk(s)
        frozen = time.monotonic()
        await in_thread(r.sim.engine(stuck).stall)

        async def ending(stream) -> tuple[float, BaseException | None]:
            try:
                await collect(stream, STALL + FAIL + DEADLINE)
            except Exception as exc:
                return time.monotonic() - frozen, exc
            return time.monotonic() - frozen, None

        ends = await asyncio.gather(*(ending(s) for s in held))
        # Every stream of the silent rank ends, exactly once, with the typed, retryable error,
        # once the rank has been stalled for stall_fail_timeout (the rule runs once a
        # stall_every, a quarter of stall_timeout here).
        for took, exc in ends:
            assert isinstance(exc, EngineStalled), exc
            assert exc.engine_index == stuck and "retry" in str(exc)
            assert STALL + FAIL - 0.05 <= took < STALL + FAIL + 2.0, took
        assert r.client.metrics().requests.finished["EngineStalled"] == 5
        with pytest.raises(StopAsyncIteration):
            await next_chunk(held[0])  # ended is ended
        # Their slots are free (the other rank's five still hold theirs); it holds nothing;
        # /health's word for it is still "stalled"; the other rank's streams go on.
        att = r.client._att
        assert len(att.slots.free) == att.spw - 5
        assert _load(r, stuck).in_flight == 0 and _load(r, stuck).state == "stalled"
        for s in kept:
            assert (await next_chunk(s)).engine_index == other
        # New requests go to the other rank; nothing of a client's reaches the stalled one.
        for i in range(10):
            tokens, chunks = await collect(await r.client.generate(request(f"new-{i}", 3)))
            assert tokens == expected_tokens(f"new-{i}", 3) and chunks[-1].engine_index == other
        # Resumed, it reads what queued while it was frozen: the ABORT of each of its
        # requests, and the I/O process's probe, whose answer makes it live again.
        r.sim.engine(stuck).resume()
        for i in range(5):
            await in_thread(r.sim.engine(stuck).wait_abort, f"held-{i}", DEADLINE)
        await wait_until(lambda: _load(r, stuck).state == "live", "the probe to clear the stall")
        assert _client_rids(r, stuck) == [f"held-{i}" for i in range(5)]
        assert _probes(r, stuck), "the probe, not a client's request, tested the rank"
        assert r.client.metrics()["stall_probes"] >= 1
        assert r.client.metrics()["stall_failures"] == 1
        for s in kept:
            s.abort()


async def test_a_resumed_rank_is_cleared_by_the_probe_not_by_a_client_and_placed_on_again():
    async with rig(2, config={"stall_timeout": STALL}) as r:
        stuck = 1
        s = await r.client.generate(request("doomed", FOREVER, pin=stuck), deadline=STALL * 3)
        await next_chunk(s)
        await in_thread(r.sim.engine(stuck).stall)
        await wait_until(lambda: _load(r, stuck).state == "stalled", "the stall to be seen")
        with pytest.raises(DeadlineExceeded):
            await collect(s)
        await wait_until(lambda: _load(r, stuck).in_flight == 0, "the abort to reach the I/O")
        # It holds nothing of a client's: every new request, however many, goes elsewhere.
        for i in range(6):
            tokens, chunks = await collect(await r.client.generate(request(f"while-{i}", 3)))
            assert chunks[-1].engine_index != stuck
        r.sim.engine(stuck).resume()
        await in_thread(r.sim.engine(stuck).wait_abort, "doomed", DEADLINE)
        # No client request was sent to clear it: the probe's answer did.
        await wait_until(lambda: _load(r, stuck).state == "live", "the probe to clear the stall")
        assert _client_rids(r, stuck) == ["doomed"] and _probes(r, stuck)
        ends = []
        for i in range(4):
            tokens, chunks = await collect(await r.client.generate(request(f"after-{i}", 3)))
            assert tokens == expected_tokens(f"after-{i}", 3)
            ends.append(chunks[-1].engine_index)
        assert stuck in ends  # placed on again
        assert r.client.metrics().engines[stuck].stalls == 1


async def test_every_rank_stalled_refuses_new_requests_with_engine_stalled_until_one_steps():
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
        # Refused at once, retryably (no client request tests a stalled rank); a pin to a
        # stalled rank too, naming it.
        with pytest.raises(EngineStalled, match="every live engine is stalled") as unpinned:
            await collect(await r.client.generate(request("late", 3)))
        assert unpinned.value.engine_index is None
        with pytest.raises(EngineStalled, match="engine 1 is stalled") as pinned:
            await collect(await r.client.generate(request("pinned", 3, pin=1)))
        assert pinned.value.engine_index == 1
        for rank in (0, 1):
            r.sim.engine(rank).resume()
        # Their held streams go on (their output clears each stall), and new requests are
        # served again; the refused ones never reached a rank.
        for s in held:
            assert (await next_chunk(s)).output_ids
        await wait_until(
            lambda: [x.state for x in r.client.load()] == ["live", "live"], "the stalls to clear"
        )
        assert (await collect(await r.client.generate(request("later", 3))))[0] == (
            expected_tokens("later", 3)
        )
        assert "late" not in engine_rids(r.sim, 0) + engine_rids(r.sim, 1)
        assert "pinned" not in engine_rids(r.sim, 1)
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
