"""The engines' input address served without libzmq (`tsfront.io.inputs.InputPort`), against
real peers: libzmq DEALER sockets over TCP and the abstract namespace, a DEALER that stops
reading, two with one identity, raw sockets that lie or fall silent. Every wait is a poll with
a deadline."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
import zmq

from tsfront.io.core import FULL, SENT, UNREACHABLE
from tsfront.io.inputs import InputPort
from tsfront.io.poll import READ, WRITE, Poll
from tsfront.wire.addresses import split_tcp
from tsfront.wire.zmtp import GREETING, command, frame

DEADLINE = 10.0
ENGINE = b"\x01\x00"


class Driver:
    """The I/O loop's part, for one port, as `IOLoop` does it: one `Poll`, accept, read,
    write when the port asks, flush at the end of each turn, ticks when due; what arrived
    collected in ``messages``."""

    def __init__(self, port: InputPort) -> None:
        self.port = port
        self.poll = Poll()
        self.poll.register(port.listener.fileno())
        self.messages: list[list[bytes]] = []
        port.on_close = self.poll.unregister
        port.on_write = self.want_write
        self.write_waits = 0  # how often a connection held bytes the kernel would not take

    def want_write(self, fd: int, wanted: bool) -> None:
        self.write_waits += wanted
        self.poll.want(fd, READ | WRITE if wanted else READ)

    def turn(self, wait_ms: int = 20) -> None:
        port = self.port
        for fd, mask in self.poll.poll(wait_ms):
            if fd == port.listener.fileno():
                for new in port.accept(time.monotonic()):
                    if new not in self.poll.masks:
                        self.poll.register(new)
                continue
            if mask & WRITE:
                port.writable(fd)
            if mask & ~WRITE and fd in port.connections:
                port.read(fd)
        now = time.monotonic()
        if now >= port.due:
            port.tick(now)
        port.flush()
        while (m := port.take()) is not None:
            self.messages.append(m)

    def until(self, done: Callable[[], bool], within: float = DEADLINE) -> None:
        end = time.monotonic() + within
        while not done():
            assert time.monotonic() < end, f"not done within {within} s: {self.messages!r}"
            self.turn()


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def _dealer(ctx: zmq.Context, address: str, identity: bytes | None = ENGINE, **options: int):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        s.setsockopt(zmq.IDENTITY, identity)
    for name, value in options.items():
        s.setsockopt(getattr(zmq, name), value)
    s.connect(address)
    return s


def _registered(ctx: zmq.Context, d: Driver, identity: bytes = ENGINE, **options: int):
    """A DEALER that dialled the port and whose registration is in (as an engine's)."""
    dealer = _dealer(ctx, d.port.address, identity, **options)
    dealer.send(b"ready:" + identity)
    d.until(lambda: [identity, b"ready:" + identity] in d.messages)
    return dealer


def _received(d: Driver, dealer: zmq.Socket, count: int) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    end = time.monotonic() + DEADLINE
    while len(got) < count:
        assert time.monotonic() < end, f"{len(got)} of {count} arrived"
        d.turn(1)
        while dealer.poll(0):
            got.append(dealer.recv_multipart())
    return got


def _port(address: str = "tcp://127.0.0.1:0", depth: int = 64, **kw) -> InputPort:
    return InputPort(address, 1 << 20, depth, kw.pop("handshake", 2.0), **kw)


@pytest.fixture
def d():
    """A port at the defaults (TCP, a queue of 64), driven as the loop does; closed after."""
    port = _port()
    yield Driver(port)
    port.close()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:0", "ipc://@tsfront-test-input-{pid}"])
def test_a_dealer_registers_and_gets_what_is_sent_to_its_identity_in_order(ctx, address):
    import os

    port = _port(address.format(pid=os.getpid()), depth=1024)
    d = Driver(port)
    try:
        dealer = _registered(ctx, d)
        assert d.messages == [[ENGINE, b"ready:" + ENGINE]]
        sent = [(b"\x01", b"add-%d" % i + b"x" * (i * 37)) for i in range(300)]
        for kind, payload in sent:
            assert port.send(ENGINE, kind, payload) == SENT
        assert port.send(ENGINE, b"\x02", memoryview(b"abort")) == SENT
        got = _received(d, dealer, 301)
        assert got == [[k, p] for k, p in sent] + [[b"\x02", b"abort"]]
    finally:
        port.close()


def test_an_identity_with_no_connection_is_unreachable_and_so_is_one_that_left(ctx, d):
    port = d.port
    assert port.send(ENGINE, b"\x01", b"x") == UNREACHABLE
    dealer = _registered(ctx, d)
    assert port.send(b"\x09\x00", b"\x01", b"x") == UNREACHABLE
    dealer.close()
    d.until(lambda: not port.routes)
    assert port.send(ENGINE, b"\x01", b"x") == UNREACHABLE


def test_a_dealer_that_stops_reading_fills_its_queue_then_gets_every_message_in_order(ctx):
    """FULL past the queue depth once the kernel's buffers are full; nothing of a refused
    message is queued; when the DEALER reads again the rest goes, in order, none lost."""
    depth = 8
    port = _port(depth=depth)
    d = Driver(port)
    try:
        dealer = _registered(ctx, d, RCVHWM=1, RCVBUF=4096)
        accepted: list[bytes] = []
        refused = 0
        payload = b"p" * 60_000
        end = time.monotonic() + DEADLINE
        while refused < 3:
            assert time.monotonic() < end, "never FULL"
            body = b"%06d" % len(accepted) + payload
            if port.send(ENGINE, b"\x01", body) == SENT:
                accepted.append(body)
            else:
                refused += 1
            d.turn(0)
        assert len(accepted) >= depth
        got = _received(d, dealer, len(accepted))
        assert [m[1] for m in got] == accepted
        assert port.send(ENGINE, b"\x01", b"after") == SENT  # room again
        assert _received(d, dealer, 1) == [[b"\x01", b"after"]]
    finally:
        port.close()


def test_a_second_connection_with_an_identity_in_use_waits_and_takes_it_over(ctx, d):
    port = d.port
    first = _registered(ctx, d)
    second = _dealer(ctx, port.address)
    second.send(b"ready-again")
    d.until(
        lambda: (
            len(port.connections) == 2 and all(p.session.ready for p in port.connections.values())
        )
    )
    d.turn(50)
    assert [ENGINE, b"ready-again"] not in d.messages  # held while the first is there
    assert port.send(ENGINE, b"\x01", b"to-first") == SENT
    assert _received(d, first, 1) == [[b"\x01", b"to-first"]]
    first.close()
    d.until(lambda: [ENGINE, b"ready-again"] in d.messages)  # the held one, delivered
    assert port.send(ENGINE, b"\x01", b"to-second") == SENT
    assert _received(d, second, 1) == [[b"\x01", b"to-second"]]


def test_a_dealer_without_an_identity_is_named_and_reachable(ctx, d):
    port = d.port
    dealer = _dealer(ctx, port.address, identity=None)
    dealer.send(b"hello")
    d.until(lambda: len(d.messages) == 1)
    name, body = d.messages[0]
    assert body == b"hello" and name[:1] == b"\x00" and len(name) == 5
    assert port.send(name, b"\x01", b"back") == SENT
    assert _received(d, dealer, 1) == [[b"\x01", b"back"]]


def _raw(port: InputPort) -> socket.socket:
    host, p = split_tcp(port.address)
    return socket.create_connection((host, int(p)))


def _ready(kind: bytes, identity: bytes = b"") -> bytes:
    props = b"\x0bSocket-Type" + len(kind).to_bytes(4, "big") + kind
    if identity:
        props += b"\x08Identity" + len(identity).to_bytes(4, "big") + identity
    return GREETING + command(b"READY", props)


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("a PUSH", _ready(b"PUSH")),
        ("a message before READY", GREETING + frame(b"x")),
        ("reserved flags", _ready(b"DEALER", b"\x05\x00") + b"\x80\x01x"),
        ("too large", _ready(b"DEALER", b"\x05\x00") + b"\x02" + (1 << 40).to_bytes(8, "big")),
    ],
)
def test_a_peer_that_lies_is_dropped_and_an_engine_still_registers(ctx, name, sent):
    warnings: list[str] = []
    port = _port(warn=lambda kind, message, *args: warnings.append(message % args))
    d = Driver(port)
    try:
        liar = _raw(port)
        liar.sendall(sent)
        d.until(lambda: not port.connections and bool(warnings))
        assert "dropped a connection" in warnings[0]
        assert b"\x05\x00" not in port.routes
        liar.close()
        _registered(ctx, d)  # the port serves the next
    finally:
        port.close()


def test_a_peer_that_never_finishes_its_handshake_is_dropped_at_the_deadline(ctx):
    port = _port(handshake=0.3)
    d = Driver(port)
    try:
        silent = _raw(port)
        d.until(lambda: len(port.connections) == 1)
        started = time.monotonic()
        d.until(lambda: not port.connections)
        assert time.monotonic() - started < DEADLINE / 2
        silent.close()
        dealer = _registered(ctx, d)
        d.turn(400)  # past another deadline: a ready connection is kept
        assert port.routes.get(ENGINE) is not None
        dealer.close()
    finally:
        port.close()


def test_a_flood_of_silent_connections_never_keeps_an_engine_out(ctx):
    port = _port(max_connections=8)
    d = Driver(port)
    flood = []
    try:
        for _ in range(20):
            flood.append(_raw(port))
            d.turn(0)
        d.until(lambda: len(port.connections) == 8)
        _registered(ctx, d)  # took the place of the oldest silent one
        assert len(port.connections) <= 8
    finally:
        for s in flood:
            s.close()
        port.close()


def test_close_gives_queued_messages_their_linger(ctx):
    port = _port()
    d = Driver(port)
    dealer = _registered(ctx, d)
    for i in range(50):
        assert port.send(ENGINE, b"\x02", b"abort-%d" % i) == SENT
    port.close(linger=1.0)  # never flushed by a turn: close sends them
    got = []
    end = time.monotonic() + DEADLINE
    while len(got) < 50 and time.monotonic() < end:
        if dealer.poll(100):
            got.append(dealer.recv_multipart())
    assert got == [[b"\x02", b"abort-%d" % i] for i in range(50)]


def _slow_reader(address: str, count: int, seed: int, done) -> None:
    """An engine DEALER in another process that reads slower than the port writes: pauses
    between bursts of reads, so the kernel's buffers and the port's queue fill again and
    again. Says how many arrived in order (``done``), -1 at the first out of order."""
    import random

    rng = random.Random(seed)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, ENGINE)
    dealer.setsockopt(zmq.RCVHWM, 16)
    dealer.setsockopt(zmq.RCVBUF, 8192)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    dealer.send(b"ready:" + ENGINE)
    got = 0
    while got < count and dealer.poll(int(DEADLINE * 1000)):
        for _ in range(rng.randint(1, 64)):
            try:
                kind, body = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if kind != b"\x01" or int(body[:8]) != got:
                done.value = -1
                return
            got += 1
        if rng.random() < 0.5:
            time.sleep(rng.random() / 1000)  # the slow reader's pace, not synchronisation
    done.value = got
    dealer.close()
    ctx.term()


@pytest.mark.parametrize("seed", [1, 2])
def test_two_processes_a_slow_engine_gets_every_message_in_order_through_full_queues(seed):
    """Writers faster than the reader: the port says FULL whenever its queue holds
    `queue_depth` messages the kernel has not taken, the sender retries the same message
    (as the core's backlog does), and the engine's process reads 20,000 of them, in order,
    none lost or doubled."""
    import multiprocessing

    count, depth = 20_000, 32
    port = _port(depth=depth)
    d = Driver(port)
    mp = multiprocessing.get_context("spawn")
    done = mp.Value("i", 0)
    reader = mp.Process(target=_slow_reader, args=(port.address, count, seed, done))
    reader.start()
    try:
        d.until(lambda: [ENGINE, b"ready:" + ENGINE] in d.messages, within=30)
        for peer in port.connections.values():  # a small send buffer: the kernel fills up
            peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sent = fulls = 0
        pad = b"." * 3000
        end = time.monotonic() + 60
        while sent < count:
            assert time.monotonic() < end, f"{sent} of {count} sent"
            status = port.send(ENGINE, b"\x01", b"%08d" % sent + pad)
            if status == SENT:
                sent += 1
            else:
                assert status == FULL
                fulls += 1
                d.turn(1)  # the turn's end writes; the writable event takes the rest
        while reader.is_alive() and time.monotonic() < end:
            d.turn(5)
        reader.join(DEADLINE)
        assert done.value == count
        # At the limit: the queue filled, and the kernel took only part of what was written
        # (the rest waited for the connection to be writable).
        assert fulls > 0 and d.write_waits > 0
    finally:
        if reader.is_alive():
            reader.kill()
            reader.join()
        port.close()
