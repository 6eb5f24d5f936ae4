"""Disaggregated prefill/decode end to end: one I/O process, a prefill group and a decode group
of simulated ranks in PD mode (a prefill rank finishes with ``length`` after its bootstrap
token; a decode rank streams, its first token being that bootstrap token).

Pinned: both sides receive the same full prompt, the same room and the same bootstrap fields;
the prefill rank is the room's residue; only the decode rank's tokens reach the stream (the
prefill rank's finish is consumed); a prefill failure and a decode failure each end the stream
with an error naming the side and abort the other side; an abort reaches both; the groups show
in `engines()` and `load()` with their roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.core_fixtures import (
    DEADLINE,
    FOREVER,
    collect,
    expected_tokens,
    in_thread,
    next_chunk,
    request,
)

from tsfront import (
    ClientConfig,
    ConfigError,
    DeadlineExceeded,
    EngineClient,
    EngineDied,
    EngineGroup,
    EngineStalled,
    InvalidRequest,
    IOProcess,
    PrefillFailed,
    Routing,
    StreamRejected,
    WireDecodeError,
)
from tsfront.io.disagg import fill_bootstrap
from tsfront.sim import SimGroup
from tsfront.wire import decode_add, encode_add
from tsfront.wire.request import bootstrap_offset

PREFILL_BASE = 0
DECODE_BASE = 0  # both groups start at 0, as two TokenSpeed deployments do
BOOTSTRAP_PORT = 8998


def _group(n: int, first: int, **extra: Any) -> EngineGroup:
    private = f"ipc://@tsfront-test-{secrets.token_hex(8)}"
    return EngineGroup(
        "tcp://127.0.0.1:0",
        input_address=f"{private}-in",
        output_address=f"{private}-out",
        first_engine_index=first,
        num_engines=n,
        **extra,
    )


@dataclass
class PDRig:
    io: IOProcess
    prefill: SimGroup
    decode: SimGroup
    client: EngineClient


@contextlib.asynccontextmanager
async def pd_rig(
    num_prefill: int = 2,
    num_decode: int = 2,
    *,
    prefill_options: dict[str, Any] | None = None,
    decode_options: dict[str, Any] | None = None,
    prefill_ranks: dict[int, dict[str, Any]] | None = None,
    bootstrap_host: str | None = None,
    config: dict[str, Any] | None = None,
) -> AsyncIterator[PDRig]:
    cfg = ClientConfig(
        routing=Routing.disaggregated(
            prefill=_group(
                num_prefill,
                PREFILL_BASE,
                bootstrap_host=bootstrap_host,
                bootstrap_port=BOOTSTRAP_PORT,
            ),
            decode=_group(num_decode, DECODE_BASE),
        ),
        handshake_timeout=DEADLINE,
        **(config or {}),
    )
    io = await asyncio.to_thread(IOProcess.start, cfg)
    groups: list[SimGroup] = []
    client = None
    try:
        assert io.prefill is not None
        prefill = SimGroup(
            io.prefill["handshake_address"],
            num_prefill,
            PREFILL_BASE,
            rank_options=prefill_ranks,
            disaggregation_mode="prefill",
            **(prefill_options or {}),
        ).start()
        groups.append(prefill)
        decode = SimGroup(
            io.handshake_address,
            num_decode,
            DECODE_BASE,
            disaggregation_mode="decode",
            **(decode_options or {}),
        ).start()
        groups.append(decode)
        client = await EngineClient.attach(io.address, timeout=DEADLINE)
        yield PDRig(io, prefill, decode, client)
    finally:
        if client is not None:
            await client.close()
        for g in reversed(groups):
            await asyncio.to_thread(g.stop)
        await asyncio.to_thread(io.stop)


async def test_both_sides_get_the_same_prompt_room_and_bootstrap_fields_and_only_decode_streams():
    async with pd_rig(2, 2, bootstrap_host="10.1.2.3") as r:
        rids = [f"pd-{i}" for i in range(8)]
        prompt = list(range(5, 105))
        streams = [await r.client.generate(request(rid, 6, prompt=prompt)) for rid in rids]
        results = await asyncio.gather(*(collect(s) for s in streams))
        rooms = set()
        for rid, (tokens, chunks) in zip(rids, results, strict=True):
            # The decode rank's whole stream, its first token being the bootstrap token: the
            # prefill rank's one-token "length" finish was consumed, not shown.
            assert tokens == expected_tokens(rid, 6), (rid, tokens)
            assert chunks[-1].finish_reason == "length"
            assert chunks[-1].completion_tokens == 6
            p_index, p_req = await in_thread(r.prefill.wait_request, rid, DEADLINE)
            d_index, d_req = await in_thread(r.decode.wait_request, rid, DEADLINE)
            assert all(c.engine_index == d_index for c in chunks)
            assert p_req.input_ids == prompt and d_req.input_ids == prompt
            room = p_req.bootstrap_room
            assert isinstance(room, int) and 0 <= room < 1 << 63
            assert (
                (p_req.bootstrap_host, p_req.bootstrap_port, p_req.bootstrap_room)
                == (
                    d_req.bootstrap_host,
                    d_req.bootstrap_port,
                    d_req.bootstrap_room,
                )
                == ("10.1.2.3", BOOTSTRAP_PORT, room)
            )
            # TokenSpeed's rule: the decode rank pulls the KV cache from prefill rank room % n.
            assert p_index == PREFILL_BASE + room % 2
            rooms.add(room)
        assert len(rooms) == len(rids)  # a fresh room per request
        # No prefill row went through the native writer (it would find the rid unbound once
        # the decode stream finished, or finish the slot early).
        metrics = r.client.metrics()
        assert metrics["unknown_rows"] == 0


async def test_bootstrap_host_defaults_to_the_prefill_engines_own_address():
    async with pd_rig(1, 1) as r:
        stream = await r.client.generate(request("host", 3))
        tokens, _ = await collect(stream)
        assert tokens == expected_tokens("host", 3)
        _, p_req = await in_thread(r.prefill.wait_request, "host", DEADLINE)
        _, d_req = await in_thread(r.decode.wait_request, "host", DEADLINE)
        assert p_req.bootstrap_host == d_req.bootstrap_host == "127.0.0.1"


async def test_engines_and_load_show_both_groups_with_their_roles():
    async with pd_rig(2, 3) as r:
        infos = r.client.engines()
        assert [(e.role, e.rank, e.index) for e in infos] == [
            ("decode", 0, DECODE_BASE),
            ("decode", 1, DECODE_BASE + 1),
            ("decode", 2, DECODE_BASE + 2),
            ("prefill", 0, PREFILL_BASE),
            ("prefill", 1, PREFILL_BASE + 1),
        ]
        stream = await r.client.generate(request("load", FOREVER))
        await next_chunk(stream)
        loads = r.client.load()
        assert [load.role for load in loads] == [e.role for e in infos]
        assert all(load.alive for load in loads)
        assert sum(load.in_flight for load in loads if load.role == "decode") == 1
        # The prefill rank finished its part (its in-flight count dropped back).
        deadline = time.monotonic() + DEADLINE
        while sum(load.in_flight for load in r.client.load() if load.role == "prefill"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        stream.abort()


async def test_an_abort_reaches_both_sides():
    # The prefill rank holds the request (it never steps), the decode rank streams.
    async with pd_rig(1, 1, prefill_options={"silent_after_steps": 0}) as r:
        stream = await r.client.generate(request("both", FOREVER))
        await next_chunk(stream)
        stream.abort()
        await in_thread(r.prefill.wait_abort, "both", DEADLINE)
        await in_thread(r.decode.wait_abort, "both", DEADLINE)
        att = r.client._att
        assert len(att.slots.free) == att.spw


async def test_a_prefill_failure_ends_the_stream_with_a_prefill_error_and_aborts_decode():
    async with pd_rig(1, 1, prefill_options={"silent_after_steps": 0}) as r:
        stream = await r.client.generate(request("p-dies", FOREVER))
        await next_chunk(stream)  # the decode side is streaming
        p_index = r.prefill.engine_indices[0]
        await in_thread(lambda: r.prefill.engine(p_index).stop(sentinel=True))
        with pytest.raises(EngineDied) as info:
            await collect(stream)
        assert info.value.side == "prefill" and info.value.engine_index == p_index
        assert "prefill engine" in str(info.value)
        await in_thread(r.decode.wait_abort, "p-dies", DEADLINE)


async def test_a_prefill_abort_ends_the_stream_with_prefill_failed_and_aborts_decode():
    async with pd_rig(1, 1, prefill_options={"prefill_abort": True}) as r:
        stream = await r.client.generate(request("p-aborts", FOREVER))
        with pytest.raises(PrefillFailed) as info:
            await collect(stream)
        assert info.value.side == "prefill"
        await in_thread(r.decode.wait_abort, "p-aborts", DEADLINE)


async def test_a_decode_failure_ends_the_stream_with_a_decode_error_and_aborts_prefill():
    async with pd_rig(1, 1, prefill_options={"silent_after_steps": 0}) as r:
        stream = await r.client.generate(request("d-dies", FOREVER))
        await next_chunk(stream)
        d_index = r.decode.engine_indices[0]
        await in_thread(lambda: r.decode.engine(d_index).stop(sentinel=True))
        with pytest.raises(EngineDied) as info:
            await collect(stream)
        assert info.value.side == "decode" and info.value.engine_index == d_index
        await in_thread(r.prefill.wait_abort, "d-dies", DEADLINE)


async def test_a_dead_prefill_rank_moves_rooms_to_the_live_residue():
    async with pd_rig(2, 1) as r:
        dead = r.prefill.engine_indices[0]
        await in_thread(lambda: r.prefill.engine(dead).stop(sentinel=True))
        deadline = time.monotonic() + DEADLINE
        while r.client.load()[1].alive:  # row 1: prefill rank 0
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        for i in range(6):
            stream = await r.client.generate(request(f"live-{i}", 2))
            tokens, _ = await collect(stream)
            assert tokens == expected_tokens(f"live-{i}", 2)
            p_index, p_req = await in_thread(r.prefill.wait_request, f"live-{i}", DEADLINE)
            assert p_index == PREFILL_BASE + 1 and p_req.bootstrap_room % 2 == 1


async def test_bootstrap_fields_set_by_the_caller_are_refused():
    async with pd_rig(1, 1) as r:
        with pytest.raises(InvalidRequest, match="bootstrap_room"):
            await r.client.generate(request("mine", 3, bootstrap_room=7))


def test_fill_bootstrap_rewrites_only_the_three_fields():
    req = request("fill", 4, prompt=list(range(1000)), pin=1, return_logprob=True)
    payload = encode_add(req)
    at = bootstrap_offset(req, payload)
    filled = fill_bootstrap(payload, at, "h", None, (1 << 63) - 1)
    out = decode_add(filled)
    assert (out.bootstrap_host, out.bootstrap_port, out.bootstrap_room) == (
        "h",
        None,
        (1 << 63) - 1,
    )
    assert out.input_ids == req.input_ids and out.data_parallel_rank == 1
    assert out.return_logprob is True and out.rid == "fill"
    with pytest.raises(WireDecodeError, match="placeholders"):
        fill_bootstrap(payload, at - 1, "h", None, 1)


def test_disaggregated_config_round_trips_and_adopts_the_decode_group():
    cfg = ClientConfig(
        routing=Routing.disaggregated(
            prefill=_group(2, 10, bootstrap_port=9000), decode=_group(3, 20)
        )
    )
    assert cfg.num_engines == 3 and cfg.first_engine_index == 20
    assert ClientConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="bootstrap_port"):
        EngineGroup("tcp://127.0.0.1:0", bootstrap_port=70000)
    with pytest.raises(ConfigError, match="EngineGroup"):
        Routing.disaggregated(prefill="tcp://x:1", decode=_group(1, 0))  # type: ignore[arg-type]


async def test_a_deadline_aborts_both_sides():
    async with pd_rig(1, 1, prefill_options={"silent_after_steps": 0}) as r:
        stream = await r.client.generate(request("pd-late", FOREVER), deadline=0.3)
        with pytest.raises(DeadlineExceeded):
            await collect(stream)
        await in_thread(r.prefill.wait_abort, "pd-late", DEADLINE)
        await in_thread(r.decode.wait_abort, "pd-late", DEADLINE)


async def test_a_restarted_prefill_rank_handshakes_on_its_own_groups_socket_and_serves():
    async with pd_rig(1, 1) as r:
        p_index = r.prefill.engine_indices[0]
        await in_thread(lambda: r.prefill.engine(p_index).stop(sentinel=True))
        deadline = time.monotonic() + DEADLINE
        while r.client.load()[1].alive:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        # Same identity as the decode rank (both groups start at 0): the new process must be
        # answered on the prefill handshake, and the decode rank left alone.
        again = SimGroup(
            r.io.prefill["handshake_address"], 1, PREFILL_BASE, disaggregation_mode="prefill"
        ).start()
        try:
            while not r.client.load()[1].alive:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            stream = await r.client.generate(request("after", 3))
            tokens, _ = await collect(stream)
            assert tokens == expected_tokens("after", 3)
            await in_thread(again.wait_request, "after", DEADLINE)
            assert r.client.load()[0].alive
        finally:
            await asyncio.to_thread(again.stop)


async def test_a_stalled_decode_rank_fails_its_streams_and_is_probed_by_a_pair_of_our_own():
    config = {"stall_timeout": 1.0, "stall_fail_timeout": 1.0}
    async with pd_rig(1, 2, config=config) as r:
        stuck = 1
        held = await r.client.generate(request("held", FOREVER, pin=stuck))
        await next_chunk(held)
        await in_thread(r.decode.engine(stuck).stall)
        with pytest.raises(EngineStalled) as info:
            await collect(held)
        assert info.value.engine_index == stuck and info.value.side == "decode"
        # A decode engine serves only a request with a bootstrap room: the probe is a pair,
        # the same rid and room on a prefill engine and on the stalled decode engine.
        r.decode.engine(stuck).resume()
        await in_thread(r.decode.engine(stuck).wait_abort, "held", DEADLINE)

        def probes(group: SimGroup, index: int) -> dict[str, int | None]:
            return {
                q.rid: q.bootstrap_room
                for q in group.engine(index).requests()
                if q.rid.startswith("tsfront-probe-")
            }

        deadline = time.monotonic() + DEADLINE
        while r.client.load()[stuck].state != "live":
            assert time.monotonic() < deadline, "the probe did not clear the stall"
            await asyncio.sleep(0.01)
        on_decode, on_prefill = probes(r.decode, stuck), probes(r.prefill, PREFILL_BASE)
        assert on_decode and on_decode.items() <= on_prefill.items()
        assert all(room is not None for room in on_decode.values())
        tokens, _ = await collect(await r.client.generate(request("after", 3, pin=stuck)))
        assert tokens == expected_tokens("after", 3)


def test_a_prefill_send_that_times_out_ends_with_a_prefill_error_and_aborts_decode():
    import zmq
    from support.io_core import bring_live, core_rig

    from tsfront.io.core import FULL, Record
    from tsfront.io.disagg import Disaggregated
    from tsfront.io.engines import PendingSend
    from tsfront.ipc.region import FIN_PREFILL_SEND_TIMEOUT

    cfg = ClientConfig(
        routing=Routing.disaggregated(prefill=_group(1, 0), decode=_group(1, 0)),
    )

    class _Writer:
        def __init__(self) -> None:
            self.finishes: list = []

        def finish(self, slot, code, index):
            self.finishes.append((slot, code, index))
            return True

        def unbind(self, slot):
            return True

    with core_rig(cfg, writer=_Writer()) as core:
        writer = core.writer
        core.prefill = disagg = Disaggregated(core, core.groups[1])
        decode, prefill = core.engines
        assert (decode.role, prefill.role) == ("decode", "prefill")
        bring_live(core, decode, fd=1)
        bring_live(core, prefill, fd=2)
        core.ports.add_status = FULL  # the prefill engine's queue takes nothing
        record = core.records[7] = Record(b"r", decode, 3, sent=True)
        record.prefill, record.room = prefill, 5
        disagg.pending[(prefill.row, b"r")] = 7
        decode.in_flight = prefill.in_flight = 1
        prefill.backlog.append(PendingSend(7, 3, zmq.Frame(b"ADD"), 10.0, 0.0, True))
        core.retry_backlog(prefill, now=11.0)
        assert writer.finishes == [(7, FIN_PREFILL_SEND_TIMEOUT, prefill.index)]
        assert not core.records and not disagg.pending
        assert decode.aborts == ["r"] and prefill.aborts == []  # only decode had it
        assert decode.in_flight == prefill.in_flight == 0
        assert core.ports.adds == []  # it never left


async def test_a_rid_the_prefill_engine_was_told_to_abort_is_refused_on_another_decode_rank():
    async with pd_rig(1, 2, prefill_options={"silent_after_steps": 0}) as r:
        stream = await r.client.generate(request("reused", FOREVER, pin=0))
        await next_chunk(stream)
        stream.abort()
        await in_thread(r.prefill.wait_abort, "reused", DEADLINE)
        other = await EngineClient.attach(r.io.address, timeout=DEADLINE)
        try:
            # Decode rank 1 never saw the rid, but the prefill engine would drop it silently.
            again = await other.generate(request("reused", 3, pin=1))
            with pytest.raises(StreamRejected, match="aborted"):
                await collect(again)
            assert r.client.metrics()["reused_rids"] == 1
        finally:
            await other.close()


async def test_tsfront_sim_ranks_in_pd_mode_serve_a_disaggregated_io_process():
    import subprocess
    import sys

    cfg = ClientConfig(
        routing=Routing.disaggregated(prefill=_group(1, 0), decode=_group(1, 0)),
        handshake_timeout=DEADLINE,
    )
    io = await asyncio.to_thread(IOProcess.start, cfg)
    procs = []
    try:
        for mode, address in (
            ("prefill", io.prefill["handshake_address"]),
            ("decode", io.handshake_address),
        ):
            procs.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "tsfront", "sim", "--handshake", address),
                        *("--num-engines", "1", "--disaggregation-mode", mode),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        client = await EngineClient.attach(io.address, timeout=DEADLINE)
        try:
            tokens, chunks = await collect(await client.generate(request("cli-pd", 4)))
            assert tokens == expected_tokens("cli-pd", 4)
            assert chunks[-1].finish_reason == "length"
        finally:
            await client.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await asyncio.to_thread(io.stop)
