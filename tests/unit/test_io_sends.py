"""The I/O loop's engine-bound sends, frame by frame (`IOLoop.send_add` / `send_abort`): each
message reaches the engine whole, a full queue and an unreachable engine are reported, and a
refused message leaves nothing behind it on the socket."""

from __future__ import annotations

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


def _engine_dealer(loop: IOLoop, ctx: zmq.Context, row: int, rcvhwm: int = 0) -> zmq.Socket:
    """A DEALER with engine ``row``'s identity on the group's input ROUTER, once routable."""
    engine = loop.core.engines[row]
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, engine.identity)
    dealer.setsockopt(zmq.RCVHWM, rcvhwm)
    dealer.connect(engine_input(loop))
    wait_until_blocking(lambda: loop.send_abort(engine, b"probe"), "a route to the dealer")
    assert dealer.poll(int(DEADLINE * 1000))
    assert dealer.recv_multipart() == [ABORT, b"probe"]
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
    assert dealer.recv_multipart() == [ADD, b"payload-bytes"]
    assert dealer.recv_multipart() == [ADD, b"payload-frame" * 100]
    assert dealer.recv_multipart() == [ABORT, b"abort-batch"]


def test_an_engine_with_no_connection_is_unreachable_and_nothing_is_sent(bound):
    loop, ctx = bound
    dealer = _engine_dealer(loop, ctx, 0)
    assert loop.send_add(loop.core.engines[1], b"nowhere") == UNREACHABLE
    assert loop.send_abort(loop.core.engines[1], b"nowhere") is False
    # The refused message left no frames on the socket: the next one is whole.
    assert loop.send_add(loop.core.engines[0], b"next") == SENT
    assert dealer.recv_multipart() == [ADD, b"next"]


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
    assert loop.send_abort(engine, b"refused") is False
    got = []
    while len(got) < sent:
        assert dealer.poll(int(DEADLINE * 1000))
        got.append(dealer.recv_multipart())
    assert got == [[ADD, b"add-%d" % i] for i in range(sent)]
    assert not dealer.poll(200)  # nothing of the refused ones followed
