"""A user's suite with tsfront's pytest plugin: correctness on simulated ranks, cost per token
on replayed frames, and the consumer behind a running ``tsfront serve``.

Run: ``pytest examples/pytest_plugin`` (with tsfront's ``testing`` extra installed: ``pip
install '.[testing]'`` in the checkout). The benchmark prints pytest-benchmark's table; a
round streams ``ROWS * STEPS`` tokens, so the time of a round divided by that is the
consumer's cost per token (printed too, as ``extra_info``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from consumer import TextConsumer

from tsfront import EngineClient
from tsfront.sim import default_token
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

VOCAB = [f" w{i}" for i in range(1000)]
ROWS = 64  # requests per round (one replay engine)
STEPS = 32  # tokens per request: one per replayed engine step


def request(rid: str, max_new_tokens: int) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=[1, 2, 3],
        stream=True,
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
    )


# -- correctness: an I/O process, two simulated ranks, an attached EngineClient -----------


@pytest.mark.tsfront_engines(ranks=2, step_ms=1.0)
async def test_consumer_reads_every_token_in_order(tsfront_engines) -> None:
    streams = [await tsfront_engines.client.generate(request(f"r{i}", 20)) for i in range(8)]
    consumers = [TextConsumer(VOCAB) for _ in streams]
    counts = await asyncio.wait_for(
        asyncio.gather(*(c.consume(s) for c, s in zip(consumers, streams))), 30
    )
    assert counts == [20] * 8
    for i, c in enumerate(consumers):
        # The simulator's tokens are deterministic: token p of rid r is default_token(r, p).
        assert c.tokens == [default_token(f"r{i}", p) for p in range(20)]
        assert c.finish_reason == "length"


# -- cost per token: replayed frames, nothing encoded while a round is timed --------------


@pytest.mark.tsfront_replay(ranks=1)
def test_consumer_cost_per_token(tsfront_replay, benchmark) -> None:
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(EngineClient.attach(tsfront_replay.address, timeout=30))
    try:

        def setup() -> tuple[tuple, dict]:
            # Not timed: fresh requests submitted and bound before the engine sends a frame.
            rnd = tsfront_replay.round(ROWS)
            streams = [loop.run_until_complete(client.generate(r)) for r in rnd.requests]
            tsfront_replay.wait_adds(rnd)
            return (rnd, streams), {}

        def one_round(rnd, streams) -> int:
            tsfront_replay.burst(rnd, STEPS)
            consumers = [TextConsumer(VOCAB) for _ in streams]

            async def read_all() -> list[int]:
                reads = asyncio.gather(*(c.consume(s) for c, s in zip(consumers, streams)))
                return await asyncio.wait_for(reads, 60)

            return sum(loop.run_until_complete(read_all()))

        tokens = benchmark.pedantic(one_round, setup=setup, rounds=5, warmup_rounds=1)
        assert tokens == ROWS * STEPS
        per_token_us = benchmark.stats.stats.median / tokens * 1e6
        benchmark.extra_info["tokens_per_round"] = tokens
        benchmark.extra_info["us_per_token"] = per_token_us
        print(f"\nconsumer: {per_token_us:.2f} us per token (median of 5 rounds)")
    finally:
        loop.run_until_complete(client.close())
        loop.close()


# -- behind the HTTP server: tsfront serve with simulated ranks ---------------------------


@pytest.mark.tsfront_serve(workers=1, ranks=1)
def test_served_completion(tsfront_serve) -> None:
    body = json.dumps({"model": "model", "prompt": "w5 w6", "max_tokens": 4}).encode()
    req = urllib.request.Request(
        f"{tsfront_serve.url}/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    assert out["usage"]["completion_tokens"] == 4
    assert out["choices"][0]["finish_reason"] == "length"
