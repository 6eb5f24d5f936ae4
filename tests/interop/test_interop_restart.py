"""Restarting the I/O process while TokenSpeed's real engine transport keeps running.

The peers are the interop harness (``harness.py`` in ``.interop-venv``): each rank dials with
the engine's own ``connect_msgpack_engine`` and serves through its ``MsgpackRecvSocket`` /
``MsgpackSendSocket``, so whether its sockets reconnect to a new I/O process, and with which
identity, is the engine's code's answer, not ours. The I/O process is SIGKILLed mid-stream;
a new one started with the same config and state directory takes the ranks over with no new
handshake, aborts the dead process's requests on the engines (read back from the harness
log: ``abort`` lines with ``live: true``), and serves new requests on every rank. A rank
restarted in the gap handshakes again; a rank gone for good is declared dead
``handshake_timeout`` after the start.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from pathlib import Path

import pytest
from sim_rules import expected_tokens
from test_interop_client import DEADLINE, FOREVER, collect, free_port, request, tokens_of, wait_log

from tsfront import ClientConfig, EngineClient, IOProcess, IOProcessDied, StreamRejected


def fixed_config(state_dir: Path, num_engines: int, **extra) -> ClientConfig:
    """Fixed addresses: TCP handshake on a fixed port, input and output on private ipc names."""
    private = f"ipc://@tsfront-interop-{secrets.token_hex(8)}"
    return ClientConfig(
        handshake_address=f"tcp://127.0.0.1:{free_port()}",
        input_address=f"{private}-in",
        output_address=f"{private}-out",
        num_engines=num_engines,
        handshake_timeout=extra.pop("handshake_timeout", DEADLINE),
        state_dir=str(state_dir),
        **extra,
    )


def sigkill(io: IOProcess) -> None:
    os.kill(io.pid, signal.SIGKILL)
    io.stop()


async def wait_state(client: EngineClient, rank: int, state: str, timeout: float = DEADLINE):
    deadline = time.monotonic() + timeout
    while client.load()[rank].state != state:
        assert time.monotonic() < deadline, f"rank {rank} not {state}: {client.load()}"
        await asyncio.sleep(0.005)


async def test_engines_keep_running_through_an_io_process_sigkill(spawn_engine_harness, tmp_path):
    config = fixed_config(tmp_path / "state", 2)
    procs = [await asyncio.to_thread(IOProcess.start, config)]
    try:
        harness = await asyncio.to_thread(spawn_engine_harness, config.handshake_address, 2, 0)
        old = await EngineClient.attach(procs[0].address, timeout=DEADLINE)
        rids = [f"orphan-{k}" for k in range(4)]
        streams = [
            await old.generate(request(r, 3, FOREVER, pin=k % 2)) for k, r in enumerate(rids)
        ]
        for s in streams:
            await asyncio.wait_for(anext(s), DEADLINE)

        sigkill(procs[0])
        for s in streams:
            with pytest.raises(IOProcessDied):
                await collect(s)
        await old.close()

        t0 = time.monotonic()
        procs.append(await asyncio.to_thread(IOProcess.start, config))
        client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
        await wait_state(client, 0, "live")
        first = await client.generate(request("first", 3, 3, pin=0))
        await asyncio.wait_for(anext(first), DEADLINE)
        took = time.monotonic() - t0
        print(f"\nnew I/O process start -> first served token: {took * 1000:.0f} ms")
        await collect(first)

        # Each orphan was aborted on the engine that held it, while it was still running there,
        # exactly once.
        for k, rid in enumerate(rids):
            line = await wait_log(harness, "abort", rid=rid)
            assert (line["engine_index"], line["live"]) == (k % 2, True)
        await wait_state(client, 1, "live")
        for rank in (0, 1):
            chunks = await collect(await client.generate(request(f"after-{rank}", 3, 4, pin=rank)))
            assert tokens_of(chunks) == expected_tokens(3, 4)[0]
            assert chunks[-1].engine_index == rank
        aborted = [r["rid"] for r in harness.events("abort")]
        assert sorted(aborted) == sorted(rids)
        assert client.metrics()["orphan_aborts"] == 4
        # No engine restarted or handshook again: one process, two registrations in all.
        assert harness.proc.poll() is None
        assert len(harness.events("registered")) == 2
        # A reuse of an orphan's rid (the engine would drop it unanswered) is refused.
        with pytest.raises(StreamRejected):
            await collect(await client.generate(request("orphan-0", 3, 3, pin=0)))
        await client.close()
    finally:
        for p in procs:
            await asyncio.to_thread(p.stop)


async def test_a_rank_restarted_in_the_gap_rehandshakes_and_one_gone_is_dead(
    spawn_engine_harness, tmp_path
):
    config = fixed_config(tmp_path / "state", 3)
    procs = [await asyncio.to_thread(IOProcess.start, config)]
    try:
        ranks = [
            await asyncio.to_thread(spawn_engine_harness, config.handshake_address, 1, k)
            for k in range(3)
        ]
        old = await EngineClient.attach(procs[0].address, timeout=DEADLINE)
        for k in range(3):
            await wait_state(old, k, "live")
        await old.close()

        sigkill(procs[0])
        ranks[1].proc.kill()
        ranks[1].proc.wait()
        restarted = await asyncio.to_thread(
            spawn_engine_harness, config.handshake_address, 1, 1, "--instance-id", "second-life"
        )
        ranks[2].proc.kill()  # gone for good
        ranks[2].proc.wait()

        timeout = 3.0
        again = ClientConfig(
            **{**config.to_dict(), "routing": config.routing, "handshake_timeout": timeout}
        )
        t0 = time.monotonic()
        procs.append(await asyncio.to_thread(IOProcess.start, again))
        client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
        await wait_state(client, 0, "live")
        await wait_state(client, 1, "live")
        await wait_log(restarted, "registered", engine_index=1)
        deadline = time.monotonic() + DEADLINE
        while client.engines()[1].instance_id != "second-life":
            assert time.monotonic() < deadline, f"stale registration: {client.engines()}"
            await asyncio.sleep(0.005)
        for rank in (0, 1):
            chunks = await collect(await client.generate(request(f"r{rank}", 3, 3, pin=rank)))
            assert tokens_of(chunks) == expected_tokens(3, 3)[0]
            assert chunks[-1].engine_index == rank
        assert len(ranks[0].events("registered")) == 1  # taken over, never handshook again
        await wait_state(client, 2, "dead", timeout + DEADLINE)
        dead_after = time.monotonic() - t0
        assert timeout <= dead_after < timeout + 2.0, dead_after
        await client.close()
    finally:
        for p in procs:
            await asyncio.to_thread(p.stop)
