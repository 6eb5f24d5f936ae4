"""The I/O loop's handlers at unit level: one `IOLoop`, its sockets replaced where needed.

What a peer sends may be wrong in ways no decoder foresaw; a handler may have a bug. Neither
may end the loop: each frame is handled inside a boundary that drops it, counts it and logs it.
"""

from __future__ import annotations

import pytest
import zmq

from tsfront import ClientConfig
from tsfront.io.loop import IOLoop, Record
from tsfront.region import E_IN_FLIGHT, E_KV_ACTIVE, E_KV_TOTAL, E_RUNNING, E_WAITING
from tsfront.wire import BatchTokenIDOutSlim, encode_output


class _Pull:
    """An output PULL holding some frames."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = list(frames)

    def recv(self, flags: int = 0) -> bytes:
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)


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
    loop.writer = None  # releases the region's buffer
    loop.region.close()
    loop.ctx.term()


@pytest.mark.parametrize(
    "tail",
    [(-1, 0, 0, 1000), (0, 1 << 32, 0, 1000), (0, 0, -(1 << 63), 1000), (1, 2, 3, -5)],
)
def test_a_load_tail_outside_u32_is_never_stored_and_the_loop_keeps_serving(loop, tail):
    engine = loop.engines[0]
    engine.pull = _Pull([_tail_frame(*tail)])
    loop._on_output(engine)
    loop._after_turn()  # publishes the engine row: must not raise
    assert engine.tail == (0, 0, 0, 0)  # never stored, never routed on
    engine.pull = _Pull([_tail_frame(3, 1, 7, 1000)])
    loop._on_output(engine)
    loop._after_turn()
    assert engine.tail == (3, 1, 7, 1000)
    row = loop.region.engines[0]
    assert (row[E_RUNNING], row[E_WAITING], row[E_KV_ACTIVE], row[E_KV_TOTAL]) == (3, 1, 7, 1000)
    metrics = loop.region.metrics()
    # The native decoder may refuse such a frame itself; either way nothing is stored.
    assert metrics["handler_errors"] == 0


def test_engine_row_words_are_clamped_into_u32(loop):
    engine = loop.engines[0]
    engine.tail = (-1, 1 << 32, 1 << 40, 5)
    engine.in_flight = -3
    loop._publish_engine(engine)
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

    def ingest(self, frame: bytes, index: int):
        self.ingested.append(frame)
        if frame == b"boom":
            raise RuntimeError("a bug in a handler")
        return (index, 0, 0, 0, 0, 1, 0, [7])  # one row, finishing slot 7

    def spilling(self) -> int:
        return 0


def test_a_failing_frame_handler_drops_that_frame_counts_it_and_serves_the_next(loop):
    engine = loop.engines[0]
    loop.writer = _BuggyWriter()
    loop.records[7] = Record(b"r7", engine, 1)
    engine.in_flight = 1
    engine.pull = _Pull([b"boom", b"ok"])
    loop._on_output(engine)
    assert loop.writer.ingested == [b"boom", b"ok"]
    assert 7 not in loop.records and engine.in_flight == 0  # the frame after it was applied
    loop._after_turn()
    assert loop.region.metrics()["handler_errors"] == 1
