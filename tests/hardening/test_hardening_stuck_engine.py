"""An engine that registers and then never reads its input.

Its requests fill the engine's ZMQ queue (``engine_queue_depth``) and then the I/O process's
backlog, where each waits at most ``send_timeout`` before its stream ends with `SendTimeout`;
the healthy rank keeps serving throughout.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest
import zmq
from support.core_fixtures import DEADLINE, collect, expected_tokens, in_thread
from support.raw_engine import RawEngine, raw_rig

from tsfront import Busy, ClientConfig, EngineClient, IOProcess, SendTimeout
from tsfront.sim import SimGroup
from tsfront.wire import (
    SamplingParams,
    TokenizedGenerateReqInput,
)

SEND_TIMEOUT = 0.5
STUCK = 1  # rank of the engine that never reads


def _big_request(rid: str, pin: int, new_tokens: int = 4) -> TokenizedGenerateReqInput:
    # Large prompts, so the kernel's socket buffers hold few of them.
    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=[7] * 16384,
        stream=True,
        data_parallel_rank=pin,
        sampling_params=SamplingParams(max_new_tokens=new_tokens),
    )


async def test_engine_that_never_reads_gets_send_timeouts_and_the_healthy_rank_serves():
    # ipc data sockets: loopback TCP's autotuned buffers would absorb megabytes of requests
    # that the engine never reads, which says nothing about tsfront.
    private = f"ipc://@tsfront-test-{secrets.token_hex(8)}"
    config = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        input_address=f"{private}-in",
        output_address=f"{private}-out",
        num_engines=2,
        handshake_timeout=DEADLINE,
        send_timeout=SEND_TIMEOUT,
        engine_queue_depth=4,
    )
    io = await asyncio.to_thread(IOProcess.start, config)
    ctx = zmq.Context()
    sim = None
    client = None
    stuck_engine = None
    try:
        # Rank 0 is a simulated engine; rank 1 is registered by hand and never reads.
        sim = SimGroup(io.handshake_address, 1).start()
        # Rank 1 is a raw engine that registers and then never reads its input.
        stuck_engine = await in_thread(
            lambda: RawEngine(ctx, io.handshake_address, STUCK, rank=1, size=2, stuck=True)
        )
        client = await EngineClient.attach(io.address, timeout=DEADLINE)
        stuck = [await client.generate(_big_request(f"stuck-{i}", STUCK)) for i in range(200)]
        healthy = await client.generate(
            TokenizedGenerateReqInput(
                rid="healthy",
                input_ids=[1, 2, 3],
                stream=True,
                data_parallel_rank=0,
                sampling_params=SamplingParams(max_new_tokens=50),
            )
        )
        tokens, chunks = await collect(healthy, DEADLINE)
        assert tokens == expected_tokens("healthy", 50)
        assert chunks[-1].finish_reason == "length"

        async def outcome(stream) -> str:
            try:
                async for _ in stream:
                    pass
            except SendTimeout as exc:
                assert exc.engine_index == STUCK
                return "timeout"
            return "finished"

        pending = [asyncio.create_task(outcome(s)) for s in stuck]
        done, _ = await asyncio.wait(pending, timeout=SEND_TIMEOUT * 4 + 2)
        timed_out = [t.result() for t in done].count("timeout")
        # Most of the 200 never fit into the engine's queue or socket buffers: they time out
        # after send_timeout instead of piling up without bound.
        assert timed_out >= 150, timed_out
        assert client.load()[0].alive
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        if client is not None:
            await client.close()
        if stuck_engine is not None:
            stuck_engine.close()
        ctx.term()
        if sim is not None:
            await asyncio.to_thread(sim.stop)
        await asyncio.to_thread(io.stop)


@pytest.mark.parametrize("depth", [0, -1])
def test_engine_queue_depth_must_be_positive(depth):
    from tsfront import ConfigError

    with pytest.raises(ConfigError, match="engine_queue_depth"):
        ClientConfig(engine_queue_depth=depth)


# ---------------------------------------------------------------- a departed worker's backlog

HUGE = 65536  # prompt tokens: the stuck engine's queue and socket buffer hold a handful of these
DEPARTED_SEND_TIMEOUT = 2.0


def _huge(rid: str) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=[7] * HUGE,
        stream=True,
        data_parallel_rank=0,
        sampling_params=SamplingParams(max_new_tokens=4),
    )


async def _submitted(client: EngineClient, request: TokenizedGenerateReqInput):
    """``client.generate(request)``, waiting (within DEADLINE) while the submission ring is
    full: 20 huge ADDs are more than its 1 MiB, and a loaded machine's I/O process may not have
    drained the first ones yet. Any other refusal fails the test."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return await client.generate(request)
        except Busy as e:
            if "submission ring" not in str(e) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.005)  # polling the ring's room, bounded by the deadline


async def _departed_worker(io, holder) -> tuple[int, list[str], list]:
    """The holder fills the stuck engine's queue; worker A queues 10 requests behind it and
    departs with them open. (A's worker number, A's rids, the holder's streams)."""
    held = [await _submitted(holder, _huge(f"holder-{i}")) for i in range(20)]
    a = await EngineClient.attach(io.address, timeout=DEADLINE)
    a_rids = [f"a-{i}" for i in range(10)]
    a_streams = [await _submitted(a, _huge(rid)) for rid in a_rids]
    worker = a._att.worker
    await a.close()
    del a_streams
    return worker, a_rids, held


async def test_next_worker_on_a_departed_workers_number_keeps_its_own_send_deadlines():
    async with raw_rig(1, stuck=True, send_timeout=DEPARTED_SEND_TIMEOUT, engine_queue_depth=1) as (
        io,
        _engines,
        holder,
        _ctx,
    ):
        worker, _a_rids, _held = await _departed_worker(io, holder)
        # A deliberate gap, not a wait for anything: A's deadlines are now half a send_timeout
        # older than anything B will send.
        await asyncio.sleep(DEPARTED_SEND_TIMEOUT / 2)
        b = await EngineClient.attach(io.address, timeout=DEADLINE)
        try:
            assert b._att.worker == worker
            sent = []
            for i in range(10):
                sent.append((await _submitted(b, _huge(f"b-{i}")), time.monotonic()))

            async def waited(stream, at: float) -> float:
                with pytest.raises(SendTimeout):
                    async for _ in stream:
                        pass
                return time.monotonic() - at

            waits = await asyncio.wait_for(
                asyncio.gather(*(waited(s, at) for s, at in sent)), DEPARTED_SEND_TIMEOUT * 4
            )
            # Each waited its own send_timeout, not what was left of A's.
            assert min(waits) >= DEPARTED_SEND_TIMEOUT * 0.95, waits
        finally:
            await b.close()


async def test_a_departed_workers_queued_adds_never_reach_the_engine():
    async with raw_rig(1, stuck=True, send_timeout=30.0, engine_queue_depth=1) as (
        io,
        engines,
        holder,
        _ctx,
    ):
        worker, a_rids, _held = await _departed_worker(io, holder)
        b = await EngineClient.attach(io.address, timeout=DEADLINE)
        try:
            assert b._att.worker == worker
            b_rids = [f"b-{i}" for i in range(10)]
            _b_streams = [await _submitted(b, _huge(rid)) for rid in b_rids]

            def read_until_b_arrived() -> list[tuple[str, list[str]]]:
                # The engine reads again, until every ADD of B has come.
                seen: list[tuple[str, list[str]]] = []
                missing = set(b_rids)
                deadline = time.monotonic() + DEADLINE
                while missing and time.monotonic() < deadline:
                    frame = engines[0].recv_any(0.5)
                    if frame is not None:
                        seen.append(frame)
                        if frame[0] == "add":
                            missing.difference_update(frame[1])
                assert not missing, f"B's ADDs {sorted(missing)} never came"
                return seen

            seen = await asyncio.to_thread(read_until_b_arrived)
            adds = [rid for kind, rids in seen if kind == "add" for rid in rids]
            # Every ADD of A was still in the I/O process's backlog when A left (the holder's
            # requests filled the engine's queue): none may be sent, before or after an ABORT.
            assert not set(adds) & set(a_rids), adds
            assert adds.count("b-0") == 1 and [r for r in adds if r.startswith("b-")] == b_rids
        finally:
            await b.close()
