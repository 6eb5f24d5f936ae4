"""The I/O process's native turn (native/turn.c) through a real I/O process and sim ranks.

Pins: a request submitted while the engines are idle is placed by a turn made wholly in native
code (the I/O process counts its turns and its native ones), and streams as ever; under every
policy the native turn mirrors, requests spread over the ranks as the policy says; with the
native turn off (``TSFRONT_NATIVE_TURN=0``) the same requests take the Python path, every turn
a Python one, with the same results. The rest of the core suite runs through the native turn
(it is on by default).
"""

from __future__ import annotations

import pytest
from support.core_fixtures import collect, expected_tokens, request, rig

from tsfront.config import LoadBalance, Routing


def _turns(r) -> tuple[int, int]:
    m = r.client.metrics()
    return m["turns"], m["native_turns"]


async def test_a_request_of_idle_engines_is_placed_by_a_native_turn() -> None:
    n = 20
    async with rig(2) as r:
        tokens, _ = await collect(await r.client.generate(request("warm", 2)))
        assert tokens == expected_tokens("warm", 2)
        turns, native = _turns(r)
        for i in range(n):
            # One at a time, each after the last one's stream ended: its ADD's turn is alone.
            tokens, _ = await collect(await r.client.generate(request(f"alone-{i}", 2)))
            assert tokens == expected_tokens(f"alone-{i}", 2)
        now_turns, now_native = _turns(r)
        assert now_native - native >= n // 2, f"{now_native - native} native turns for {n} ADDs"
        assert now_turns - turns >= now_native - native  # every native turn is a turn
        assert r.client.metrics()["ring_submissions"] >= n + 1


@pytest.mark.parametrize(
    "policy", [LoadBalance.ROUND_ROBIN, LoadBalance.LEAST_IN_FLIGHT, LoadBalance.SHORTEST_QUEUE]
)
async def test_requests_spread_over_the_ranks_as_the_policy_says(policy) -> None:
    async with rig(2, config={"routing": Routing(load_balance=policy)}) as r:
        streams = [await r.client.generate(request(f"s-{i}", 3)) for i in range(8)]
        engines = []
        for i, s in enumerate(streams):
            tokens, chunks = await collect(s)
            assert tokens == expected_tokens(f"s-{i}", 3)
            engines.append(chunks[-1].engine_index)
        # Eight at once over two idle ranks: four each (round robin alternates; the others
        # place each on the one with fewer in flight, ties rotated).
        assert sorted(engines) == [0] * 4 + [1] * 4, engines


async def test_with_the_native_turn_off_every_turn_is_a_python_one(monkeypatch) -> None:
    monkeypatch.setenv("TSFRONT_NATIVE_TURN", "0")
    async with rig(2) as r:
        for i in range(5):
            tokens, _ = await collect(await r.client.generate(request(f"py-{i}", 3)))
            assert tokens == expected_tokens(f"py-{i}", 3)
        turns, native = _turns(r)
        assert turns > 0 and native == 0
        assert r.client.metrics()["ring_submissions"] == 5
