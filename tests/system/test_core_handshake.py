"""The handshake, end to end: HELLO → INIT → READY → registration, as the client reports it.

Real I/O processes, simulated ranks over loopback TCP: the `EngineInfo` of every rank, the
embedded ways in (`EngineClient.connect`, `ClientListener.bind` → `accept`) and the handshake
timeout.
"""

from __future__ import annotations

import asyncio

import pytest
from support.core_fixtures import (
    DEADLINE,
    collect,
    engine_rids,
    expected_tokens,
    free_port,
    request,
    rig,
)

from tsfront import (
    ClientClosed,
    ClientConfig,
    ClientListener,
    EngineClient,
    HandshakeTimeout,
    IOProcess,
)
from tsfront.sim import SimGroup


def _check_engines(client: EngineClient, io_outputs: list[str], first: int, n: int) -> None:
    engines = client.engines()
    assert [e.index for e in engines] == [first + r for r in range(n)]
    assert [e.rank for e in engines] == list(range(n))
    assert [e.output_address for e in engines] == io_outputs
    for rank, e in enumerate(engines):
        # The registration fields the sim sent, as a TokenSpeed rank of an n-way DP group.
        assert e.data_parallel_rank == rank
        assert e.data_parallel_size == n
        assert e.world_size == n
        assert e.tensor_parallel_size == 1
        assert e.max_model_len == 32768
        assert e.kv_cache_size_tokens == 4095 * 64
        assert e.prefix_granularity == 64
        assert e.vllm_version == "tokenspeed-0.1.1"
        assert e.context_limit == 32768
    loads = client.load()
    assert [(x.index, x.rank, x.alive, x.state) for x in loads] == [
        (first + r, r, True, "live") for r in range(n)
    ]


async def test_handshake_with_one_rank_registers_it():
    async with rig(1) as r:
        _check_engines(r.client, r.io.output_addresses, 0, 1)
        stream = await r.client.generate(request("solo", 4))
        tokens, chunks = await collect(stream)
        assert tokens == expected_tokens("solo", 4)
        assert {c.engine_index for c in chunks} == {0}


async def test_handshake_with_four_ranks_from_a_nonzero_first_index():
    async with rig(4, first_engine_index=7) as r:
        _check_engines(r.client, r.io.output_addresses, 7, 4)
        assert len(set(r.io.output_addresses)) == 4  # one output PULL per engine
        # Each rank is reachable by its rank number and answers with its own index.
        for rank in range(4):
            rid = f"pinned-{rank}"
            tokens, chunks = await collect(await r.client.generate(request(rid, 3, pin=rank)))
            assert tokens == expected_tokens(rid, 3)
            assert {c.engine_index for c in chunks} == {7 + rank}
            assert engine_rids(r.sim, 7 + rank) == [rid]


async def test_embedded_connect_runs_as_written():
    # The embedded example: a fixed handshake port the engines are told to dial.
    port = free_port()
    sim = SimGroup(f"tcp://127.0.0.1:{port}", 2).start()
    client = None
    try:
        client = await EngineClient.connect(
            ClientConfig(
                handshake_address=f"tcp://127.0.0.1:{port}", num_engines=2, handshake_timeout=10
            )
        )
        assert [e.index for e in client.engines()] == [0, 1]
        stream = await client.generate(request("embedded", 5))
        tokens, chunks = await collect(stream)
        assert tokens == expected_tokens("embedded", 5)
        assert chunks[-1].finish_reason == "length"
        address = client.address
    finally:
        if client is not None:
            await client.close()
        await asyncio.to_thread(sim.stop)
    # The client owned its I/O process: closing it stopped the process.
    with pytest.raises(ClientClosed):
        await EngineClient.attach(address, timeout=1)


async def test_client_listener_binds_then_accepts_the_engines():
    listener = await ClientListener.bind(
        ClientConfig(handshake_address="tcp://127.0.0.1:0", num_engines=2, handshake_timeout=10)
    )
    sim = None
    client = None
    try:
        # The addresses are real (ports resolved) before any engine dialed.
        assert listener.handshake_address.startswith("tcp://127.0.0.1:")
        assert not listener.handshake_address.endswith(":0")
        assert listener.input_address.startswith("tcp://127.0.0.1:")
        assert len(listener.output_addresses) == 2
        assert all(not a.endswith(":0") for a in listener.output_addresses)
        sim = SimGroup(listener.handshake_address, 2).start()
        client = await listener.accept()
        assert client.address == listener.address
        assert [e.output_address for e in client.engines()] == listener.output_addresses
        await asyncio.to_thread(sim.wait_registered, DEADLINE)
        # The engines were told the advertised addresses.
        for rank in range(2):
            inp, out = sim.engine(rank).init_addresses
            assert inp == listener.input_address
            assert out == listener.output_addresses[rank]
        tokens, _ = await collect(await client.generate(request("listened", 3)))
        assert tokens == expected_tokens("listened", 3)
        with pytest.raises(ClientClosed):
            await listener.accept()  # accepted once; the client owns the process now
    finally:
        if client is not None:
            await client.close()
        await listener.close()
        if sim is not None:
            await asyncio.to_thread(sim.stop)


async def test_attach_raises_handshake_timeout_without_engines():
    io = await asyncio.to_thread(
        IOProcess.start,
        ClientConfig(handshake_address="tcp://127.0.0.1:0", num_engines=2, handshake_timeout=0.3),
    )
    try:
        with pytest.raises(HandshakeTimeout):
            await EngineClient.attach(io.address)
        # A worker attaching after the failure learns it at once.
        with pytest.raises(HandshakeTimeout):
            await asyncio.wait_for(EngineClient.attach(io.address), 2)
    finally:
        await asyncio.to_thread(io.stop)


async def test_handshake_timeout_names_the_missing_rank():
    io = await asyncio.to_thread(
        IOProcess.start,
        ClientConfig(handshake_address="tcp://127.0.0.1:0", num_engines=2, handshake_timeout=0.5),
    )
    sim = SimGroup(io.handshake_address, 1).start()  # rank 0 only; engine 1 never dials
    try:
        with pytest.raises(HandshakeTimeout, match=r"\[1\]"):
            await EngineClient.attach(io.address)
    finally:
        await asyncio.to_thread(sim.stop)
        await asyncio.to_thread(io.stop)


async def test_connect_raises_handshake_timeout_without_engines():
    config = ClientConfig(
        handshake_address="tcp://127.0.0.1:0", num_engines=1, handshake_timeout=0.3
    )
    with pytest.raises(HandshakeTimeout):
        await asyncio.wait_for(EngineClient.connect(config), DEADLINE)
