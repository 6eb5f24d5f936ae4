"""Restarting the I/O process while the engines keep running (state directory + adoption).

The I/O process is SIGKILLed mid-stream; a new one started with the same config and state
directory binds the same addresses, loads the registrations and takes the running simulated
ranks over (their ZeroMQ sockets reconnect by themselves, with the same identity): new
requests are served on every rank without restarting any of them, the dead process's
requests still decoding on the engines are aborted there once each (seen by the ranks
themselves), a rank restarted in the gap handshakes again, and a rank gone for good is
declared dead ``handshake_timeout`` after the start. Refusals: port-0 addresses, a directory
of another group, a directory held by a live I/O process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    expected_tokens,
    free_port,
    in_thread,
    next_chunk,
    private_addresses,
    request,
    wait_until,
)
from support.hardening import RankProcess, wait_state

from tsfront import (
    ClientConfig,
    ConfigError,
    EngineClient,
    IOProcess,
    IOProcessDied,
    StateDirInUse,
    StateDirMismatch,
    StreamRejected,
)
from tsfront.io.state import StateDir
from tsfront.sim import SimGroup
from tsfront.wire import EngineRegistration


def fixed_config(state_dir: Path, num_engines: int, **extra) -> ClientConfig:
    """A group on fixed addresses (TCP handshake on a fixed port, private ipc in/out)."""
    return ClientConfig(
        handshake_address=f"tcp://127.0.0.1:{free_port()}",
        num_engines=num_engines,
        handshake_timeout=extra.pop("handshake_timeout", DEADLINE),
        state_dir=str(state_dir),
        **private_addresses(),
        **extra,
    )


def saved_indices(state_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in state_dir.glob("engine-*.json"))


def sigkill(io: IOProcess) -> None:
    """SIGKILL the I/O process (no cleanup of any kind) and reap it."""
    os.kill(io.pid, signal.SIGKILL)
    io.stop()


@contextlib.asynccontextmanager
async def started(config: ClientConfig) -> AsyncIterator[list[IOProcess]]:
    """Every I/O process a test starts goes in the list; all are stopped at the end."""
    procs: list[IOProcess] = [await asyncio.to_thread(IOProcess.start, config)]
    try:
        yield procs
    finally:
        for p in procs:
            await asyncio.to_thread(p.stop)


async def test_sigkilled_io_process_is_replaced_and_takes_the_engines_over(tmp_path):
    """Two ranks keep running through an I/O process SIGKILL: the new process serves on both
    at once, the old requests are aborted on their engines once each, and reusing one of
    those rids is refused clearly."""
    state = tmp_path / "state"
    config = fixed_config(state, 2)
    async with started(config) as procs:
        sim = SimGroup(config.handshake_address, 2).start()
        try:
            old = await EngineClient.attach(procs[0].address, timeout=DEADLINE)
            rids = [f"old-{k}" for k in range(4)]
            streams = [
                await old.generate(request(r, FOREVER, pin=k % 2)) for k, r in enumerate(rids)
            ]
            for s in streams:
                await next_chunk(s)
            assert saved_indices(state) == [0, 1]
            threads_before = sim.engines[:]

            sigkill(procs[0])
            for s in streams:  # the workers of the dead process end their streams
                with pytest.raises(IOProcessDied):
                    await collect(s)
            await old.close()

            t0 = time.monotonic()
            procs.append(await asyncio.to_thread(IOProcess.start, config))
            client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
            for rank in (0, 1):
                await wait_state(client, rank, "live")
            first = await client.generate(request("new-0", 3, pin=0))
            await next_chunk(first)
            took = time.monotonic() - t0
            print(f"\nnew I/O process start -> first served token: {took * 1000:.0f} ms")

            # Every orphan was aborted on the engine that held it, exactly once.
            for k, rid in enumerate(rids):
                assert await in_thread(sim.wait_abort, rid, DEADLINE) == k % 2
            await wait_until(lambda: client.metrics()["orphan_aborts"] == 4, "orphan_aborts 4")
            for engine in sim.engines:
                aborts = engine.aborts()
                assert sorted(aborts) == sorted(set(aborts)), aborts

            # Served on every rank, by the same rank threads (no engine restarted).
            for rank in (0, 1):
                tokens, chunks = await collect(
                    await client.generate(request(f"new-{rank}x", 6, pin=rank))
                )
                assert tokens == expected_tokens(f"new-{rank}x", 6)
                assert chunks[-1].engine_index == rank
            assert sim.engines == threads_before and all(sim.threads_alive())
            assert all(e.counters()["adds"] >= 3 for e in sim.engines)
            # The registrations were the saved ones: no HELLO, no second registration.
            assert [e.index for e in client.engines()] == [0, 1]
            assert all(e.max_model_len == 32768 for e in client.engines())

            # An orphan's rid reused within the engine's abort memory is refused, not hung.
            with pytest.raises(StreamRejected):
                await collect(await client.generate(request("old-1", 3, pin=1)))
            await collect(first)
            await client.close()
        finally:
            await asyncio.to_thread(sim.stop)


async def test_rank_restarted_in_the_gap_handshakes_and_rank_gone_is_declared_dead(tmp_path):
    """Three rank processes: while no I/O process runs, rank 1 is restarted (a new process)
    and rank 2 is killed for good. The new I/O process takes rank 0 over at once, answers
    rank 1's HELLO with the normal handshake, and declares rank 2 dead handshake_timeout
    after its start (dropping its registration)."""
    state = tmp_path / "state"
    config = fixed_config(state, 3)
    ranks: dict[int, RankProcess] = {}
    async with started(config) as procs:
        try:
            for k in range(3):
                ranks[k] = RankProcess(config.handshake_address, k, k, 3, instance_id="first")
            old = await EngineClient.attach(procs[0].address, timeout=DEADLINE)
            await wait_until(lambda: saved_indices(state) == [0, 1, 2], "3 registrations saved")
            held = await old.generate(request("held", FOREVER, pin=0))
            await next_chunk(held)
            pid0 = ranks[0].pid

            sigkill(procs[0])
            with pytest.raises(IOProcessDied):
                await collect(held)
            await old.close()
            ranks[1].kill()
            ranks[1] = RankProcess(config.handshake_address, 1, 1, 3, instance_id="second")
            ranks[2].kill()

            timeout = 3.0
            again = ClientConfig(
                **{**config.to_dict(), "routing": config.routing, "handshake_timeout": timeout}
            )
            t0 = time.monotonic()
            procs.append(await asyncio.to_thread(IOProcess.start, again))
            client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
            await wait_state(client, 0, "live")
            await wait_state(client, 1, "live")
            assert client.load()[2].state == "handshaking"  # may still come back
            # Rank 1 registered anew (its new registration, saved again).
            await wait_until(
                lambda: client.engines()[1].instance_id == "second", "rank 1 re-registered"
            )
            for rank in (0, 1):
                tokens, chunks = await collect(
                    await client.generate(request(f"r{rank}", 5, pin=rank))
                )
                assert tokens == expected_tokens(f"r{rank}", 5) and chunks[-1].engine_index == rank
            assert ranks[0].pid == pid0 and ranks[0].proc.poll() is None
            # The orphan on rank 0 ("held") was aborted there: it no longer holds a slot.
            await wait_until(lambda: client.metrics()["orphan_aborts"] == 1, "held aborted")

            await wait_state(client, 2, "dead", timeout + DEADLINE)
            dead_after = time.monotonic() - t0
            assert timeout <= dead_after < timeout + 2.0, dead_after
            assert saved_indices(state) == [0, 1]
            record = json.loads((state / "engine-1.json").read_text())
            assert record["registration"]["instance_id"] == "second"
            await client.close()
        finally:
            for p in ranks.values():
                await asyncio.to_thread(p.stop)


async def test_an_input_reconnecting_after_the_output_delays_requests_not_kills(tmp_path):
    """The rank's input DEALER comes back 1.5 s after its output PUSH: the rank is live (its
    output is back), and a request sent meanwhile waits for the input instead of declaring
    the rank dead."""
    state = tmp_path / "state"
    config = fixed_config(state, 1, send_timeout=DEADLINE)
    async with started(config) as procs:
        sim = SimGroup(config.handshake_address, 1, input_reconnect_ms=1500).start()
        try:
            await in_thread(sim.wait_registered, DEADLINE)
            await wait_until(lambda: saved_indices(state) == [0], "registration saved")
            sigkill(procs[0])
            procs.append(await asyncio.to_thread(IOProcess.start, config))
            client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
            await wait_state(client, 0, "live")
            t0 = time.monotonic()
            tokens, _ = await collect(await client.generate(request("early", 4)))
            waited = time.monotonic() - t0
            assert tokens == expected_tokens("early", 4)
            assert waited > 0.2, f"served after {waited:.3f}s: the input was never missing"
            assert client.load()[0].state == "live"
            await client.close()
        finally:
            await asyncio.to_thread(sim.stop)


async def test_stop_forgets_the_engines_and_a_handover_keeps_them(tmp_path):
    """A stop on purpose (SIGTERM) empties the directory; a handover (SIGUSR1) keeps it for
    a successor, which takes the engine over."""
    state = tmp_path / "state"
    config = fixed_config(state, 1)
    async with started(config) as procs:
        sim = SimGroup(config.handshake_address, 1).start()
        try:
            await in_thread(sim.wait_registered, DEADLINE)
            await wait_until(lambda: saved_indices(state) == [0], "registration saved")
            await asyncio.to_thread(lambda: procs[0].stop(handover=True))
            assert saved_indices(state) == [0]
            procs.append(await asyncio.to_thread(IOProcess.start, config))
            client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
            tokens, _ = await collect(await client.generate(request("after-handover", 4)))
            assert tokens == expected_tokens("after-handover", 4)
            await client.close()
            await asyncio.to_thread(procs[1].stop)
            assert saved_indices(state) == []
            assert (state / "group.json").exists()
        finally:
            await asyncio.to_thread(sim.stop)


async def test_engine_core_dead_drops_its_registration(tmp_path):
    state = tmp_path / "state"
    config = fixed_config(state, 2)
    async with started(config) as procs:
        sim = SimGroup(config.handshake_address, 2, rank_options={1: {"dead_after_steps": 2}})
        sim.start()
        try:
            client = await EngineClient.attach(procs[0].address, timeout=DEADLINE)
            await wait_until(lambda: saved_indices(state) == [0, 1], "both saved")
            with contextlib.suppress(Exception):
                await collect(await client.generate(request("dies", 10, pin=1)))
            await wait_state(client, 1, "dead")
            await wait_until(lambda: saved_indices(state) == [0], "rank 1 forgotten")
            await client.close()
        finally:
            await asyncio.to_thread(sim.stop)


def test_ephemeral_addresses_are_refused_with_a_state_dir(tmp_path):
    for name, value in (
        ("handshake_address", "tcp://127.0.0.1:0"),
        ("input_address", "tcp://127.0.0.1:0"),
        ("output_address", "tcp://*:0"),
    ):
        fields = {"handshake_address": "tcp://127.0.0.1:30599", **private_addresses()}
        fields[name] = value
        with pytest.raises(ConfigError, match=f"state_dir needs fixed addresses, but {name}"):
            ClientConfig(state_dir=str(tmp_path), **fields)


async def test_a_state_dir_of_another_group_is_refused_and_left_alone(tmp_path):
    state = tmp_path / "state"
    config = fixed_config(state, 2)
    async with started(config) as procs:
        sim = SimGroup(config.handshake_address, 2).start()
        try:
            await in_thread(sim.wait_registered, DEADLINE)
            await wait_until(lambda: saved_indices(state) == [0, 1], "both saved")
            # The same directory while its I/O process runs: refused, nothing bound.
            with pytest.raises(StateDirInUse, match="held by another running I/O process"):
                await asyncio.to_thread(IOProcess.start, config)
            sigkill(procs[0])
            before = {p.name: p.read_bytes() for p in state.glob("*.json")}
            other = ClientConfig(
                **{**config.to_dict(), "routing": config.routing, "num_engines": 3}
            )
            with pytest.raises(StateDirMismatch, match="num_engines=2 there, 3 here"):
                await asyncio.to_thread(IOProcess.start, other)
            moved = ClientConfig(
                **{**config.to_dict(), "routing": config.routing, "first_engine_index": 4}
            )
            with pytest.raises(StateDirMismatch, match="first_engine_index=0 there, 4 here"):
                await asyncio.to_thread(IOProcess.start, moved)
            assert {p.name: p.read_bytes() for p in state.glob("*.json")} == before
        finally:
            await asyncio.to_thread(sim.stop)


def test_state_dir_files_are_atomic_and_bad_ones_ignored(tmp_path):
    config = fixed_config(tmp_path, 4, first_engine_index=10)
    d = StateDir(config)
    assert d.open() == []
    reg = EngineRegistration(max_model_len=123, instance_id="x")
    d.save(11, 1, "ipc://@out.1", reg)
    d.save(12, 2, "ipc://@out.2", reg)
    (tmp_path / "engine-13.json").write_text("{not json")  # a corrupt file: ignored
    (tmp_path / ".engine-10.json.999.tmp").write_text("torn")  # a write cut short: removed
    (tmp_path / "engine-99.json").write_text(
        json.dumps(
            {"index": 99, "row": 89, "identity": "6300", "output_address": "", "registration": {}}
        )
    )  # outside the group: ignored
    d.remove(12)
    d.close()
    again = StateDir(config)
    saved = again.open()
    assert [(s.index, s.row, s.output_address) for s in saved] == [(11, 1, "ipc://@out.1")]
    assert saved[0].registration == reg
    assert not list(tmp_path.glob("*.tmp"))
    again.clear()
    assert not list(tmp_path.glob("engine-1[0-2].json"))
    again.close()


def _raw(ctx, handshake: str, index: int, size: int):
    from support.raw_engine import RawEngine

    return RawEngine(ctx, handshake, index, rank=index, size=size)


async def test_orphans_are_aborted_once_and_finished_ones_not_at_all(tmp_path):
    """A hand-driven rank, taken over: of its rows for rids the new process never bound, a
    finishing one is left alone, a running one is aborted once however many rows follow, and
    a rid the new process has bound itself is never taken for an orphan."""
    import zmq

    config = fixed_config(tmp_path / "state", 1)
    ctx = zmq.Context()
    raw = None
    async with started(config) as procs:
        try:
            raw = await asyncio.to_thread(_raw, ctx, config.handshake_address, 0, 1)
            await wait_until(lambda: saved_indices(tmp_path / "state") == [0], "saved")
            sigkill(procs[0])
            procs.append(await asyncio.to_thread(IOProcess.start, config))
            client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
            await wait_state(client, 0, "live")
            mine = await client.generate(request("mine", 3))
            assert (await in_thread(raw.recv_add)).rid == "mine"
            raw.push(
                raw.tokens_frame("done-old", [5], 9, "length"),
                raw.tokens_frame("running-old", [6], 4),
                raw.tokens_frame("running-old", [7], 5),
                raw.tokens_frame("mine", [1, 2, 3], 3, "length"),
            )
            tokens, _ = await collect(mine)
            assert tokens == [1, 2, 3]
            got = await in_thread(raw.recv_any, DEADLINE)
            assert got == ("abort", ["running-old"])
            assert await in_thread(raw.recv_any, 0.3) is None  # nothing else, ever
            assert client.metrics()["orphan_aborts"] == 1
            await client.close()
        finally:
            if raw is not None:
                raw.close()
            ctx.term()


async def test_a_sentinel_queued_in_the_gap_kills_the_rank_it_came_from(tmp_path):
    """A rank sends ENGINE_CORE_DEAD while no I/O process runs (its PUSH queues it): the new
    process gets it with the reconnection; the rank is dead, stays dead, and is forgotten."""
    import zmq

    from tsfront import EngineUnavailable
    from tsfront.sim.engine import SimEngine

    state = tmp_path / "state"
    config = fixed_config(state, 2)
    ctx = zmq.Context()
    raw = sim0 = None
    async with started(config) as procs:
        try:
            sim0 = SimEngine(
                config.handshake_address, 0, data_parallel_rank=0, data_parallel_size=2
            )
            sim0.start()
            raw = await asyncio.to_thread(_raw, ctx, config.handshake_address, 1, 2)
            await wait_until(lambda: saved_indices(state) == [0, 1], "both saved")
            sigkill(procs[0])
            raw.push_dead()
            procs.append(await asyncio.to_thread(IOProcess.start, config))
            client = await EngineClient.attach(procs[1].address, timeout=DEADLINE)
            await wait_state(client, 1, "dead")
            await wait_state(client, 0, "live")
            tokens, _ = await collect(await client.generate(request("on-0", 3, pin=0)))
            assert tokens == expected_tokens("on-0", 3)
            assert client.load()[1].state == "dead"
            with pytest.raises(EngineUnavailable):
                await client.generate(request("on-1", 3, pin=1))
            assert saved_indices(state) == [0]
            await client.close()
        finally:
            if raw is not None:
                raw.close()
            if sim0 is not None:
                await asyncio.to_thread(sim0.stop)
            ctx.term()
