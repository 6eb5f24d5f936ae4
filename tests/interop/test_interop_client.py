"""tsfront's public API against TokenSpeed 0.1.1's real engine transport (issue #4 §4).

Every test runs real processes: a tsfront I/O process bound on 127.0.0.1 port 0 (through
`IOProcess.start` + `EngineClient.attach`, `ClientListener.bind` → `accept`, or
`EngineClient.connect`) and the interop harness (``harness.py`` in ``.interop-venv``) whose
ranks dial its bound handshake address with the engine's own ``connect_msgpack_engine`` and
serve through the engine's ``MsgpackRecvSocket`` / ``MsgpackSendSocket``. What the engine
decoded is read back from the harness's JSON-lines log.

Tests that keep their engines alive share one I/O process + harness per module
(``plain_group``, ``logprob_group``; each test attaches its own worker and uses its own rids);
tests that need their own harness flags, kill an engine or read the load table start a group of
their own (`engine_group`). Waits are events with deadlines: streams are read under
``asyncio.wait_for`` and the log is re-read until the awaited line appears (`wait_log`). Every
process is stopped and reaped in teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness_process import Harness, spawn_harness
from sim_rules import expected_tokens, logprob_of, token_at

from tsfront import (
    ClientConfig,
    ClientListener,
    EngineClient,
    EngineDied,
    EngineUnavailable,
    InvalidRequest,
    IOProcess,
    OutputChunk,
    PromptTooLong,
    RequestStream,
    StopStringsRefused,
)
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

#: Seconds any single wait may take before the test fails (never reached when things work).
DEADLINE = 10.0
#: What the engine's code registers as its version (``f"tokenspeed-{__version__}"``).
ENGINE_VERSION = "tokenspeed-0.1.1"
#: A request that outlives its test (one token per ~2 ms harness step; fits the 4096 context).
FOREVER = 4000

SpawnHarness = Callable[..., Harness]


# ------------------------------------------------------------------------------ helpers


def request(
    rid: str,
    prompt_len: int = 3,
    max_new_tokens: int | None = 5,
    *,
    pin: int | None = None,
    stream: bool = True,
    return_logprob: bool = False,
    **sampling: Any,
) -> TokenizedGenerateReqInput:
    """A tokenized request whose prompt is ``prompt_len`` copies of token 1."""
    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=[1] * prompt_len,
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens, **sampling),
        stream=stream,
        return_logprob=return_logprob,
        data_parallel_rank=pin,
    )


async def collect(stream: RequestStream, timeout: float = DEADLINE) -> list[OutputChunk]:
    """Every chunk of ``stream`` up to its end (or its error), within a deadline."""
    chunks: list[OutputChunk] = []

    async def read() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    await asyncio.wait_for(read(), timeout)
    return chunks


def tokens_of(chunks: list[OutputChunk]) -> list[int]:
    return [t for c in chunks for t in c.output_ids]


async def wait_log(
    harness: Harness, event: str, timeout: float = DEADLINE, **match: Any
) -> dict[str, Any]:
    """The first harness log line of kind ``event`` whose fields equal ``match``."""
    deadline = time.monotonic() + timeout
    while True:
        for record in harness.events(event):
            if all(record.get(k) == v for k, v in match.items()):
                return record
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"no {event!r} line matching {match} in {harness.log_path} within {timeout}s; "
                f"log so far: {harness.events()}"
            )
        await asyncio.sleep(0.005)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Group:
    """A tsfront I/O process, the harness ranks registered with it and one attached client."""

    io: IOProcess
    harness: Harness
    client: EngineClient


@contextlib.asynccontextmanager
async def engine_group(
    spawn: SpawnHarness, num_engines: int = 1, first_index: int = 0, *harness_args: str
) -> AsyncIterator[Group]:
    """`IOProcess.start` on port 0, the harness dialling its handshake, `EngineClient.attach`.

    Teardown: the client detaches, the harness stops (its ranks send ENGINE_CORE_DEAD to a
    live I/O process), then the I/O process stops; the fixture reaps the harness again.
    """
    config = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        num_engines=num_engines,
        first_engine_index=first_index,
        handshake_timeout=DEADLINE,
    )
    io = await asyncio.to_thread(IOProcess.start, config)
    harness = client = None
    try:
        harness = await asyncio.to_thread(
            spawn, io.handshake_address, num_engines, first_index, *harness_args
        )
        client = await EngineClient.attach(io.address, timeout=DEADLINE)
        yield Group(io, harness, client)
    finally:
        if client is not None:
            await client.close()
        if harness is not None:
            await asyncio.to_thread(harness.stop)
        await asyncio.to_thread(io.stop)


def worker_main(address: str, jobs: list[tuple[str, int, int]], conn: Any) -> None:
    """Body of a spawned worker process: attach to the I/O process, run every ``(rid,
    prompt_len, rank)`` job (3 new tokens, pinned), send back ``{rid: (tokens, finish reason,
    engine indices)}`` or ``("error", repr)``."""

    async def run() -> dict:
        client = await EngineClient.attach(address, timeout=DEADLINE)
        try:
            streams = {
                rid: await client.generate(request(rid, n, 3, pin=rank)) for rid, n, rank in jobs
            }
            out = {}
            for rid, stream in streams.items():
                chunks = await collect(stream)
                out[rid] = (
                    tokens_of(chunks),
                    chunks[-1].finish_reason,
                    sorted({c.engine_index for c in chunks}),
                )
            return out
        finally:
            await client.close()

    try:
        conn.send(("ok", asyncio.run(run())))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", repr(exc)))
    finally:
        conn.close()


@dataclass
class SharedGroup:
    """An I/O process and harness kept for a whole module (each test attaches its own worker)."""

    io: IOProcess
    harness: Harness


def start_shared(
    python: Any, log_path: Any, num_engines: int, first_index: int, *harness_args: str
) -> Iterator[SharedGroup]:
    """Generator body of a module-scoped group fixture: start, yield, stop harness then I/O."""
    config = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        num_engines=num_engines,
        first_engine_index=first_index,
        handshake_timeout=DEADLINE,
    )
    io = IOProcess.start(config)
    harness = None
    try:
        harness = spawn_harness(
            python, io.handshake_address, log_path, num_engines, first_index, *harness_args
        )
        yield SharedGroup(io, harness)
    finally:
        if harness is not None:
            harness.stop()
        io.stop()


#: The EOS the plain group's harness is started with (token_at(495, 2) == 500).
PLAIN_EOS = 500


@pytest.fixture(scope="module")
def plain_group(interop_python, tmp_path_factory) -> Iterator[SharedGroup]:
    """One rank (index 0), no server logprobs, ``--eos-token-id 500``; shared by the tests
    that neither kill the engine nor read its load."""
    log = tmp_path_factory.mktemp("plain") / "harness.jsonl"
    yield from start_shared(interop_python, log, 1, 0, "--eos-token-id", str(PLAIN_EOS))


@pytest.fixture(scope="module")
def logprob_group(interop_python, tmp_path_factory) -> Iterator[SharedGroup]:
    """Two ranks from index 3 with ``--enable-output-logprobs``."""
    log = tmp_path_factory.mktemp("logprob") / "harness.jsonl"
    yield from start_shared(interop_python, log, 2, 3, "--enable-output-logprobs")


@contextlib.asynccontextmanager
async def attached(shared: SharedGroup) -> AsyncIterator[Group]:
    """A fresh worker (`EngineClient.attach`) of a shared group, closed on exit."""
    client = await EngineClient.attach(shared.io.address, timeout=DEADLINE)
    try:
        yield Group(shared.io, shared.harness, client)
    finally:
        await client.close()


def check_registration(client: EngineClient, outputs: list[str], first: int, n: int) -> None:
    """`EngineInfo` of every rank = what the harness's engine code registered."""
    engines = client.engines()
    assert [(e.index, e.rank) for e in engines] == [(first + r, r) for r in range(n)]
    assert [e.output_address for e in engines] == outputs
    for rank, e in enumerate(engines):
        assert e.vllm_version == ENGINE_VERSION
        assert (e.data_parallel_rank, e.data_parallel_size, e.world_size) == (rank, n, n)
        assert (e.tensor_parallel_size, e.pipeline_parallel_size) == (1, 1)
        assert e.decode_context_parallel_size == 1
        assert e.dtype == "bfloat16"
        assert e.multimodal_encoder_dtype is None
        assert e.dp_stats_address is None
        assert e.kv_cache_max_concurrency is None and e.kv_events_config is None
    loads = client.load()
    assert [(x.index, x.rank, x.alive, x.state) for x in loads] == [
        (first + r, r, True, "live") for r in range(n)
    ]


# ---------------------------------------------------------------------------- handshake


async def test_single_rank_via_listener_registers_the_engines_geometry(spawn_engine_harness):
    config = ClientConfig(handshake_address="tcp://127.0.0.1:0", handshake_timeout=DEADLINE)
    listener = await ClientListener.bind(config)
    client = None
    try:
        assert not listener.handshake_address.endswith(":0")  # the real bound port
        harness = await asyncio.to_thread(
            spawn_engine_harness,
            listener.handshake_address,
            1,
            0,
            *("--max-model-len", "2048", "--num-gpu-blocks", "513", "--page-size", "32"),
            *("--max-num-seqs", "64", "--max-num-batched-tokens", "4096"),
            *("--instance-id", "interop-solo"),
        )
        client = await asyncio.wait_for(listener.accept(), DEADLINE)
        check_registration(client, listener.output_addresses, 0, 1)
        [e] = client.engines()
        assert (e.max_model_len, e.num_gpu_blocks, e.prefix_granularity) == (2048, 513, 32)
        assert (e.max_num_seqs, e.max_num_batched_tokens) == (64, 4096)
        assert e.instance_id == "interop-solo"
        assert e.kv_cache_size_tokens == 512 * 32
        assert e.context_limit == 2048
        await wait_log(harness, "registered", engine_index=0, dp_rank=0)
        chunks = await collect(await client.generate(request("solo", 3, 4)))
        assert tokens_of(chunks) == expected_tokens(3, 4)[0]
        # Engines first, so their ENGINE_CORE_DEAD meets a live I/O process (no linger wait).
        await asyncio.to_thread(harness.stop)
    finally:
        if client is not None:
            await client.close()
        else:
            await listener.close()


async def test_four_ranks_from_a_nonzero_first_index_each_answer_on_their_rank(
    spawn_engine_harness,
):
    async with engine_group(spawn_engine_harness, 4, 5) as g:
        check_registration(g.client, g.io.output_addresses, 5, 4)
        for e in g.client.engines():  # harness defaults
            assert (e.max_model_len, e.num_gpu_blocks, e.prefix_granularity) == (4096, 1001, 64)
            assert (e.max_num_seqs, e.max_num_batched_tokens) == (256, 8192)
            assert e.kv_cache_size_tokens == 1000 * 64
            assert e.instance_id == "tsfront-interop-harness"
        assert len(set(g.io.output_addresses)) == 4
        # A worker in another process, and a second worker in this one, share the group.
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        jobs = [("far-rank1", 6, 1), ("far-rank3", 7, 3)]
        proc = ctx.Process(target=worker_main, args=(g.io.address, jobs, child), daemon=True)
        proc.start()
        child.close()
        other = await EngineClient.attach(g.io.address, timeout=DEADLINE)
        try:
            assert other.engines() == g.client.engines()
            clients = [g.client, other, g.client, other]
            streams = [
                await c.generate(request(f"rank{rank}", 2 + rank, 3, pin=rank))
                for rank, c in enumerate(clients)
            ]
            results = await asyncio.gather(*(collect(s) for s in streams))
            if not await asyncio.to_thread(parent.poll, 3 * DEADLINE):
                raise AssertionError("the spawned worker did not report")
            status, far = parent.recv()
        finally:
            await other.close()
            proc.join(DEADLINE)
            if proc.is_alive():
                proc.kill()
                proc.join()
            parent.close()
        for rank, chunks in enumerate(results):
            assert tokens_of(chunks) == expected_tokens(2 + rank, 3)[0]
            assert {c.engine_index for c in chunks} == {5 + rank}
            logged = await wait_log(g.harness, "request", rid=f"rank{rank}")
            assert logged["engine_index"] == 5 + rank
            assert logged["data_parallel_rank"] == rank
        assert status == "ok", far
        assert far == {
            rid: (expected_tokens(n, 3)[0], "length", [5 + rank]) for rid, n, rank in jobs
        }


async def test_connect_on_a_fixed_port_with_the_engine_dialling_first(spawn_engine_harness):
    # The engine's DEALER queues its HELLO until the frontend binds, so start order is free.
    handshake = f"tcp://127.0.0.1:{free_port()}"
    harness = await asyncio.to_thread(spawn_engine_harness, handshake, 2, 9)
    config = ClientConfig(
        handshake_address=handshake,
        num_engines=2,
        first_engine_index=9,
        handshake_timeout=DEADLINE,
    )
    async with await EngineClient.connect(config) as client:
        check_registration(client, [e.output_address for e in client.engines()], 9, 2)
        chunks = await collect(await client.generate(request("dialled", 4, 3, pin=1)))
        assert tokens_of(chunks) == expected_tokens(4, 3)[0]
        assert chunks[-1].engine_index == 10
        await asyncio.to_thread(harness.stop)


# ------------------------------------------------------------------------ what arrives


async def test_every_field_arrives_as_the_engine_decodes_it(logprob_group):
    sp = SamplingParams(
        max_new_tokens=7,
        stop_token_ids=[990, 991, 990],
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        frequency_penalty=0.5,
        presence_penalty=-0.25,
        repetition_penalty=1.1,
        min_new_tokens=2,
        regex="[a-z]+",
        structural_tag='{"begin": "<tool>", "end": "</tool>"}',
        ignore_eos=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        no_stop_trim=True,
        thinking_budget=64,
        custom_params={"beam": "wide", "depth": 3, "nested": {"x": [1, 2]}},
        stream_interval=2,
        logit_bias={"5": 1.5, "17": -2.0},
        seed=1234,
        logprobs=0,
    )
    req = TokenizedGenerateReqInput(
        rid="every-field",
        http_worker_ipc="ipc:///tmp/http-worker-7",
        input_text="hello interop",
        input_ids=[11, 12, 13, 14],
        sampling_params=sp,
        return_logprob=True,
        stream=True,
        created_time=1712345678.25,
        bootstrap_host="10.1.2.3",
        bootstrap_port=8998,
        bootstrap_room=424242,
        data_parallel_rank=1,
    )
    async with attached(logprob_group) as g:
        chunks = await collect(await g.client.generate(req))
        logged = await wait_log(g.harness, "request", rid="every-field")
    want_sp = {
        "max_new_tokens": 7,
        "stop": None,
        "stop_token_ids": [990, 991],  # decoded into a set
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.25,
        "repetition_penalty": 1.1,
        "min_new_tokens": 2,
        "json_schema": None,
        "regex": "[a-z]+",
        "ebnf": None,
        "structural_tag": '{"begin": "<tool>", "end": "</tool>"}',
        "ignore_eos": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
        "thinking_budget": 64,
        "custom_params": {"beam": "wide", "depth": 3, "nested": {"x": [1, 2]}},
        "stream_interval": 2,
        "logit_bias": {"5": 1.5, "17": -2.0},
        "seed": 1234,
        "logprobs": 0,
        "n": 1,
        # Filled by the engine's normalize() after decode.
        "stop_strs": [],
        "stop_str_max_len": 0,
        "is_normalized": True,
    }
    assert logged["sampling_params"] == want_sp
    want = {
        "rid": "every-field",
        "http_worker_ipc": "ipc:///tmp/http-worker-7",
        "input_text": "hello interop",
        "input_ids": [11, 12, 13, 14],
        "return_logprob": True,
        "logprob_start_len": 3,  # the engine resolves -1 to the last prompt token
        "top_logprobs_num": 0,
        "token_ids_logprob": None,
        "stream": True,
        "input_embeds": None,
        "session_params": None,
        "custom_logit_processor": None,
        "return_hidden_states": False,
        "created_time": 1712345678.25,
        "bootstrap_host": "10.1.2.3",
        "bootstrap_port": 8998,
        "bootstrap_room": 424242,
        "input_multi_ids": None,
        "input_extra_infos": None,
        "input_ids_unpadded": None,
        "multimodal_inputs": None,
        "validation_error": None,
        "data_parallel_rank": 1,
    }
    assert {k: v for k, v in logged.items() if k not in ("event", "t", "sampling_params")} == {
        **want,
        "engine_index": 4,  # rank 1 of a group starting at 3
    }
    # And it was served as sent: 7 tokens (ignore_eos), with logprobs, from engine 4.
    tokens, reason = expected_tokens(4, 7, ignore_eos=True)
    assert tokens_of(chunks) == tokens and chunks[-1].finish_reason == reason == "length"
    assert {c.engine_index for c in chunks} == {4}
    assert [v for c in chunks for v in c.output_token_logprobs_val] == [
        logprob_of(t) for t in tokens
    ]
    # stream_interval=2: frames after tokens 1, 3, 5 and the terminal one (7); never more.
    assert len(chunks) <= 4
    assert all(c.completion_tokens % 2 == 1 for c in chunks)


async def test_the_engines_post_decode_rewrites_of_sampling_params(plain_group):
    cases = {
        # seed None → crc32(rid); top_k -1 → 1 << 30; empty stop_token_ids → None.
        "defaults": {"stop_token_ids": []},
        # near-zero temperature → greedy: temperature 1.0, top_k 1, seed pinned to 0.
        "greedy-temp": {"temperature": 0.0, "seed": 99},
        # top_k 1 asked directly → seed pinned to 0.
        "greedy-topk": {"top_k": 1, "seed": 5},
        # stop_token_ids → a set (logged sorted), duplicates gone.
        "stop-set": {"stop_token_ids": [900, 4, 900, 17]},
    }
    async with attached(plain_group) as g:
        streams = [await g.client.generate(request(rid, 2, 2, **sp)) for rid, sp in cases.items()]
        for chunks in await asyncio.gather(*(collect(s) for s in streams)):
            assert tokens_of(chunks) == expected_tokens(2, 2)[0]
        logged = {
            rid: (await wait_log(g.harness, "request", rid=rid))["sampling_params"] for rid in cases
        }
    d = logged["defaults"]
    assert (d["seed"], d["top_k"], d["stop_token_ids"]) == (zlib.crc32(b"defaults"), 1 << 30, None)
    assert (d["temperature"], d["logprobs"], d["n"]) == (1.0, None, 1)
    g1 = logged["greedy-temp"]
    assert (g1["temperature"], g1["top_k"], g1["seed"]) == (1.0, 1, 0)
    g2 = logged["greedy-topk"]
    assert (g2["top_k"], g2["seed"]) == (1, 0)
    assert logged["stop-set"]["stop_token_ids"] == [4, 17, 900]


# ---------------------------------------------------------------------------- streaming


async def test_streams_every_token_in_order_until_length(spawn_engine_harness):
    async with engine_group(spawn_engine_harness, 1, 0, "--max-model-len", "64") as g:
        long = await g.client.generate(request("long", 5, 40))
        # max_new_tokens=None: the engine clamps to max_model_len - prompt - 2.
        clamped = await g.client.generate(request("clamped", 6, None))
        quiet = await g.client.generate(request("quiet", 2, 6, stream=False))
        # The whole context as tsfront reckons it (max_model_len - 2) is served in full...
        full = await g.client.generate(request("full", 10, 64 - 10 - 2))
        # ...and one token more is refused before sending.
        with pytest.raises(PromptTooLong):
            await g.client.generate(request("over", 10, 64 - 10 - 1))
        long_chunks, clamped_chunks, quiet_chunks, full_chunks = await asyncio.gather(
            collect(long), collect(clamped), collect(quiet), collect(full)
        )
        load = g.client.load()
        assert "over" not in {r["rid"] for r in g.harness.events("request")}
    want = expected_tokens(5, 40, max_model_len=64)[0]
    assert tokens_of(long_chunks) == want
    # completion_tokens is cumulative and matches the deltas received so far.
    seen = 0
    for c in long_chunks:
        seen += len(c.output_ids)
        assert c.completion_tokens == seen and c.prompt_tokens == 5 and c.cached_tokens == 0
        assert c.engine_index == 0 and c.output_token_logprobs_val is None
    assert [c.finish_reason for c in long_chunks[:-1]] == [None] * (len(long_chunks) - 1)
    assert long_chunks[-1].finish_reason == "length" and long_chunks[-1].completion_tokens == 40
    tokens, reason = expected_tokens(6, None, max_model_len=64)
    assert len(tokens) == 64 - 6 - 2
    assert tokens_of(clamped_chunks) == tokens and clamped_chunks[-1].finish_reason == reason
    assert tokens_of(quiet_chunks) == expected_tokens(2, 6)[0]
    assert quiet_chunks[-1].finish_reason == "length" and len(quiet_chunks) <= 2
    assert tokens_of(full_chunks) == expected_tokens(10, 52, max_model_len=64)[0]
    assert full_chunks[-1].completion_tokens == 52 and full_chunks[-1].finish_reason == "length"
    # The 14-element form's load tail reached the engine table.
    [row] = load
    assert row.kv_total_pages == 1000 and row.age is not None and row.requests_total == 4


async def test_stop_token_and_eos_finish_with_stop_unless_ignore_eos(plain_group):
    # Prompt length 495 makes the third token 3 + 497 = 500: the harness's EOS.
    eos = token_at(495, 2)
    assert eos == PLAIN_EOS
    async with attached(plain_group) as g:
        stop_at = expected_tokens(4, 10)[0][2]
        streams = {
            "stop-token": request("stop-token", 4, 10, stop_token_ids=[stop_at]),
            "eos": request("eos", 495, 10),
            "ignore-eos": request("ignore-eos", 495, 10, ignore_eos=True, stop_token_ids=[eos]),
        }
        opened = {rid: await g.client.generate(r) for rid, r in streams.items()}
        got = dict(zip(opened, await asyncio.gather(*(collect(s) for s in opened.values()))))
        finishes = {rid: await wait_log(g.harness, "finish", rid=rid) for rid in streams}
    assert tokens_of(got["stop-token"]) == expected_tokens(4, 10, stop_token_ids={stop_at})[0]
    assert tokens_of(got["stop-token"])[-1] == stop_at
    assert got["stop-token"][-1].finish_reason == "stop"
    assert tokens_of(got["eos"]) == expected_tokens(495, 10, eos_token_id=eos)[0]
    assert len(tokens_of(got["eos"])) == 3 and got["eos"][-1].finish_reason == "stop"
    assert len(tokens_of(got["ignore-eos"])) == 10 and got["ignore-eos"][-1].finish_reason == (
        "length"
    )
    assert {rid: f["reason"] for rid, f in finishes.items()} == {
        "stop-token": "stop",
        "eos": "stop",
        "ignore-eos": "length",
    }


async def test_logprobs_arrive_with_their_tokens_when_the_server_enables_them(logprob_group):
    async with attached(logprob_group) as g:
        with_lp = await g.client.generate(request("lp", 3, 12, return_logprob=True))
        without = await g.client.generate(request("plain", 3, 4))
        lp_chunks, plain_chunks = await asyncio.gather(collect(with_lp), collect(without))
    tokens = expected_tokens(3, 12)[0]
    assert tokens_of(lp_chunks) == tokens
    for c in lp_chunks:
        assert c.output_token_logprobs_idx == c.output_ids
        assert c.output_token_logprobs_val == [logprob_of(t) for t in c.output_ids]
    assert lp_chunks[-1].finish_reason == "length"
    assert all(c.output_token_logprobs_val is None for c in plain_chunks)
    assert tokens_of(plain_chunks) == tokens[:4]
    # Unpinned and in flight together: least-in-flight placed them on different ranks.
    assert {lp_chunks[-1].engine_index, plain_chunks[-1].engine_index} == {3, 4}


@pytest.mark.parametrize(("form", "first"), [(10, 2), (9, 0)])
async def test_older_output_forms_still_stream(spawn_engine_harness, form, first):
    # 10 elements carry engine_index (so a non-zero one shows); 9 do not (1 rank, index 0).
    async with engine_group(spawn_engine_harness, 1, first, "--output-form", str(form)) as g:
        chunks = await collect(await g.client.generate(request("old", 2, 6)))
        load = g.client.load()
    assert tokens_of(chunks) == expected_tokens(2, 6)[0]
    seen = 0
    for c in chunks:  # chunks may coalesce steps; counts follow the tokens
        seen += len(c.output_ids)
        assert c.completion_tokens == seen and c.prompt_tokens == 2
    assert chunks[-1].finish_reason == "length" and seen == 6
    assert {c.engine_index for c in chunks} == {first}
    # No load tail in these forms: the engine table has no kv figures.
    assert (load[0].kv_total_pages, load[0].age, load[0].alive) == (0, None, True)


async def test_nine_element_form_reports_the_engine_that_sent_it(spawn_engine_harness):
    async with engine_group(spawn_engine_harness, 1, 2, "--output-form", "9") as g:
        stream = await g.client.generate(request("nine", 2, 3))
        chunks = await collect(stream)
    assert tokens_of(chunks) == expected_tokens(2, 3)[0]
    assert {c.engine_index for c in chunks} == {2}
    assert stream.engine_index == 2


# ------------------------------------------------------------------ refusals and aborts


async def test_requests_the_engine_rejects_end_with_an_abort_chunk(plain_group):
    # Neither is refused by tsfront: it knows neither the server's logprob flag nor the vocab.
    async with attached(plain_group) as g:
        no_flag = await g.client.generate(request("no-flag", 3, 4, return_logprob=True))
        bad_bias = await g.client.generate(request("bad-bias", 3, 4, logit_bias={"5000": 1.0}))
        ok = await g.client.generate(request("fine", 3, 2))
        results = await asyncio.gather(collect(no_flag), collect(bad_bias), collect(ok))
        finishes = [await wait_log(g.harness, "finish", rid=r) for r in ("no-flag", "bad-bias")]
    for chunks in results[:2]:
        [chunk] = chunks
        assert chunk.finish_reason == "abort" and chunk.output_ids == []
        assert (chunk.prompt_tokens, chunk.completion_tokens) == (3, 0)
        assert chunk.engine_index == 0
    assert results[2][-1].finish_reason == "length"  # the group still serves
    assert [f["reason"] for f in finishes] == ["abort", "abort"]
    assert "enable-output-logprobs" in finishes[0]["error"]
    assert "logit_bias" in finishes[1]["error"]


async def test_abort_and_leaving_the_stream_reach_the_engine(plain_group):
    async with attached(plain_group) as g:
        client = g.client
        # stream.abort()
        explicit = await client.generate(request("explicit", 2, FOREVER))
        await asyncio.wait_for(anext(explicit), DEADLINE)
        explicit.abort()
        assert explicit.finished
        assert (await wait_log(g.harness, "abort", rid="explicit"))["live"] is True

        # break out of `async for`: the iterator's finaliser aborts (we keep the stream alive,
        # so it is not the stream's own __del__ doing it).
        broken = await client.generate(request("broken", 2, FOREVER))

        async def first_chunk() -> OutputChunk:
            async for chunk in broken:
                return chunk
            raise AssertionError("the stream ended before its first chunk")

        assert (await asyncio.wait_for(first_chunk(), DEADLINE)).output_ids
        assert (await wait_log(g.harness, "abort", rid="broken"))["live"] is True
        assert broken.finished

        # `async with stream:` left early, and EngineClient.abort(rid).
        scoped = await client.generate(request("scoped", 2, FOREVER))
        async with scoped:
            await asyncio.wait_for(anext(scoped), DEADLINE)
        by_rid = await client.generate(request("by-rid", 2, FOREVER))
        await asyncio.wait_for(anext(by_rid), DEADLINE)
        assert client.abort("by-rid") is True and client.abort("by-rid") is False
        for rid in ("scoped", "by-rid"):
            assert (await wait_log(g.harness, "abort", rid=rid))["live"] is True

        # A reader task cancelled while it waits for the next chunk.
        cancelled = await client.generate(request("cancelled", 2, FOREVER))
        await asyncio.wait_for(anext(cancelled), DEADLINE)
        reading = asyncio.Event()

        async def read_forever() -> None:
            reading.set()  # from here the task only ever waits inside the stream
            async for _ in cancelled:
                pass

        waiter = asyncio.ensure_future(read_forever())
        await asyncio.wait_for(reading.wait(), DEADLINE)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (await wait_log(g.harness, "abort", rid="cancelled"))["live"] is True

        # Aborted in the same loop iteration as it was submitted: the ADD still goes first, so
        # the engine admits it and then aborts it (never an ABORT for a rid it has not seen).
        early = await client.generate(request("early", 2, FOREVER))
        early.abort()
        assert (await wait_log(g.harness, "abort", rid="early"))["live"] is True

        # The engine finished none of them; each was aborted exactly once, in order.
        mine = ("explicit", "broken", "scoped", "by-rid", "cancelled", "early")
        assert [r for r in g.harness.events("finish") if r["rid"] in mine] == []
        again = await collect(await client.generate(request("after-aborts", 2, 2)))
        assert again[-1].finish_reason == "length"
        aborts = [r["rid"] for r in g.harness.events("abort") if r["rid"] in mine]
        assert aborts == list(mine)


async def test_stop_strings_are_refused_before_anything_is_sent(plain_group):
    async with attached(plain_group) as g:
        refused = {
            "stop-str": {"stop": "###"},
            "stop-list": {"stop": ["</s>", "\n\n"]},
            "stop-strs": {"stop_strs": ["END"]},
        }
        for rid, sp in refused.items():
            with pytest.raises(StopStringsRefused) as info:
                await g.client.generate(request(rid, 3, 4, **sp))
            assert info.value.field.startswith("sampling_params.stop")
        # Requests the engine would abort are refused locally too.
        for rid, sp in {"two": {"n": 2}, "top-p": {"top_p": 0.0}}.items():
            with pytest.raises(InvalidRequest):
                await g.client.generate(request(rid, 3, 4, **sp))
        # A sentinel behind them: once it is served, anything sent before it has arrived.
        chunks = await collect(await g.client.generate(request("sentinel", 3, 1)))
        assert chunks[-1].finish_reason == "length"
        await wait_log(g.harness, "finish", rid="sentinel")
        mine = {*refused, "two", "top-p", "sentinel"}
        assert [r["rid"] for r in g.harness.events("request") if r["rid"] in mine] == ["sentinel"]


# ------------------------------------------------------------------------- engine death


@pytest.mark.parametrize("form", [14, 9])
async def test_engine_core_dead_fails_only_that_ranks_streams(spawn_engine_harness, form):
    # In the 9-element form no output carries engine_index: the death is still attributed,
    # because ENGINE_CORE_DEAD arrives on the dead engine's own output PULL.
    harness_args = ("--dead-after-steps", "5", "--dead-rank", "1", "--output-form", str(form))
    async with engine_group(spawn_engine_harness, 2, 2, *harness_args) as g:
        survivor = await g.client.generate(request("survivor", 3, 150, pin=0))
        doomed = {
            rid: await g.client.generate(request(rid, n, FOREVER, pin=1))
            for rid, n in (("doomed-a", 4), ("doomed-b", 9))
        }
        received: dict[str, list[OutputChunk]] = {rid: [] for rid in doomed}
        survivor_running_at_death: list[bool] = []

        async def read_doomed(rid: str) -> EngineDied:
            try:
                async for chunk in doomed[rid]:
                    received[rid].append(chunk)
            except EngineDied as exc:
                survivor_running_at_death.append(not survivor.finished)
                return exc
            raise AssertionError(f"{rid} ended without EngineDied")

        *died, survived = await asyncio.gather(
            *(asyncio.wait_for(read_doomed(rid), DEADLINE) for rid in doomed), collect(survivor)
        )
        assert [(e.rid, e.engine_index) for e in died] == [("doomed-a", 3), ("doomed-b", 3)]
        assert survivor_running_at_death == [True, True]
        await wait_log(g.harness, "engine_dead", engine_index=3)
        # Whatever arrived before the death was in order.
        for rid, n in (("doomed-a", 4), ("doomed-b", 9)):
            got = tokens_of(received[rid])
            assert got == expected_tokens(n, FOREVER)[0][: len(got)] and len(got) <= 5
        assert tokens_of(survived) == expected_tokens(3, 150)[0]
        assert survived[-1].finish_reason == "length"
        # The dead rank is out of service; the live one still takes pinned and unpinned work.
        load = {x.index: (x.alive, x.state) for x in g.client.load()}
        assert load == {2: (True, "live"), 3: (False, "dead")}
        with pytest.raises(EngineUnavailable):
            await g.client.generate(request("pinned-dead", 2, 2, pin=1))
        after = await collect(await g.client.generate(request("after", 2, 2)))
        assert after[-1].finish_reason == "length"
        assert tokens_of(after) == expected_tokens(2, 2)[0]
        assert {r["engine_index"] for r in g.harness.events("request") if r["rid"] == "after"} == {
            2
        }


async def test_a_killed_engine_fails_its_streams_and_a_restarted_one_serves_again(
    spawn_engine_harness,
):
    async with engine_group(spawn_engine_harness, 1, 4) as g:
        live = await g.client.generate(request("live", 3, FOREVER))
        await asyncio.wait_for(anext(live), DEADLINE)
        g.harness.proc.kill()  # SIGKILL: no ENGINE_CORE_DEAD, only the lost connection
        with pytest.raises(EngineDied) as info:
            await collect(live)
        assert (info.value.rid, info.value.engine_index) == ("live", 4)
        assert [(x.alive, x.state) for x in g.client.load()] == [(False, "dead")]
        with pytest.raises(EngineUnavailable):
            await g.client.generate(request("while-dead", 3, 2))
        # The same rank comes back (a new process, same --zmq-engine-index): HELLO re-runs the
        # handshake and the group serves again.
        restarted = await asyncio.to_thread(
            spawn_engine_harness, g.io.handshake_address, 1, 4, "--instance-id", "second-life"
        )
        deadline = time.monotonic() + DEADLINE
        while not g.client.load()[0].alive:
            assert time.monotonic() < deadline, "the restarted engine never went live"
            await asyncio.sleep(0.005)
        # Its new registration replaces the old one in EngineInfo.
        while g.client.engines()[0].instance_id != "second-life":
            assert time.monotonic() < deadline, f"stale registration: {g.client.engines()}"
            await asyncio.sleep(0.005)
        await wait_log(restarted, "registered", engine_index=4)
        chunks = await collect(await g.client.generate(request("reborn", 3, 4)))
        assert tokens_of(chunks) == expected_tokens(3, 4)[0] and chunks[-1].engine_index == 4
        assert [r["rid"] for r in restarted.events("request")] == ["reborn"]
        await asyncio.to_thread(restarted.stop)
