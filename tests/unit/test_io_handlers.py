"""The I/O process's handlers at unit level: the shell (`IOLoop`, its PULLs and control
sockets replaced where needed) and the core (`IOCore`, its ports recorded).

What a peer sends may be wrong in ways no decoder foresaw; a handler may have a bug. Neither
may end the loop: each frame is handled inside a boundary that drops it, counts it and logs it.
"""

from __future__ import annotations

import multiprocessing
import socket
import time

import pytest
import zmq
from support.core_fixtures import DEADLINE
from support.io_core import bring_live, core_rig

from tsfront import ClientConfig, _native
from tsfront.io.core import Record
from tsfront.io.engines import StallEvent
from tsfront.io.loop import DRAIN, IOLoop, WorkerConn
from tsfront.io.outputs import OutputPort
from tsfront.io.poll import READ, WRITE
from tsfront.ipc import channel
from tsfront.ipc.control import Failed, ToWorker
from tsfront.ipc.region import (
    E_IN_FLIGHT,
    E_INDEX,
    E_KV_ACTIVE,
    E_KV_TOTAL,
    E_LOAD_MS_HI,
    E_LOAD_MS_LO,
    E_REQUESTS_HI,
    E_REQUESTS_LO,
    E_RUNNING,
    E_STATE,
    E_WAITING,
    ENGINE_DEAD,
    ENGINE_LIVE,
    ENGINE_STALLED,
    FIN_DUPLICATE,
)
from tsfront.wire import (
    BatchTokenIDOutSlim,
    EngineRegistration,
    encode_hello,
    encode_output,
    encode_registration,
)


def _hold(loop: IOLoop, engine, frames: list[bytes]) -> None:
    """The engine's output port (a real one, bound on loopback) holding ``frames``, as a read
    leaves them for the drain."""
    port = loop.outputs.get(engine.row)
    if port is None:
        port = loop.outputs[engine.row] = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0)
    port.items.extend(frames)


def _tail_frame(running: int, waiting: int = 0, active: int = 0, total: int = 1000) -> bytes:
    return encode_output(
        BatchTokenIDOutSlim(
            rids=[],
            output_ids=[],
            finished_reasons=[],
            prompt_tokens=[],
            completion_tokens=[],
            cached_tokens=[],
            output_token_logprobs_val=[],
            output_token_logprobs_idx=[],
            engine_index=0,
            num_running=running,
            num_waiting=waiting,
            kv_active_pages=active,
            kv_total_pages=total,
        )
    )


@pytest.fixture
def loop():
    loop = IOLoop(ClientConfig(handshake_address="tcp://127.0.0.1:0"), "handlers-test")
    yield loop
    for port in loop.outputs.values():
        port.close()
    loop.core.writer = None  # releases the region's buffer
    loop.region.close()
    loop.ctx.term()


@pytest.mark.parametrize(
    "tail",
    [(-1, 0, 0, 1000), (0, 1 << 32, 0, 1000), (0, 0, -(1 << 63), 1000), (1, 2, 3, -5)],
)
def test_a_load_tail_outside_u32_is_never_stored_and_the_loop_keeps_serving(loop, tail):
    engine = loop.core.engines[0]
    _hold(loop, engine, [_tail_frame(*tail)])
    loop.drain_output(engine)
    loop.core.end_of_turn(time.monotonic())  # publishes the engine row: must not raise
    assert engine.tail == (0, 0, 0, 0)  # never stored, never routed on
    _hold(loop, engine, [_tail_frame(3, 1, 7, 1000)])
    loop.drain_output(engine)
    loop.core.end_of_turn(time.monotonic())
    assert engine.tail == (3, 1, 7, 1000)
    row = loop.region.engines[0]
    assert (row[E_RUNNING], row[E_WAITING], row[E_KV_ACTIVE], row[E_KV_TOTAL]) == (3, 1, 7, 1000)
    metrics = loop.region.metrics()
    # The native decoder may refuse such a frame itself; either way nothing is stored.
    assert metrics["handler_errors"] == 0


def test_a_frame_writes_its_load_tail_into_the_engine_table_itself(loop):
    # The native ingest publishes the tail; the core publishes the row only when in_flight
    # moves (a frame ending a request), so a frame that ends nothing leaves nothing dirty.
    engine = loop.core.engines[0]
    _hold(loop, engine, [_tail_frame(5, 2, 9, 800)])
    before_ms = int(time.monotonic() * 1000)
    loop.drain_output(engine)
    after_ms = int(time.monotonic() * 1000)
    row = loop.region.engines[0]
    assert (row[E_RUNNING], row[E_WAITING], row[E_KV_ACTIVE], row[E_KV_TOTAL]) == (5, 2, 9, 800)
    assert before_ms <= int(row[E_LOAD_MS_LO]) | (int(row[E_LOAD_MS_HI]) << 32) <= after_ms
    assert engine.tail == (5, 2, 9, 800) and not loop.core.dirty  # routing sees it too
    # A frame without a tail (kv_total 0) keeps the last one.
    _hold(loop, engine, [_tail_frame(0, 0, 0, 0)])
    loop.drain_output(engine)
    assert (row[E_RUNNING], row[E_KV_TOTAL]) == (5, 800) and engine.tail == (5, 2, 9, 800)


def test_ingest_refuses_a_table_row_outside_the_engine_table(loop):
    frame = _tail_frame(1)
    for row in (-2, loop.region.geometry.max_engines, 1 << 40):
        with pytest.raises((ValueError, OverflowError)):
            loop.core.writer.ingest(frame, 0, row)
    assert loop.core.writer.ingest(frame, 0, -1) is not None  # -1: the table is left alone
    assert loop.region.engines[0][E_KV_TOTAL] == 0


def test_ingest_writes_the_last_row_of_the_engine_table_and_no_other(loop):
    last = loop.region.geometry.max_engines - 1
    beyond = loop.region.layout["workers_off"]  # what follows the table
    before = [list(row) for row in loop.region.engines]
    next_bytes = bytes(loop.region.map[beyond : beyond + 256])
    loop.core.writer.ingest(_tail_frame(4, 3, 2, 900), 0, last)
    assert bytes(loop.region.map[beyond : beyond + 256]) == next_bytes
    after = [list(row) for row in loop.region.engines]
    row = after[last]
    assert (row[E_RUNNING], row[E_WAITING], row[E_KV_ACTIVE], row[E_KV_TOTAL]) == (4, 3, 2, 900)
    assert after[:last] == before[:last]  # the rows before it untouched
    # Nothing but the load words of that row: its state, index and counts as they were.
    load_words = range(E_RUNNING, E_LOAD_MS_HI + 1)
    assert [w for i, w in enumerate(row) if i not in load_words] == [
        w for i, w in enumerate(before[last]) if i not in load_words
    ]


def test_engine_row_words_are_clamped_into_u32(loop):
    engine = loop.core.engines[0]
    engine.tail = (-1, 1 << 32, 1 << 40, 5)
    engine.in_flight = -3
    loop.core.publish_engine(engine)
    row = loop.region.engines[0]
    assert (row[E_RUNNING], row[E_WAITING], row[E_KV_ACTIVE], row[E_KV_TOTAL]) == (
        0,
        0xFFFFFFFF,
        0xFFFFFFFF,
        5,
    )
    assert row[E_IN_FLIGHT] == 0


class _BuggyWriter:
    """A Writer whose ingest fails on one frame (a bug, or an input nobody foresaw)."""

    def __init__(self) -> None:
        self.ingested: list[bytes] = []

    def ingest(self, frame: bytes, index: int, table_row: int = -1):
        self.ingested.append(frame)
        if frame == b"boom":
            raise RuntimeError("a bug in a handler")
        return (index, 0, 0, 0, 0, 1, 0, [7])  # one row, finishing slot 7

    def spilling(self) -> int:
        return 0


def test_a_failing_frame_handler_drops_that_frame_counts_it_and_serves_the_next(loop):
    engine = loop.core.engines[0]
    loop.core.writer = _BuggyWriter()
    loop.core.records[7] = Record(b"r7", engine, 1)
    engine.in_flight = 1
    _hold(loop, engine, [b"boom", b"ok"])
    loop.drain_output(engine)
    assert loop.core.writer.ingested == [b"boom", b"ok"]
    assert 7 not in loop.core.records and engine.in_flight == 0  # the frame after it was applied
    loop.core.end_of_turn(time.monotonic())
    assert loop.region.metrics()["handler_errors"] == 1


# ------------------------------------------------------------------ control sends


def _control_pair(loop: IOLoop) -> tuple[WorkerConn, socket.socket]:
    """A worker control connection as the loop holds it (non-blocking, polled), and the
    worker's end, which reads only when the test says so."""
    mine, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    mine.setblocking(False)
    peer.setblocking(False)
    conn = WorkerConn(mine)
    loop.poller.register(mine.fileno())
    loop.conns[mine.fileno()] = conn
    return conn, peer


def test_control_messages_larger_than_the_socket_buffer_arrive_whole_and_in_order(loop):
    conn, peer = _control_pair(loop)
    sent = [Failed(kind=str(i), error="x" * 3000) for i in range(200)]
    for message in sent:
        assert loop.send(conn, message)
    assert conn.out  # the socket took only part of it: the rest waits, whole
    assert loop.poller.masks[conn.sock.fileno()] & WRITE
    reader = channel.MessageReader(peer, ToWorker)
    received: list[object] = []
    deadline = time.monotonic() + DEADLINE
    while len(received) < len(sent) and time.monotonic() < deadline:
        received += reader.feed()  # the worker reads what is there...
        loop.on_control(conn, WRITE)  # ...and the loop sends more when writable
    assert received == sent
    assert not conn.out and loop.poller.masks[conn.sock.fileno()] == READ
    assert conn.sock.fileno() in loop.conns
    peer.close()
    loop.detach(conn)


def test_a_worker_that_never_reads_its_control_socket_is_detached_not_waited_for(loop):
    conn, peer = _control_pair(loop)
    big = Failed(kind="padding", error="x" * (1 << 20))
    results = [loop.send(conn, big) for _ in range(8)]
    assert results[-1] is False  # over the control backlog bound: dropped
    assert conn.sock.fileno() == -1 and not loop.conns
    peer.close()


# ------------------------------------------------------------------ output connections


def _rows_frame(rid: str, tokens: list[int], completion: int, finish: str = "") -> bytes:
    return encode_output(
        BatchTokenIDOutSlim([rid], [tokens], [finish], [3], [completion], [0], [[]], [[]], 0)
    )


def test_a_lost_connection_applies_every_queued_frame_before_the_engine_is_declared_dead():
    with core_rig() as core:
        g = core.region.geometry
        reader = _native.Reader(
            core.region.map, 0, g.num_workers, g.slots_per_worker, g.ring_capacity, g.max_engines
        )
        engine = core.engines[0]
        bring_live(core, engine, fd=7)
        reader.expect(0, 1)
        assert core.writer.bind(b"r", 0, 1, False, FIN_DUPLICATE, engine.index)
        core.records[0] = Record(b"r", engine, 1)
        engine.in_flight = 1
        # More frames than one turn drains; the last finishes the request.
        frames = [_rows_frame("r", [], 0) for _ in range(3 * DRAIN)]
        core.ports.output[engine.row] = [*frames, _rows_frame("r", [42], 1, "length")]
        core.on_connection(engine, zmq.EVENT_DISCONNECTED, 7)
        assert engine.published_state == ENGINE_DEAD
        assert not core.ports.output[engine.row] and not core.records
        assert engine.aborts == []  # it finished: nothing to abort
        assert reader.poll() == [(0, [42], None, None, _native.FIN_LENGTH, 3, 1, 0, 0)]
        del reader


def test_an_engine_row_is_published_word_by_word_and_clamped_into_u32():
    # The row is packed in one call (E_STATE .. E_REQUESTS_HI in index order); each word must
    # land at its index, 64-bit counters split low / high, and a value out of u32 clamped
    # rather than raised in the loop. The second engine's row is left as it was.
    with core_rig(ClientConfig(handshake_address="tcp://127.0.0.1:0", num_engines=2)) as core:
        engine, other = core.engines
        bring_live(core, engine)
        core.publish_engine(other)
        before = [int(w) for w in core.region.engines[other.row]]
        engine.in_flight = -3  # a bug elsewhere must not raise here
        engine.tail = (5, 6, 7, 2**40)
        engine.tail_at = 0x1_2345_6789 / 1000
        engine.requests_total = 2**33 + 9
        engine.stall_move(StallEvent.SILENT, 1.0)
        core.publish_engine(engine)
        row = [int(w) for w in core.region.engines[engine.row]]
        assert row[E_STATE] == ENGINE_STALLED
        assert row[E_INDEX] == engine.index
        assert row[E_IN_FLIGHT] == 0
        assert (row[E_RUNNING], row[E_WAITING], row[E_KV_ACTIVE]) == (5, 6, 7)
        assert row[E_KV_TOTAL] == 0xFFFFFFFF
        assert row[E_LOAD_MS_LO] | row[E_LOAD_MS_HI] << 32 == 0x1_2345_6789
        assert (row[E_REQUESTS_LO], row[E_REQUESTS_HI]) == (9, 2)
        assert row[11:] == [0] * 5
        assert [int(w) for w in core.region.engines[other.row]] == before


def test_a_disconnect_of_an_earlier_engine_process_never_kills_the_current_one():
    with core_rig() as core:
        engine = core.engines[0]
        group = core.group_of(engine)
        # The first process (generation 1) connects its output as fd 5, then says
        # ENGINE_CORE_DEAD but keeps the connection; a new process handshakes (generation 2).
        bring_live(core, engine, fd=5)
        core.on_output(engine, None, b"")
        assert engine.published_state == ENGINE_DEAD
        core.on_hello(group, [engine.identity, encode_hello()])
        reg = encode_registration(EngineRegistration(max_model_len=4096))
        core.on_registration(group, [engine.identity, reg])
        assert engine.generation == 2 and engine.connections == {5: 1}
        core.on_connection(engine, zmq.EVENT_DISCONNECTED, 5)
        assert engine.published_state == ENGINE_LIVE
        assert core.counts["stale_disconnects"] == 1 and core.counts["output_disconnects"] == 1
        core.on_connection(engine, zmq.EVENT_ACCEPTED, 6)
        assert engine.connections == {6: 2}
        core.on_connection(engine, zmq.EVENT_DISCONNECTED, 6)
        assert engine.published_state == ENGINE_DEAD


def _watch_row(engines, row: int, started, stop, out) -> None:
    """In another process: read the row's state and kv_total words until told to stop; how
    often the state was 0 (ENGINE_ABSENT), how often kv_total was 0 after it had been set, and
    how many reads."""
    zeros = lost = reads = 0
    seen = False
    words = memoryview(engines[row])  # u32 items, each read by one load: ~10x numpy's rate
    started.set()
    while not stop.is_set():
        for _ in range(1000):
            reads += 1
            if words[E_STATE] == 0:
                zeros += 1
            total = words[E_KV_TOTAL]
            if total:
                seen = True
            elif seen:
                lost += 1
    words.release()
    out.put((zeros, lost, reads))


def _hammer_row(core, engine, write) -> tuple[int, int, int]:
    """``write(i)`` for i up to 200,000 (or DEADLINE) while another process reads the engine's
    row (`_watch_row`): its (zeros, lost, reads)."""
    ctx = multiprocessing.get_context("fork")
    started, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (core.region.engines, engine.row, started, stop, out)
    child = ctx.Process(target=_watch_row, args=args)
    child.start()
    try:
        assert started.wait(DEADLINE), "the reading process did not start"
        deadline = time.monotonic() + DEADLINE
        for i in range(200_000):
            write(i)
            if i % 10_000 == 0 and time.monotonic() > deadline:
                break
    finally:
        stop.set()
        result = out.get(timeout=DEADLINE)
        child.join(DEADLINE)
    return result


def test_a_worker_reading_an_engine_row_while_it_is_published_never_sees_it_absent():
    # struct's pack_into zeroes its target before packing: done on the shared row, a worker
    # reading between the two saw ENGINE_ABSENT ("no engine of the group is live").
    with core_rig() as core:
        engine = core.engines[0]
        bring_live(core, engine)

        def publish(i: int) -> None:
            engine.in_flight = i & 0xFF
            core.publish_engine(engine)

        zeros, _, reads = _hammer_row(core, engine, publish)
        assert reads > 0
        assert zeros == 0, f"{zeros} of {reads} reads saw the row's state as 0"


def test_a_row_written_by_the_ingest_and_the_core_in_turns_never_reads_absent_or_empty():
    # Two writers of one row in the I/O process, one after the other: the native ingest (the
    # load words) and the core's publication (the whole row). A worker reading it meanwhile
    # sees whole words only: the state never 0, the load tail never gone once there.
    with core_rig() as core:
        engine = core.engines[0]
        bring_live(core, engine)
        frames = [_tail_frame(i, 1, i, 1000 + i) for i in range(1, 8)]

        def ingest_and_publish(i: int) -> None:
            frame = frames[i % 7]
            core.on_output(engine, core.writer.ingest(frame, engine.index, engine.row), frame)
            if i % 3 == 0:
                engine.in_flight = i & 0xFF
                core.publish_engine(engine)

        zeros, lost, reads = _hammer_row(core, engine, ingest_and_publish)
        assert reads > 0
        assert zeros == 0, f"{zeros} of {reads} reads saw the row's state as 0"
        assert lost == 0, f"{lost} of {reads} reads saw the load tail gone after it was set"
        assert core.region.engines[engine.row][E_KV_TOTAL] == engine.tail[3]


def test_a_drain_takes_at_most_its_limit_in_order_and_leaves_the_rest_for_the_next_turn(loop):
    """A port's frames and connection events are applied in their order, at most `DRAIN` a
    drain; what is left marks the engine in `backlog` (the next turn's poll does not block)."""
    engine = loop.core.engines[0]
    conn = 99
    items = [
        (zmq.EVENT_ACCEPTED, conn),
        *[_tail_frame(1 + i % 7) for i in range(DRAIN - 1)],
        _tail_frame(40),
        (zmq.EVENT_DISCONNECTED, conn),
    ]
    _hold(loop, engine, items)
    loop.drain_output(engine)
    # The event and DRAIN - 1 frames: the last frame and the end wait.
    assert engine.tail[0] == 1 + (DRAIN - 2) % 7
    assert conn in engine.connections
    assert loop.backlog == {engine.row: engine}
    assert len(loop.outputs[engine.row].items) == 2
    del loop.backlog[engine.row]
    loop.drain_output(engine)
    assert engine.tail[0] == 40  # the frame before the end was applied first
    assert conn not in engine.connections
    assert not loop.backlog and not loop.outputs[engine.row].items
