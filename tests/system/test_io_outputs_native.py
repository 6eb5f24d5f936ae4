"""An engine output connection's frames applied natively as the port reads them
(`OutputPort` with ``ingest``, `tsfront._native.Writer.ingest_zmtp`).

Pinned here: the native reader takes exactly the whole one-frame messages the session's own rule
(`Session._whole_messages`, written again below from the spec) would take, for any bytes and any
cut, and hands the rest to the session; a real stream of output frames cut into two reads at
every byte applies every token once, in order, whichever of the two paths each frame took; a
frame is never applied before one that came earlier (a read while items wait goes through the
session); nothing after ENGINE_CORE_DEAD is applied; a flood of tiny messages is applied a
bounded number a read; junk never crashes it. Real sockets, real shared memory; every wait is a
poll with a deadline.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import select
import socket
import struct
import termios
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront import WireDecodeError, _native
from tsfront.io import outputs
from tsfront.io.addresses import split_tcp
from tsfront.io.outputs import Applied, OutputPort
from tsfront.wire import BatchTokenIDOutSlim, encode_output
from tsfront.wire.zmtp import GREETING, command, frame

WORKERS, SPW, CAP, ENGINES = 1, 16, 64, 2
FIN_DUPLICATE = 18
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
DEADLINE = 10.0
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PUSH_HANDSHAKE = GREETING + command(b"READY", b"\x0bSocket-Type" + (4).to_bytes(4, "big") + b"PUSH")


def output(rows: list[tuple[str, list[int], str]]) -> bytes:
    """An output frame; each row is (rid, token ids, finish reason or "")."""
    n = len(rows)
    batch = BatchTokenIDOutSlim(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [3] * n,
        [len(r[1]) for r in rows],
        [0] * n,
        [[] for _ in rows],
        [[] for _ in rows],
        0,
        1,
        0,
        2,
        100,
    )
    return encode_output(batch)


class Region:
    """A slot region with its writer (the I/O process's side) and worker 0's reader."""

    def __init__(self) -> None:
        size = _native.layout(
            num_workers=WORKERS, slots_per_worker=SPW, ring_capacity=CAP, max_engines=ENGINES
        )["total_bytes"]
        self.map = mmap.mmap(-1, size)
        self.writer = _native.Writer(self.map, WORKERS, SPW, CAP, ENGINES)
        self.reader = _native.Reader(self.map, 0, WORKERS, SPW, CAP, ENGINES)

    def bind(self, rid: str, slot: int) -> None:
        self.reader.expect(slot, slot + 1)
        assert self.writer.bind(rid.encode(), slot, slot + 1, False, FIN_DUPLICATE, 0)

    def streams(self) -> dict[int, tuple[list[int], int]]:
        """Every slot's tokens and finish code, as the worker reads them."""
        out: dict[int, tuple[list[int], int]] = {}
        while True:
            updates = self.reader.poll()
            for slot, tokens, _v, _i, finish, *_ in updates:
                got, fin = out.get(slot, ([], 0))
                assert not fin, f"slot {slot}: an update after its finish"
                out[slot] = (got + list(tokens), finish)
            spilling = self.writer.flush_spills()  # a ring was full: the rest waits there
            if not updates and not spilling:
                return out


def whole_messages(data: bytes, limit: int) -> list[tuple[int, int]]:
    """The spec's rule for a whole one-frame message, again: (start, end) of each at the head of
    ``data``, in order (RFC 23: flags, then a 1-byte size, or an 8-byte one with LONG)."""
    out, pos = [], 0
    while len(data) - pos >= 2:
        flags = data[pos]
        if flags == 0:
            start, size = pos + 2, data[pos + 1]
        elif flags == LONG and len(data) - pos >= 9:
            start, size = pos + 9, int.from_bytes(data[pos + 1 : pos + 9], "big")
        else:
            break
        if size > limit or start + size > len(data):
            break
        out.append((start, start + size))
        pos = start + size
    return out


# ------------------------------------------------------------------ the native reader alone

PIECES = st.one_of(
    st.binary(max_size=300).map(frame),
    st.binary(max_size=40).map(lambda b: frame(b, MORE)),
    st.binary(max_size=20).map(lambda b: command(b"PING", b"\x00\x10" + b)),
    st.binary(max_size=12),  # junk: reserved flags, cut headers, anything
    st.binary(min_size=1, max_size=40).map(lambda b: bytes([LONG]) + len(b).to_bytes(8, "big") + b),
)


@FAST
@given(st.lists(PIECES, max_size=12), st.integers(min_value=0, max_value=4000))
def test_the_native_reader_takes_what_the_spec_s_rule_takes_and_no_more(pieces, cut):
    data = b"".join(pieces)
    data = data[: min(cut, len(data))]
    limit = 200
    r = Region()
    buffer = bytearray(data) + b"\xee" * 7  # bytes past ``length`` are never read
    taken, outcomes = r.writer.ingest_zmtp(0, limit, 1000, memoryview(buffer), len(data))
    expected = whole_messages(data, limit)
    # Junk frames are refused by the decoder, each its own outcome; a frame of 16 bytes could
    # only be ENGINE_CORE_DEAD by chance, after which nothing is taken.
    for n, (result, frame_bytes) in enumerate(outcomes):
        start, end = expected[n]
        if result is None:
            assert data[start:end] == b"ENGINE_CORE_DEAD"
            expected = expected[: n + 1]
            break
        assert isinstance(result, WireDecodeError), result
        assert frame_bytes is None
    assert len(outcomes) == len(expected)
    assert taken == (expected[-1][1] if expected else 0)


@FAST
@given(st.binary(max_size=600), st.integers(min_value=0, max_value=5))
def test_arbitrary_bytes_never_crash_the_native_reader(junk, max_messages):
    r = Region()
    taken, outcomes = r.writer.ingest_zmtp(0, 1 << 20, max_messages, junk, len(junk))
    assert 0 <= taken <= len(junk) and len(outcomes) <= max_messages


def test_bad_arguments_are_refused_with_a_type_or_value_error():
    r = Region()
    with pytest.raises(ValueError, match="outside the buffer"):
        r.writer.ingest_zmtp(0, 100, 10, b"ab", 3)
    with pytest.raises(ValueError, match="engine_index"):
        r.writer.ingest_zmtp(70000, 100, 10, b"ab", 2)
    with pytest.raises(TypeError):
        r.writer.ingest_zmtp(0, 100, 10, b"ab")


def test_frames_are_applied_as_ingest_applies_them_and_unknown_rows_keep_their_bytes():
    r = Region()
    r.bind("a", 0)
    ours, stranger = output([("a", [5, 6], "")]), output([("zz", [1], "")])
    data = frame(ours) + frame(stranger) + frame(b"\x93junk")
    taken, outcomes = r.writer.ingest_zmtp(0, 1 << 20, 10, data, len(data))
    assert taken == len(data) and len(outcomes) == 3
    (first, f1), (second, f2), (third, f3) = outcomes
    assert first[5:] == (1, 0, []) and f1 is None  # one row, none unknown: no copy
    assert second[5:] == (1, 1, []) and f2 == stranger  # the adopter may need its bytes
    assert isinstance(third, WireDecodeError) and f3 is None
    assert r.streams() == {0: ([5, 6], 0)}


def test_nothing_after_engine_core_dead_is_taken():
    r = Region()
    r.bind("a", 0)
    data = frame(output([("a", [1], "")])) + frame(b"ENGINE_CORE_DEAD")
    after = frame(output([("a", [2], "")]))
    taken, outcomes = r.writer.ingest_zmtp(0, 1 << 20, 10, data + after, len(data + after))
    assert taken == len(data) and [o[0] is None for o in outcomes] == [False, True]
    assert r.streams() == {0: ([1], 0)}


# ------------------------------------------------------------------ through the port


class Peer:
    """A raw PUSH connected to a port with ``ingest``, after its handshake; each `send` is one
    read of the port (the port drains the socket before the next is written), after which the
    items are taken and applied as the loop's drain does, before anything more is read."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.port = OutputPort(
            "tcp://127.0.0.1:0", 30.0, 30.0, ingest=lambda *a: region.writer.ingest_zmtp(0, *a)
        )
        host, p = split_tcp(self.port.address)
        self.sock = socket.create_connection((host, int(p)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each send at once
        self.sock.sendall(PUSH_HANDSHAKE)
        self.events: list[tuple[int, int]] = []
        self.native = self.python = 0  # messages applied by each path
        self.fd = -1
        end = time.monotonic() + DEADLINE
        while not self.events:  # ACCEPTED: the handshake is done
            assert time.monotonic() < end, "no handshake"
            self._turn()
            self.drain()

    def _turn(self) -> None:
        port = self.port
        conns = [c.sock for c in port.connections.values()]
        ready, _, _ = select.select([port.listener, *conns], [], [], 0.05)
        for s in ready:
            if s is port.listener:
                self.fd = port.accept(time.monotonic())[0]
            else:
                port.read(s.fileno(), time.monotonic())

    def send(self, data: bytes, drain: bool = True) -> None:
        """Write ``data``; return once the port has read all of it (and, with ``drain``, its
        items were applied)."""
        if not data:
            return
        self.sock.sendall(data)
        conn = self.port.connections[self.fd].sock
        end = time.monotonic() + DEADLINE
        while True:
            self._turn()
            waiting = struct.unpack("i", fcntl.ioctl(conn, termios.FIONREAD, b"\0\0\0\0"))[0]
            if not waiting and not select.select([conn], [], [], 0)[0]:
                break
            assert time.monotonic() < end, "the port did not read what was sent"
        if drain:
            self.drain()

    def drain(self) -> list[object]:
        """Take every item and apply it as `IOLoop.drain_output` does; the items."""
        items = []
        while (item := self.port.take()) is not None:
            items.append(item)
            if isinstance(item, Applied):
                self.native += len(item.outcomes)
            elif isinstance(item, bytes):
                with contextlib.suppress(WireDecodeError):  # the loop warns and goes on
                    self.region.writer.ingest(item, 0)
                self.python += 1
            else:
                self.events.append(item)
        return items

    def counts(self) -> tuple[int, int]:
        """(native, python) since the last call."""
        out = (self.native, self.python)
        self.native = self.python = 0
        return out

    def close(self) -> None:
        self.sock.close()
        self.port.close()


RIDS = ["a", "b", "c"]


def stream_bytes() -> tuple[bytes, dict[int, tuple[list[int], int]]]:
    """Traffic of three requests: short and long frames, a PING, a two-frame message (its first
    frame is the output frame), the finishes; and what the worker must read of it."""
    steps = [
        [("a", [1], ""), ("b", [10], "")],
        [("a", [2], ""), ("b", [11], ""), ("c", [20] * 90, "")],  # a long frame (> 255 bytes)
        [("a", [3], "stop")],
        [("b", [12], "length"), ("c", [21], "stop")],
    ]
    data = frame(output(steps[0])) + command(b"PING", b"\x00\x10ctx")
    data += frame(output(steps[1])) + frame(output(steps[2]), MORE) + frame(b"second part")
    data += frame(output(steps[3]))
    expected = {
        0: ([1, 2, 3], _native.FIN_STOP),
        1: ([10, 11, 12], _native.FIN_LENGTH),
        2: ([20] * 90 + [21], _native.FIN_STOP),
    }
    return data, expected


def test_a_stream_cut_into_two_reads_at_every_byte_applies_every_token_once_in_order():
    data, expected = stream_bytes()
    native_cuts = python_cuts = 0
    for cut in range(len(data) + 1):
        region = Region()
        for slot, rid in enumerate(RIDS):
            region.bind(rid, slot)
        region.bind("next", 3)
        peer = Peer(region)
        try:
            peer.send(data[:cut])
            peer.send(data[cut:])
            native, python = peer.counts()
            assert native + python == 4, cut  # every message once, by one path or the other
            native_cuts += bool(native)
            python_cuts += bool(python)
            # Whatever the cut, the session is between messages again: the next read is native.
            peer.send(frame(output([("next", [7], "stop")])))
            assert peer.counts() == (1, 0), cut
            assert region.streams() == {**expected, 3: ([7], _native.FIN_STOP)}, cut
            assert peer.port.connections, cut  # the PING was answered, nothing was refused
        finally:
            peer.close()
    # A cut inside the first message sends that read's frames through the session; a cut
    # later leaves the head to the native reader.
    assert native_cuts > len(data) // 2 and python_cuts > len(data) // 2


def test_a_read_while_items_wait_goes_through_the_session_so_frames_keep_their_order():
    region = Region()
    region.bind("a", 0)
    peer = Peer(region)
    try:
        peer.send(frame(output([("a", [1], "")])), drain=False)
        peer.send(frame(output([("a", [2], "")])), drain=False)
        items = peer.drain()
        assert [type(i) for i in items] == [Applied, bytes]  # the second read waited its turn
        assert peer.counts() == (1, 1)
        assert region.streams() == {0: ([1, 2], 0)}
    finally:
        peer.close()


def test_a_flood_of_tiny_messages_is_applied_a_bounded_number_a_read():
    region = Region()
    peer = Peer(region)
    try:
        peer.send(frame(b"") * (outputs._APPLY * 3), drain=False)
        items = peer.drain()
        applied = [i for i in items if isinstance(i, Applied)]
        assert applied and all(len(a.outcomes) <= outputs._APPLY for a in applied)
        assert all(isinstance(r, WireDecodeError) for a in applied for r, _ in a.outcomes)
        assert sum(peer.counts()) == outputs._APPLY * 3  # none lost, none twice
        assert peer.port.connections  # a junk message is dropped, not the connection
    finally:
        peer.close()


def test_nothing_after_engine_core_dead_is_applied_by_the_port():
    region = Region()
    region.bind("a", 0)
    peer = Peer(region)
    try:
        dead = frame(b"ENGINE_CORE_DEAD")
        peer.send(
            frame(output([("a", [1], "")])) + dead + frame(output([("a", [2], "")])), drain=False
        )
        items = peer.port.take(), peer.port.take(), peer.port.take()
        assert [type(i) for i in items] == [Applied, bytes, type(None)]  # the last: the loop's
        assert [r is None for r, _ in items[0].outcomes] == [False, True]
        assert region.streams() == {0: ([1], 0)}  # and the loop drops what follows the death
    finally:
        peer.close()
