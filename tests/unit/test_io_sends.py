"""The I/O loop's engine-bound sends (`IOLoop.send_add` / `send_abort`, through the group's
`InputPort`): each message reaches the engine's libzmq DEALER whole, a full queue and an
unreachable engine are reported, and a refused message leaves nothing behind it."""

from __future__ import annotations

import time

import pytest
import zmq
from support.core_fixtures import DEADLINE, wait_until_blocking

from tsfront import ClientConfig
from tsfront.io.core import FULL, SENT, UNREACHABLE
from tsfront.io.loop import IOLoop
from tsfront.wire import ABORT, ADD


@pytest.fixture
def bound():
    config = ClientConfig(
        handshake_address="tcp://127.0.0.1:0", num_engines=2, engine_queue_depth=4
    )
    loop = IOLoop(config, "sends-test")
    loop.bind()
    ctx = zmq.Context()
    yield loop, ctx
    ctx.destroy(linger=0)
    loop.close()


def pump(loop: IOLoop, wait_ms: int = 5) -> None:
    """The input ports' part of one loop turn, as `IOLoop.run` does it: accept, read and write
    what the poll says, then send what the turn queued."""
    for key, mask in loop.poller.poll(wait_ms):
        if key in loop.input_listener:
            loop.on_input_accept(loop.input_listener[key])
        elif key in loop.input_conn:
            loop.on_input(loop.input_conn[key], key, mask)
    for port in loop.input_of:
        port.flush()


def received(loop: IOLoop, dealer: zmq.Socket, count: int) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} arrived"
        pump(loop)
        while dealer.poll(0):
            got.append(dealer.recv_multipart())
    return got


def _engine_dealer(loop: IOLoop, ctx: zmq.Context, row: int, rcvhwm: int = 0) -> zmq.Socket:
    """A DEALER with engine ``row``'s identity on the group's input port, once routable."""
    engine = loop.core.engines[row]
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, engine.identity)
    dealer.setsockopt(zmq.RCVHWM, rcvhwm)
    dealer.connect(engine_input(loop))

    def routed() -> bool:
        pump(loop)
        return loop.send_abort(engine, b"probe")

    wait_until_blocking(routed, "a route to the dealer")
    assert received(loop, dealer, 1) == [[ABORT, b"probe"]]
    return dealer


def engine_input(loop: IOLoop) -> str:
    return loop.core.groups[0].input_address


def test_an_add_and_an_abort_reach_the_engine_whole_whatever_the_payload_type(bound):
    loop, ctx = bound
    dealer = _engine_dealer(loop, ctx, 0)
    engine = loop.core.engines[0]
    assert loop.send_add(engine, b"payload-bytes") == SENT
    assert loop.send_add(engine, zmq.Frame(b"payload-frame" * 100)) == SENT
    assert loop.send_abort(engine, b"abort-batch") is True
    assert received(loop, dealer, 3) == [
        [ADD, b"payload-bytes"],
        [ADD, b"payload-frame" * 100],
        [ABORT, b"abort-batch"],
    ]


def test_an_engine_with_no_connection_is_unreachable_and_nothing_is_sent(bound):
    loop, ctx = bound
    dealer = _engine_dealer(loop, ctx, 0)
    assert loop.send_add(loop.core.engines[1], b"nowhere") == UNREACHABLE
    assert loop.send_abort(loop.core.engines[1], b"nowhere") is False
    # The refused message left no frames on the socket: the next one is whole.
    assert loop.send_add(loop.core.engines[0], b"next") == SENT
    assert received(loop, dealer, 1) == [[ADD, b"next"]]


def test_a_full_engine_queue_is_reported_and_every_message_taken_arrives_whole(bound):
    loop, ctx = bound
    dealer = _engine_dealer(loop, ctx, 0, rcvhwm=1)
    engine = loop.core.engines[0]
    sent = 0
    statuses = []
    for i in range(100_000):
        status = loop.send_add(engine, b"add-%d" % i)
        statuses.append(status)
        if status == FULL:
            break
        sent += 1
    assert statuses[-1] == FULL, "the queue never filled"
    assert sent == loop.config.engine_queue_depth  # the turn never ended: none went yet
    assert loop.send_abort(engine, b"refused") is False
    assert received(loop, dealer, sent) == [[ADD, b"add-%d" % i] for i in range(sent)]
    pump(loop, 200)
    assert not dealer.poll(200)  # nothing of the refused ones followed
    assert loop.send_add(engine, b"room-again") == SENT  # the kernel took the rest
    assert received(loop, dealer, 1) == [[ADD, b"room-again"]]
