"""The engine output address read without libzmq (`tsfront.io.outputs.OutputPort`), against
real peers: libzmq PUSH sockets over TCP, ipc paths and the abstract namespace, raw sockets
that lie or fall silent. Every wait is a poll with a deadline."""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest
import zmq

from tsfront.errors import ConfigError
from tsfront.io import outputs
from tsfront.io.outputs import OutputPort
from tsfront.wire.addresses import split_tcp
from tsfront.wire.zmtp import GREETING, command, frame

ACCEPTED, DISCONNECTED = int(zmq.EVENT_ACCEPTED), int(zmq.EVENT_DISCONNECTED)
DEADLINE = 10.0


class Driver:
    """The I/O loop's part, for one port, as `IOLoop` does it: poll, accept, read, and the
    heartbeat tick only when the port's ``due`` says so; items collected."""

    def __init__(self, port: OutputPort) -> None:
        self.port = port
        self.poll = select.poll()
        self.poll.register(port.listener.fileno(), select.POLLIN)
        self.items: list[object] = []
        self.polled: set[int] = set()
        self.due = 0.0
        port.on_close = self.closed  # as the loop does: out of the poll before the fd is reused

    def closed(self, fd: int) -> None:
        if fd in self.polled:
            self.polled.discard(fd)
            self.poll.unregister(fd)

    def turn(self, wait_ms: int = 20) -> None:
        port = self.port
        wait = int(max(0.0, min(wait_ms / 1000, self.due - time.monotonic())) * 1000) + 1
        for fd, _ in self.poll.poll(wait):
            if fd == port.listener.fileno():
                for new in port.accept(time.monotonic()):
                    self.poll.register(new, select.POLLIN)
                    self.polled.add(new)
            elif fd in port.connections:
                port.read(fd, time.monotonic())
            self.due = min(self.due, port.due)
        now = time.monotonic()
        if now >= self.due:
            port.tick(now)
            self.due = port.due
        while (item := port.take()) is not None:
            self.items.append(item)

    def until(self, done: Callable[[], bool], within: float = DEADLINE) -> None:
        end = time.monotonic() + within
        while not done():
            assert time.monotonic() < end, f"not done within {within} s: {self.items!r}"
            self.turn()

    def frames(self) -> list[bytes]:
        return [i for i in self.items if isinstance(i, bytes)]

    def events(self) -> list[int]:
        return [i[0] for i in self.items if isinstance(i, tuple)]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)  # a failed test's socket must not hang the teardown


def _ready(kind: bytes) -> bytes:
    """A peer's greeting and READY naming its socket type ``kind``, written from the spec."""
    return GREETING + command(b"READY", b"\x0bSocket-Type" + len(kind).to_bytes(4, "big") + kind)


PUSH_HANDSHAKE = _ready(b"PUSH")


def _raw_peer(port: OutputPort) -> socket.socket:
    """A plain TCP connection to the port (a peer that speaks, or not, as the test says)."""
    host, p = split_tcp(port.address)
    return socket.create_connection((host, int(p)))


def _heard(ctx: zmq.Context, d: Driver, first: bytes) -> zmq.Socket:
    """A libzmq PUSH connected to the driver's port, once its first message ``first`` is in."""
    push = _push(ctx, d.port.address)
    push.send(first)
    d.until(lambda: d.frames()[-1:] == [first])
    return push


def _push(ctx: zmq.Context, address: str, **options: int) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 2000)
    for name, value in options.items():
        s.setsockopt(getattr(zmq, name), value)
    s.connect(address)
    return s


@pytest.mark.parametrize("kind", ["tcp", "ipc", "abstract"])
def test_a_libzmq_push_is_accepted_and_its_messages_come_in_order_before_its_end(
    ctx, tmp_path, kind
):
    address = {
        "tcp": "tcp://127.0.0.1:0",
        "ipc": f"ipc://{tmp_path}/out",
        "abstract": f"ipc://@tsfront-test-out-{os.getpid()}",
    }[kind]
    port = OutputPort(address, 1.0, 2.0)
    try:
        d = Driver(port)
        push = _push(ctx, port.address)
        sent = [b"one", b"x" * 300, os.urandom(200_000), b""]
        for m in sent:
            push.send(m)
        push.send_multipart([b"first", b"ignored extra"])
        d.until(lambda: len(d.frames()) == 5)
        assert d.frames() == [*sent, b"first"]
        assert d.events() == [ACCEPTED]
        push.close()
        d.until(lambda: DISCONNECTED in d.events())
        assert d.items[0][0] == ACCEPTED and d.items[-1][0] == DISCONNECTED
        assert d.items[0][1] == d.items[-1][1]  # the same connection's number
        assert not port.connections
    finally:
        port.close()
    if kind == "ipc":
        assert not os.path.exists(address[len("ipc://") :])  # the socket file goes with it


def test_connections_are_numbered_uniquely_though_the_kernel_reuses_their_fds(ctx):
    port = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0)
    try:
        d = Driver(port)
        numbers = []
        for i in range(3):
            push = _push(ctx, port.address)
            push.send(b"m%d" % i)
            d.until(lambda i=i: len(d.frames()) == i + 1)
            push.close()
            d.until(lambda i=i: d.events().count(DISCONNECTED) == i + 1)
        numbers = [n for kind, n in (i for i in d.items if isinstance(i, tuple))]
        assert d.events() == [ACCEPTED, DISCONNECTED] * 3
        assert len(set(numbers)) == 3  # each pair its own number
    finally:
        port.close()


def test_a_live_push_answers_the_heartbeat_and_stays_while_a_silent_peer_is_dropped(ctx):
    interval, timeout = 0.1, 0.2
    port = OutputPort("tcp://127.0.0.1:0", interval, timeout)
    try:
        d = Driver(port)
        push = _heard(ctx, d, b"hello")
        # A raw peer that completes the handshake, then never answers a PING.
        silent = _raw_peer(port)
        silent.sendall(PUSH_HANDSHAKE)
        d.until(lambda: d.events().count(ACCEPTED) == 2)
        started = time.monotonic()
        d.until(lambda: DISCONNECTED in d.events())
        took = time.monotonic() - started
        assert interval + timeout - 0.05 <= took < 5 * (interval + timeout)
        # The libzmq peer answered every PING: it is still there, and still heard.
        assert len(port.connections) == 1
        end = time.monotonic() + 4 * (interval + timeout)
        while time.monotonic() < end:
            d.turn()
        assert len(port.connections) == 1 and d.events().count(DISCONNECTED) == 1
        push.send(b"still here")
        d.until(lambda: d.frames()[-1:] == [b"still here"])
        silent.close()
    finally:
        port.close()


def _slow_ponger(sock: socket.socket, delay: float, stop: threading.Event) -> None:
    """A PUSH that answers each PING only ``delay`` seconds after it (a loaded engine host)."""
    sock.settimeout(0.01)
    while not stop.is_set():
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return
        for _ in range(data.count(b"\x04PING")):
            if stop.wait(delay):
                return
            sock.sendall(command(b"PONG"))


def test_an_idle_engine_whose_pongs_come_late_is_kept(ctx):
    """An engine that sends nothing is kept alive by its PONGs alone, even when each comes
    well after its PING: its first PING goes as soon as its handshake is done (not at the
    handshake's deadline, where a late PONG would miss the connection's deadline)."""
    interval, timeout = 0.1, 0.2
    port = OutputPort("tcp://127.0.0.1:0", interval, timeout)
    stop = threading.Event()
    peer = _raw_peer(port)
    ponger = threading.Thread(target=_slow_ponger, args=(peer, 0.08, stop), daemon=True)
    try:
        d = Driver(port)
        peer.sendall(PUSH_HANDSHAKE)
        d.until(lambda: d.events() == [ACCEPTED])
        ponger.start()
        end = time.monotonic() + 10 * (interval + timeout)
        while time.monotonic() < end:
            d.turn()
        assert d.events() == [ACCEPTED] and len(port.connections) == 1
    finally:
        stop.set()
        ponger.join(5)
        peer.close()
        port.close()


def test_the_push_drops_us_when_we_stop_pinging_it(ctx):
    """Our PING carries a TTL: a libzmq PUSH that hears nothing for that long reconnects, as
    it did with the PULL's ``HEARTBEAT_TTL``."""
    port = OutputPort("tcp://127.0.0.1:0", 0.1, 0.3)
    try:
        d = Driver(port)
        push = _heard(ctx, d, b"a")
        d.turn()  # one PING with its TTL (0.3 s) goes out
        fd = next(iter(port.connections))
        # Stop every turn of ours for this connection: no read, no PING. The peer's TTL ends it.
        end = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < end, "the PUSH kept a connection we stopped pinging"
            r, _, _ = select.select([fd], [], [], 0.05)
            if r and not os.read(fd, 1 << 16):
                break  # EOF: the peer closed it
        assert not push.closed  # its TTL ended the connection, not its close
    finally:
        port.close()


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("zmtp2", b"\xff" + bytes(8) + b"\x7f" + b"\x02" + bytes(53)),
        ("plain", b"\xff" + bytes(8) + b"\x7f\x03\x01PLAIN" + bytes(15) + bytes(32)),
        ("a pull", _ready(b"PULL")),
        (
            "reserved bits",
            PUSH_HANDSHAKE + b"\x80\x01x",
        ),
    ],
)
def test_a_peer_that_lies_is_dropped_and_the_port_serves_the_next(ctx, name, sent):
    port = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0)
    try:
        d = Driver(port)
        liar = _raw_peer(port)
        liar.sendall(sent)
        d.until(lambda: port.connections != {} or d.items != [])
        # It is dropped at its first wrong byte: the socket sees EOF.
        liar.settimeout(DEADLINE)
        end = time.monotonic() + DEADLINE
        while liar.recv(4096):
            assert time.monotonic() < end
            d.turn()
        assert d.frames() == []
        # Only a completed handshake is a connection (its end is then an event too).
        assert d.events() in ([], [ACCEPTED, DISCONNECTED])
        push = _push(ctx, port.address)
        push.send(b"ok")
        d.until(lambda: d.frames() == [b"ok"])
    finally:
        port.close()


def test_a_message_over_the_limit_drops_the_connection_without_waiting_for_its_bytes():
    port = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0, max_message=1000)
    try:
        d = Driver(port)
        peer = _raw_peer(port)
        peer.sendall(PUSH_HANDSHAKE + frame(b"small") + b"\x02" + (1 << 62).to_bytes(8, "big"))
        d.until(lambda: DISCONNECTED in d.events())
        assert d.frames() == [b"small"]
        peer.close()
    finally:
        port.close()


def test_a_peer_that_never_greets_is_dropped_at_the_handshake_deadline():
    port = OutputPort("tcp://127.0.0.1:0", 0.1, 0.1)
    try:
        d = Driver(port)
        mute = _raw_peer(port)
        d.until(lambda: bool(port.connections))
        d.until(lambda: not port.connections)
        assert d.items == []  # never a connection: no event
        mute.close()
    finally:
        port.close()


def test_the_address_can_be_bound_again_at_once_by_a_successor(tmp_path, ctx):
    """A restarted I/O process binds the same output address while the old connections may
    still be in TIME_WAIT (SO_REUSEADDR), and replaces a stale ipc path, as libzmq's bind."""
    first = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0)
    address = first.address
    d = Driver(first)
    push = _push(ctx, address)
    push.send(b"a")
    d.until(lambda: d.frames() == [b"a"])
    first.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
    again = OutputPort(address, 1.0, 2.0)
    try:
        assert again.address == address
        d2 = Driver(again)
        # libzmq reconnects to the successor by itself; sent before its handshake is in, the
        # message could go to the old connection, which the PUSH had not yet seen end.
        d2.until(lambda: d2.events() == [zmq.EVENT_ACCEPTED])
        push.send(b"b")
        d2.until(lambda: d2.frames() == [b"b"])
    finally:
        again.close()
        push.close()
    path = f"ipc://{tmp_path}/stale"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path[len("ipc://") :])
    stale.close()  # the path stays, as a crashed process leaves it
    old = OutputPort(path, 1.0, 2.0)
    successor = OutputPort(path, 1.0, 2.0)  # binds the path again while the old one is open
    old.close()  # must not remove the successor's socket file
    assert os.path.exists(path[len("ipc://") :])
    successor.close()
    assert not os.path.exists(path[len("ipc://") :])


def test_an_address_that_cannot_be_bound_says_which_and_why():
    taken = OutputPort("tcp://127.0.0.1:0", 1.0, 2.0)
    try:
        with pytest.raises(ConfigError, match=re.escape("cannot bind 'tcp://127.0.0.1:")):
            OutputPort(taken.address, 1.0, 2.0)
        with pytest.raises(ConfigError, match="ipc path"):
            OutputPort("ipc://*", 1.0, 2.0)
    finally:
        taken.close()


def test_a_flood_of_silent_connections_never_keeps_the_engine_out(ctx):
    """Past its cap a port makes room by dropping the oldest connection still in its
    handshake: 40 peers that connect and say nothing hold at most the cap, and the engine's
    PUSH, connecting after them, gets in and is heard."""
    warned: list[str] = []
    port = OutputPort(
        "tcp://127.0.0.1:0", 5.0, 5.0, max_connections=4, warn=lambda kind, *a: warned.append(kind)
    )
    mute = []
    try:
        d = Driver(port)
        for _ in range(40):
            mute.append(_raw_peer(port))
            d.turn(0)
            assert len(port.connections) <= 4
        _heard(ctx, d, b"engine")
        assert len(port.connections) <= 4 and "output-dropped" in warned
    finally:
        for m in mute:
            m.close()
        port.close()


def test_a_full_port_of_pushes_closes_a_newcomer_and_keeps_serving(ctx):
    warned: list[str] = []
    port = OutputPort(
        "tcp://127.0.0.1:0", 5.0, 5.0, max_connections=1, warn=lambda kind, *a: warned.append(kind)
    )
    try:
        d = Driver(port)
        first = _push(ctx, port.address)
        first.send(b"first")
        d.until(lambda: d.frames() == [b"first"])
        second = _push(ctx, port.address)
        d.until(lambda: "output-full" in warned)
        first.send(b"again")
        d.until(lambda: d.frames() == [b"first", b"again"])
        assert d.events() == [ACCEPTED] and len(port.connections) == 1
        second.close(linger=0)
    finally:
        port.close()


def test_a_port_whose_loop_lags_stops_reading_and_leaves_the_rest_to_the_kernel(ctx):
    """Past `_BACKLOG` items not yet taken, a readable connection is not read: what the engine
    sends waits in the socket buffers (and then in its PUSH), not in our memory; once the loop
    takes items, reading goes on and nothing is lost or reordered."""
    port = OutputPort("tcp://127.0.0.1:0", 5.0, 5.0)
    try:
        d = Driver(port)
        push = _heard(ctx, d, b"0")
        held = [b"held-%d" % i for i in range(outputs._BACKLOG)]
        port.items.extend(held)  # what a lagging loop has not taken yet
        for i in range(1, 200):
            push.send(b"%d" % i)
        fd = next(iter(port.connections))
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # readable all along, never read
            select.select([fd], [], [], 0.05)
            assert port.read(fd, time.monotonic())
            assert len(port.items) == outputs._BACKLOG
        got = []
        while (item := port.take()) is not None:  # the loop catches up
            got.append(item)
        assert got == held
        d.until(lambda: len(d.frames()) == 200)
        assert d.frames() == [b"%d" % i for i in range(200)]
    finally:
        port.close()
