"""Routing cost in the I/O process: `Router.choose` per policy, and for `PREFIX_AFFINITY` at
100, 1,000 and 10,000 prompt tokens, with the worker's block hashes (what the I/O process gets)
and without them (the I/O process hashes the ADD payload itself); plus the worker's hashing.

Four live engines, 64 distinct prompts in rotation, 32 requests kept in flight. The slope
between the token counts is the per-token cost; the goal is ≤ 5 µs a request + ≤ 2 µs per
1,000 prompt tokens of I/O CPU.

Run:
``.venv/bin/python -m pytest tsfront/bench/micro/bench_routing.py --benchmark-columns=median,ops``.
"""

from __future__ import annotations

import collections
import itertools
import random

import pytest
import zmq

from tsfront.config import ClientConfig, LoadBalance, Routing
from tsfront.io.affinity import packed_hashes
from tsfront.io.engines import Engine, EngineState
from tsfront.io.routing import Router
from tsfront.wire import EngineRegistration, SamplingParams, TokenizedGenerateReqInput, encode_add

ENGINES = 4
PROMPTS = 64
IN_FLIGHT = 32


def _setup(policy: LoadBalance, tokens: int, with_hashes: bool):
    rng = random.Random(tokens)
    cfg = ClientConfig(num_engines=ENGINES, routing=Routing.aggregated(policy))
    router = Router(policy, cfg.load_ttl, cfg)
    reg = EngineRegistration(prefix_granularity=64, kv_cache_size_tokens=1 << 20)
    engines = [
        Engine(row=i, index=i, state=EngineState.LIVE, registration=reg) for i in range(ENGINES)
    ]
    if router.affinity is not None:
        for e in engines:
            router.affinity.registered(e)
    block = router.affinity.block_tokens if router.affinity is not None else 256
    requests = []
    for i in range(PROMPTS):
        ids = [rng.randrange(3, 32000) for _ in range(tokens)]
        payload = zmq.Frame(
            encode_add(
                TokenizedGenerateReqInput(
                    rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams()
                )
            )
        )
        requests.append((payload, zmq.Frame(packed_hashes(ids, block)) if with_hashes else None))
    cycle = itertools.cycle(requests)
    window: collections.deque = collections.deque()

    def route() -> None:
        payload, hashes = next(cycle)
        e = router.choose(engines, payload, hashes)
        assert e is not None  # four live engines: there is always one to choose
        e.in_flight += 1
        window.append(e)
        if len(window) > IN_FLIGHT:
            window.popleft().in_flight -= 1

    return route


@pytest.mark.parametrize(
    "policy", [LoadBalance.LEAST_IN_FLIGHT, LoadBalance.ROUND_ROBIN], ids=lambda p: p.value
)
def test_route_load_policies(benchmark, policy):
    benchmark(_setup(policy, 1000, False))


@pytest.mark.parametrize("tokens", [100, 1000, 10000])
@pytest.mark.parametrize("hashes", ["worker_hashes", "io_hashes"])
def test_route_prefix_affinity(benchmark, tokens, hashes):
    benchmark(_setup(LoadBalance.PREFIX_AFFINITY, tokens, hashes == "worker_hashes"))


@pytest.mark.parametrize("tokens", [1000, 10000])
def test_worker_block_hashes(benchmark, tokens):
    ids = [random.randrange(3, 32000) for _ in range(tokens)]
    benchmark(packed_hashes, ids, 256)
