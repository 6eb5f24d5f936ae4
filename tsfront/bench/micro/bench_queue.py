"""The measurements behind two design choices: the local submission queue and the wake-up.

Each queue benchmark moves a burst of ``BURST`` messages (a 1,024-token ADD payload, ~3 KB,
behind a submission header) through a candidate mechanism, sender and receiver in this
process, so the figure divided by ``BURST`` is the cost of the path per message when requests
arrive back to back (a ping-pong of one message would measure ZMQ's I/O-thread hand-offs,
not its cost per message). Each wake-up benchmark is one signal, polled and consumed.
Compare them side by side from one run:

    .venv/bin/python -m pytest tsfront/bench/micro/bench_queue.py --benchmark-columns=median,ops

Results are recorded in docs/DESIGN.md ("Local queue: the choice"). The POSIX message queue
candidates need ``posix_ipc`` (the ``bench`` extra: ``pip install -e '.[test,bench]'``); without
it they are skipped and the rest still run.
"""

from __future__ import annotations

import os
import select
import socket
import uuid

import pytest
import zmq

from tsfront.wire import SamplingParams, TokenizedGenerateReqInput, encode_add

try:
    import posix_ipc
except ImportError:  # only the `bench` extra installs it; tsfront never needs it
    posix_ipc = None

PAYLOAD = encode_add(
    TokenizedGenerateReqInput(
        rid=uuid.uuid4().hex,
        input_ids=list(range(1000, 2024)),
        stream=True,
        sampling_params=SamplingParams(max_new_tokens=128),
    )
)
HEADER = b"\x00" * 17 + b"rid-0123456789abcdef"
# Bursts of 8: a POSIX queue at its default limit holds 10 messages.
BURST = 8


@pytest.fixture
def zmq_pair():
    ctx = zmq.Context(1)
    router = ctx.socket(zmq.ROUTER)
    name = f"ipc://@tsfront-bench-{uuid.uuid4().hex}"
    router.bind(name)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"w0")
    dealer.connect(name)
    dealer.send(b"hello")
    router.recv_multipart()
    yield dealer, router
    dealer.close(0)
    router.close(0)
    ctx.term()


def test_queue_zmq_ipc_dealer_router(benchmark, zmq_pair):
    """The chosen queue: DEALER → ROUTER, payload forwarded as a ZMQ frame (no copy)."""
    dealer, router = zmq_pair

    def one():
        for _ in range(BURST):
            dealer.send_multipart([b"A", HEADER, PAYLOAD], zmq.NOBLOCK, copy=False)
        for _ in range(BURST):
            frames = router.recv_multipart(copy=False)
            assert len(frames[3]) == len(PAYLOAD)

    benchmark(one)


@pytest.fixture
def mqueue():
    if posix_ipc is None:
        pytest.skip("posix_ipc is not installed (pip install -e '.[bench]')")
    q = posix_ipc.MessageQueue(
        f"/tsfront-bench-{uuid.uuid4().hex[:8]}",
        posix_ipc.O_CREX,
        max_messages=10,
        max_message_size=8192,
    )
    yield q
    q.close()
    q.unlink()


def test_queue_posix_mq_default_limits(benchmark, mqueue):
    """POSIX message queue at Linux's unprivileged defaults (10 messages of 8 KB)."""

    def one():
        for _ in range(BURST):
            mqueue.send(HEADER + PAYLOAD)
        for _ in range(BURST):
            data, _ = mqueue.receive()
            assert len(data) == len(HEADER) + len(PAYLOAD)

    benchmark(one)


def test_queue_posix_mq_refuses_a_long_prompt(mqueue):
    """Why not a POSIX queue: a 4k-token prompt does not fit its default message size."""
    long = encode_add(
        TokenizedGenerateReqInput(
            rid="r", input_ids=list(range(1000, 5096)), sampling_params=SamplingParams()
        )
    )
    with pytest.raises(ValueError):
        mqueue.send(long)


@pytest.fixture
def seqpacket():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def test_queue_unix_seqpacket(benchmark, seqpacket):
    """AF_UNIX SOCK_SEQPACKET: cheapest per message, but capped by the socket buffer size."""
    a, b = seqpacket

    def one():
        for _ in range(BURST):
            a.send(HEADER + PAYLOAD)
        for _ in range(BURST):
            assert len(b.recv(65536)) == len(HEADER) + len(PAYLOAD)

    benchmark(one)


def test_wake_eventfd(benchmark):
    """The chosen wake-up: one 8-byte eventfd write, seen by poll, read back."""
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    poller = select.poll()
    poller.register(fd, select.POLLIN)

    def one():
        os.eventfd_write(fd, 1)
        assert poller.poll(0)
        os.eventfd_read(fd)

    benchmark(one)
    os.close(fd)


def test_wake_pipe(benchmark):
    """A pipe as the wake-up (the classic self-pipe)."""
    r, w = os.pipe2(os.O_NONBLOCK)
    poller = select.poll()
    poller.register(r, select.POLLIN)

    def one():
        os.write(w, b"x")
        assert poller.poll(0)
        os.read(r, 64)

    benchmark(one)
    os.close(r)
    os.close(w)


def test_wake_zmq_pair(benchmark):
    """A ZMQ PAIR message as the wake-up (what a ZMQ-based fan-out would use)."""
    ctx = zmq.Context(1)
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    name = f"ipc://@tsfront-bench-{uuid.uuid4().hex}"
    a.bind(name)
    b.connect(name)

    def one():
        a.send(b"")
        b.recv()

    benchmark(one)
    a.close(0)
    b.close(0)
    ctx.term()
