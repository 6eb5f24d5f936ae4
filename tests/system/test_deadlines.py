"""Per-request deadlines: ``generate(..., deadline=...)`` and ``ClientConfig.request_deadline``.

Every place a request can be when its time runs out: queued in the I/O process's backlog
behind an engine that stopped reading (its ADD must never be sent), sent to a rank that never
steps (waiting for its first token), and mid-stream on a slow rank. Each ends its stream with
`DeadlineExceeded`, frees its slot, and (where the ADD left) aborts the request on the engine,
checked on the engine's side. Plus the I/O process's own check on a queued ADD, unit level.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import zmq
from support.core_fixtures import DEADLINE, FOREVER, collect, in_thread, next_chunk, request, rig
from support.io_core import bring_live, core_rig
from support.raw_engine import raw_rig

from tsfront import ClientConfig, ConfigError, DeadlineExceeded, InvalidRequest
from tsfront.io.core import SENT, Record
from tsfront.io.engines import PendingSend
from tsfront.ipc.region import FIN_DEADLINE, FIN_SEND_TIMEOUT
from tsfront.ipc.submit import SUBMIT_HEADER, ticket_base


def _slots_free(client) -> bool:
    att = client._att
    return len(att.slots.free) == att.spw and not att.slots.streams


async def _in_flight_zero(client) -> None:
    async def check() -> bool:
        return all(load.in_flight == 0 for load in client.load())

    deadline = time.monotonic() + DEADLINE
    while not await check():
        assert time.monotonic() < deadline, [load.in_flight for load in client.load()]
        await asyncio.sleep(0.005)


async def test_mid_stream_on_a_slow_rank_ends_with_deadline_exceeded_and_aborts_the_engine():
    # 20 ms a step: a 0.4 s deadline lets some tokens through, then cuts the stream.
    async with rig(1, step_ms=20.0) as r:
        started = time.monotonic()
        stream = await r.client.generate(request("mid", FOREVER), deadline=0.4)
        tokens: list[int] = []
        with pytest.raises(DeadlineExceeded) as info:
            async for chunk in stream:
                tokens.extend(chunk.output_ids)
        took = time.monotonic() - started
        assert 0.4 <= took < 0.4 + 1.0, took
        assert tokens, "the tokens before the deadline are delivered"
        assert info.value.rid == "mid" and info.value.deadline == 0.4
        assert info.value.engine_index == r.sim.engine_indices[0]
        # Engine side: the ABORT reached the rank.
        await in_thread(r.sim.wait_abort, "mid", DEADLINE)
        assert _slots_free(r.client)
        await _in_flight_zero(r.client)


async def test_a_passed_deadline_is_counted_as_deadline_exceeded_with_its_abort():
    async with rig(1, silent_after_steps=0) as r:
        stream = await r.client.generate(request("counted", 5), deadline=0.2)
        with pytest.raises(DeadlineExceeded):
            await next_chunk(stream)
        requests = r.client.metrics().requests
        assert requests.finished["DeadlineExceeded"] == 1
        assert requests.finished["cancelled"] == 0
        assert requests.aborts_sent == 1


async def test_waiting_for_the_first_token_on_a_rank_that_never_steps():
    async with rig(1, silent_after_steps=0) as r:
        stream = await r.client.generate(request("first", 5), deadline=0.3)
        await in_thread(r.sim.wait_request, "first", DEADLINE)
        with pytest.raises(DeadlineExceeded, match="before its first token"):
            await next_chunk(stream)
        await in_thread(r.sim.wait_abort, "first", DEADLINE)
        assert _slots_free(r.client)
        await _in_flight_zero(r.client)


async def test_queued_in_the_backlog_of_a_stuck_engine_the_add_is_never_sent():
    # The holder's huge prompts fill the engine's queue (it never reads); the deadline
    # request waits in the I/O process's backlog behind them (send_timeout is far away).
    huge = [7] * 65536
    async with raw_rig(1, stuck=True, send_timeout=30.0, engine_queue_depth=1) as (
        _io,
        engines,
        client,
        _ctx,
    ):
        held = [
            await client.generate(request(f"holder-{i}", 4, pin=0, prompt=huge)) for i in range(20)
        ]
        started = time.monotonic()
        late = await client.generate(request("late", 4, pin=0, prompt=huge), deadline=0.3)
        with pytest.raises(DeadlineExceeded):
            await next_chunk(late)
        assert time.monotonic() - started < 0.3 + 1.0
        att = client._att
        assert len(att.slots.free) == att.spw - len(held)  # its slot is free; the holders' are not
        # The I/O process forgot it (in flight: the holders only).
        deadline = time.monotonic() + DEADLINE
        while client.load()[0].in_flight != len(held):
            assert time.monotonic() < deadline, client.load()[0].in_flight
            await asyncio.sleep(0.005)
        # A marker queued after it, without a deadline: the backlog is sent in order, so an
        # ADD of "late" would reach the engine before the marker's.
        marker = await client.generate(request("marker", 4, pin=0, prompt=huge))

        def read_until_the_marker() -> list[tuple[str, list[str]]]:
            seen: list[tuple[str, list[str]]] = []
            end = time.monotonic() + DEADLINE
            while time.monotonic() < end:
                frame = engines[0].recv_any(0.5)
                if frame is None:
                    continue
                seen.append(frame)
                if frame == ("add", ["marker"]):
                    return seen
            raise AssertionError(f"the marker's ADD never came: {seen}")

        seen = await asyncio.to_thread(read_until_the_marker)
        adds = [rid for kind, rids in seen if kind == "add" for rid in rids]
        assert adds == [f"holder-{i}" for i in range(20)] + ["marker"], seen
        assert not any("late" in rids for _, rids in seen)
        del marker, held


async def test_config_default_applies_and_a_per_request_deadline_overrides_it():
    async with rig(1, step_ms=20.0, config={"request_deadline": 0.3}) as r:
        default = await r.client.generate(request("by-default", FOREVER))
        free = await r.client.generate(request("no-deadline", 30), deadline=math.inf)
        longer = await r.client.generate(request("longer", 5), deadline=30.0)
        with pytest.raises(DeadlineExceeded) as info:
            await collect(default)
        assert info.value.deadline == 0.3
        tokens, chunks = await collect(free)
        assert len(tokens) == 30 and chunks[-1].finish_reason == "length"
        tokens, chunks = await collect(longer)
        assert len(tokens) == 5 and chunks[-1].finish_reason == "length"
        await in_thread(r.sim.wait_abort, "by-default", DEADLINE)
        assert _slots_free(r.client)


async def test_many_deadlines_share_one_timer_and_end_in_order():
    async with rig(1, silent_after_steps=0) as r:
        att = r.client._att
        # Submitted latest-first, so each new one is the earliest and re-arms the timer.
        seconds = [0.5 - 0.02 * i for i in range(20)]
        streams = [
            await r.client.generate(request(f"d-{i}", 5), deadline=s) for i, s in enumerate(seconds)
        ]
        assert len(att.slots._deadlines) == 20
        timers = [h for h in [att.slots._deadline_timer] if h is not None]
        assert len(timers) == 1 and not timers[0].cancelled()
        ended: list[str] = []

        async def one(s) -> None:
            with pytest.raises(DeadlineExceeded):
                await next_chunk(s)
            ended.append(s.rid)

        await asyncio.gather(*(one(s) for s in streams))
        assert ended == [f"d-{i}" for i in reversed(range(20))]
        assert not att.slots._deadlines and att.slots._deadline_timer is None
        assert _slots_free(r.client)
        for i in range(20):
            await in_thread(r.sim.wait_abort, f"d-{i}", DEADLINE)


async def test_the_deadline_heap_stays_bounded_by_the_open_streams():
    # Long deadlines, short requests: the ended streams' entries are compacted away long
    # before their time comes.
    async with rig(1) as r:
        att = r.client._att
        for i in range(300):
            stream = await r.client.generate(request(f"short-{i}", 1), deadline=3600.0)
            await collect(stream)
        assert len(att.slots._deadlines) <= 64 + 1, len(att.slots._deadlines)
        open_stream = await r.client.generate(request("open", FOREVER), deadline=0.2)
        with pytest.raises(DeadlineExceeded):
            await collect(open_stream)


async def test_a_request_that_finishes_in_time_is_untouched():
    async with rig(1) as r:
        stream = await r.client.generate(request("quick", 5), deadline=DEADLINE)
        tokens, chunks = await collect(stream)
        assert len(tokens) == 5 and chunks[-1].finish_reason == "length"
        assert r.sim.engine(r.sim.engine_indices[0]).aborts() == []


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "5", True])
async def test_a_bad_deadline_is_refused(bad):
    async with rig(1) as r:
        with pytest.raises(InvalidRequest, match="deadline"):
            await r.client.generate(request("bad", 5), deadline=bad)
        assert _slots_free(r.client)


@pytest.mark.parametrize("bad", [0, -2.0, "1"])
def test_config_request_deadline_must_be_positive_or_none(bad):
    with pytest.raises(ConfigError, match="request_deadline"):
        ClientConfig(request_deadline=bad)


# ------------------------------------------------------------ the I/O process's own check


class _Writer:
    def __init__(self) -> None:
        self.finishes: list[tuple[int, int]] = []

    def bind(self, rid, slot, ticket, with_logprobs, dup_code, engine_index) -> bool:
        return True

    def finish(self, slot: int, code: int, engine_index: int) -> bool:
        self.finishes.append((slot, code))
        return True

    def unbind(self, slot: int) -> bool:
        return True

    def reset_worker(self, worker: int) -> None:
        pass

    def set_worker_fd(self, worker: int, fd: int) -> None:
        pass


def test_a_queued_add_past_its_deadline_is_dropped_unsent_even_without_the_workers_abort():
    with core_rig(writer=_Writer()) as core:
        engine, writer, ports = core.engines[0], core.writer, core.ports
        bring_live(core, engine)
        # Two queued ADDs: slot 3 with a deadline at t=10, slot 4 without one.
        engine.backlog.append(PendingSend(3, 1, zmq.Frame(b"A"), deadline=100.0, expires=10.0))
        engine.backlog.append(PendingSend(4, 2, zmq.Frame(b"B"), deadline=100.0))
        core.records[3] = Record(b"a", engine, 1, sent=False)
        core.records[4] = Record(b"b", engine, 2, sent=False)
        engine.in_flight = 2
        ports.add_status = SENT  # the queue takes again, after A's deadline
        core.retry_backlog(engine, now=11.0)
        assert writer.finishes == [(3, FIN_DEADLINE)]
        assert ports.adds == [(engine.index, b"B")]  # A never left
        assert 3 not in core.records and engine.in_flight == 1
        assert not engine.backlog


def test_an_add_that_arrives_past_its_deadline_is_never_sent():
    with core_rig(writer=_Writer()) as core:
        engine, writer, ports = core.engines[0], core.writer, core.ports
        bring_live(core, engine)
        worker = core.on_attach(pid=0, eventfd=-1)
        assert worker is not None
        ticket = ticket_base(worker.serial) + 1
        header = SUBMIT_HEADER.pack(0, ticket, 0, 0, time.monotonic() - 0.001, 0) + b"gone"
        core.on_add(worker, header, zmq.Frame(b"ADD"))
        assert ports.adds == [] and writer.finishes == [(0, FIN_DEADLINE)]
        assert not core.records and engine.in_flight == 0
        # Without a deadline (0) the same ADD goes.
        header = SUBMIT_HEADER.pack(1, ticket + 1, 0, 0, 0.0, 0) + b"kept"
        core.on_add(worker, header, zmq.Frame(b"ADD"))
        assert len(ports.adds) == 1 and 1 in core.records
        assert FIN_SEND_TIMEOUT not in [code for _, code in writer.finishes]


def test_deadline_exceeded_is_a_stream_error_exported_from_tsfront():
    import tsfront

    assert issubclass(tsfront.DeadlineExceeded, tsfront.StreamError)
    assert "DeadlineExceeded" in tsfront.__all__
    assert tsfront.DeadlineExceeded.__doc__
