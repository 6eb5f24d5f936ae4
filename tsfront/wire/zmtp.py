"""ZMTP 3.x, the accepting side of a PULL or a ROUTER: bytes in, messages and replies out, no
sockets.

An engine's output PUSH and its input DEALER dial the I/O process; `tsfront.io.outputs` and
`tsfront.io.inputs` accept the connections and feed what they read to one session each
(`PullSession`, `RouterSession`), which says what to send back (``out``), which messages
arrived (``messages``: the first frame of each for a PULL, every frame for a ROUTER) and
whether the peer broke the protocol (``error``). The subset is what a libzmq PUSH or DEALER
speaks (RFC 23 ZMTP 3.0, RFC 37 ZMTP 3.1): the 64-byte greeting, the NULL mechanism's READY
command both ways (a DEALER's ``Identity`` property read), message frames (short and long,
MORE), and the 3.1 heartbeat commands (a PING is answered with a PONG that echoes its context;
`Session.ping` sends one). A peer that is not a ZMTP 3 peer of the expected socket type with
the NULL mechanism, sends a frame with reserved flag bits, a malformed command, or a message
larger than ``max_message`` gets ``error`` set and nothing more is read from it. A ROUTER
session also writes messages (`RouterSession.send`): the frames framed into ``out``.

The phases are a table (`_NEEDS`, `_STEPS`): each phase names how many bytes it must see and
the step that consumes them and says which phase comes next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import Enum

__all__ = ["GREETING", "PullSession", "RouterSession", "Session", "command", "greeting"]

_SIGNATURE = 10
_GREETING = 64
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04
_RESERVED = 0xFF & ~(_MORE | _LONG | _COMMAND)
_MAX_COMMAND = 1 << 16
# Unsent bytes past which a PING goes unanswered: whatever is still queued is traffic to the
# peer, and a peer that pings without reading cannot grow what we hold.
_MAX_UNSENT_PONGS = 1 << 16


def greeting(major: int = 3, minor: int = 1, mechanism: bytes = b"NULL") -> bytes:
    """A ZMTP 3 greeting: signature, version, mechanism, as-server 0, filler."""
    return (
        b"\xff" + bytes(8) + b"\x7f" + bytes([major, minor]) + mechanism.ljust(20, b"\x00")
    ) + bytes(32)


GREETING = greeting()
"""Ours: ZMTP 3.1, NULL."""


def frame(body: bytes, flags: int = 0) -> bytes:
    """One ZMTP frame (the long form past 255 bytes)."""
    n = len(body)
    if n > 255:
        return bytes([flags | _LONG]) + n.to_bytes(8, "big") + body
    return bytes([flags, n]) + body


def command(name: bytes, data: bytes = b"") -> bytes:
    """One command frame."""
    return frame(bytes([len(name)]) + name + data, _COMMAND)


def _property(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value


READY = command(b"READY", _property(b"Socket-Type", b"PULL"))
"""The NULL mechanism's READY of a PULL."""
ROUTER_READY = command(b"READY", _property(b"Socket-Type", b"ROUTER"))
"""The NULL mechanism's READY of a ROUTER (a ROUTER sends no identity of its own)."""


class Phase(Enum):
    """Where the session is; see `_NEEDS` and `_STEPS`."""

    SIGNATURE = "signature"  # the first 10 bytes: is this ZMTP at all
    GREETING = "greeting"  # the rest of the 64: version and mechanism
    READY = "ready"  # the peer's READY command
    TRAFFIC = "traffic"  # messages and heartbeat commands
    CLOSED = "closed"  # the peer broke the protocol: nothing more is read


class Session:
    """One accepted connection's protocol state (see the module's doc); the socket types are
    its subclasses'.

    ``out`` holds the bytes to send (our greeting from the start); the caller sends them and
    deletes what was sent. ``messages`` holds every complete message, in order (what of it:
    `_message`). ``ready`` turns true once the handshake is done, ``error`` says why the peer
    was refused. ``heartbeats`` is false for a ZMTP 3.0 peer, which has no PING."""

    #: Our READY command, and the socket types a peer may be.
    our_ready = READY
    peers: frozenset[bytes] = frozenset()
    #: Whole one-frame messages sliced straight out of what was read (`_whole_messages`).
    fast = False

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.phase = Phase.SIGNATURE
        self.out = bytearray(GREETING)
        self.messages: deque = deque()
        self.error: str | None = None
        self.ready = False
        self.heartbeats = True
        self.peer_properties: dict[bytes, bytes] = {}
        self._buf = bytearray()
        self._parts: list[bytes] = []  # the frames so far of a message with MORE
        self._size = 0  # their bytes

    def feed(self, data: bytes | memoryview) -> None:
        """Take bytes the peer sent; act on every complete unit of them. Nothing of ``data``
        is kept by reference: the caller may reuse its buffer."""
        if self.error is not None:
            return
        buf = self._buf
        if self.fast and not buf and self.phase is Phase.TRAFFIC and not self._parts:
            # The serving case: whole single-frame messages, read straight out of ``data``
            # (one copy a message); anything else goes the general way below.
            pos = self._whole_messages(data)
            if pos == len(data):
                return
            data = data[pos:]
        buf += data
        pos = 0
        while self.error is None:
            need = _NEEDS[self.phase](self, buf, pos)
            if need is None or len(buf) < need or self.error is not None:
                break
            pos = _STEPS[self.phase](self, buf, pos)
        if pos:
            del buf[:pos]

    def ping(self, ttl_s: float) -> None:
        """Queue a PING asking the peer to drop us after ``ttl_s`` seconds without traffic."""
        if self.ready and self.heartbeats:
            # In tenths of a second, two bytes: anything longer (or not a number) is the most.
            ttl = max(0, int(ttl_s * 10)) if ttl_s < 6553.5 else 0xFFFF
            self.out += command(b"PING", ttl.to_bytes(2, "big"))

    def _whole_messages(self, data: bytes | memoryview) -> int:
        """Take the complete one-frame messages at the start of ``data``; where they end."""
        n, pos, limit = len(data), 0, self.max_message
        append = self.messages.append
        while n - pos >= 2:
            flags = data[pos]
            if flags == 0:
                start = pos + 2
                size = data[pos + 1]
            elif flags == _LONG and n - pos >= 9:
                start = pos + 9
                size = int.from_bytes(data[pos + 1 : start], "big")
            else:
                break  # a command, a frame with MORE, a bad flag, a cut header: the table's
            end = start + size
            if end > n or size > limit:
                break  # not all here yet, or too large: the table's
            append(bytes(data[start:end]))  # a copy out of a memoryview; a bytes slice as it is
            pos = end
        return pos

    # ------------------------------------------------------------------ steps

    def _fail(self, why: str) -> int:
        self.error = why
        self.phase = Phase.CLOSED
        return len(self._buf)

    def _signature(self, buf: bytearray, pos: int) -> int:
        if buf[pos] != 0xFF or not buf[pos + 9] & 1:
            return self._fail("not a ZMTP 3 peer (its first bytes are not a ZMTP signature)")
        self.phase = Phase.GREETING
        return pos  # the greeting step reads the whole 64 bytes

    def _greeting(self, buf: bytearray, pos: int) -> int:
        major, minor = buf[pos + 10], buf[pos + 11]
        if major < 3:
            return self._fail(f"ZMTP {major}.{minor} peer: ZMTP 3 is required")
        mechanism = bytes(buf[pos + 12 : pos + 32]).rstrip(b"\x00")
        if mechanism != b"NULL":
            return self._fail(f"security mechanism {mechanism!r}: only NULL is spoken here")
        self.heartbeats = (major, minor) >= (3, 1)
        self.out += self.our_ready
        self.phase = Phase.READY
        return pos + _GREETING

    def _ready(self, buf: bytearray, pos: int) -> int:
        flags, start, end = _frame_at(buf, pos)
        if not flags & _COMMAND:
            return self._fail("a message before the READY command")
        name, data = _split_command(buf, start, end)
        if name is None:
            return self._fail("malformed command frame")
        if name == b"ERROR":
            return self._fail(f"the peer refused the handshake: {_reason(data)}")
        if name != b"READY":
            return self._fail(f"expected READY, got the command {name!r}")
        props = _properties(data)
        if props is None:
            return self._fail("malformed READY properties")
        kind = props.get(b"Socket-Type")
        if kind not in self.peers:
            allowed = " or ".join(sorted(p.decode() for p in self.peers))
            return self._fail(f"socket type {kind!r}: only a {allowed} may connect here")
        why = self._handshake(props)
        if why is not None:
            return self._fail(why)
        self.peer_properties = props
        self.ready = True
        self.phase = Phase.TRAFFIC
        return end

    def _traffic(self, buf: bytearray, pos: int) -> int:
        flags, start, end = _frame_at(buf, pos)
        if flags & _COMMAND:
            name, data = _split_command(buf, start, end)
            if name is None or data is None:
                return self._fail("malformed command frame")
            if name == b"PING":
                if not 2 <= len(data) <= 18:
                    return self._fail("malformed PING")
                if len(self.out) < _MAX_UNSENT_PONGS:  # a peer that pings and never reads
                    self.out += command(b"PONG", data[2:])
            elif name == b"ERROR":
                return self._fail(f"the peer sent ERROR: {_reason(data)}")
            return end  # PONG, and commands of later versions, change nothing here
        self._parts.append(bytes(buf[start:end]))
        if flags & _MORE:
            self._size += end - start
            return end
        parts, self._parts, self._size = self._parts, [], 0
        self._message(parts)
        return end

    def _handshake(self, props: dict[bytes, bytes]) -> str | None:
        """The peer's READY, of an allowed socket type: why it is refused, or None."""
        return None

    def _message(self, parts: list[bytes]) -> None:
        """A complete message, its frames: what of it goes to ``messages``."""
        self.messages.append(parts)

    def _frame_need(self, buf: bytearray, pos: int) -> int | None:
        """Bytes needed for the whole frame at ``pos`` (None: not even its header yet)."""
        have = len(buf) - pos
        if have < 2:
            return None
        flags = buf[pos]
        if flags & _RESERVED:
            self._fail(f"a frame with reserved flag bits set (0x{flags:02x})")
            return 0
        if flags & _LONG:
            if have < 9:
                return None
            size, header = int.from_bytes(buf[pos + 1 : pos + 9], "big"), 9
        else:
            size, header = buf[pos + 1], 2
        # Commands are small (a READY's properties, a PING); a message's frames count together.
        limit = _MAX_COMMAND if flags & _COMMAND else self.max_message - self._size
        if size > limit:
            if flags & _COMMAND:
                self._fail(f"a command larger than {_MAX_COMMAND} bytes")
            else:
                self._fail(f"a message larger than {self.max_message} bytes")
            return 0
        return pos + header + size


class PullSession(Session):
    """The accepting side of a PULL: a PUSH's messages, the first frame of each (`bytes`)."""

    peers = frozenset({b"PUSH"})
    fast = True

    def _message(self, parts: list[bytes]) -> None:
        self.messages.append(parts[0])


class RouterSession(Session):
    """The accepting side of a ROUTER: a DEALER's messages (each a list of its frames), its
    ``identity`` (its READY's ``Identity`` property; empty if it gave none, and the port
    names it), and `send` to write a message to it."""

    our_ready = ROUTER_READY
    peers = frozenset({b"DEALER"})

    def __init__(self, max_message: int) -> None:
        super().__init__(max_message)
        self.identity = b""

    def _handshake(self, props: dict[bytes, bytes]) -> str | None:
        identity = props.get(b"Identity", b"")
        if len(identity) > 255:
            return "an identity longer than 255 bytes"
        self.identity = identity
        return None

    def send(self, first: bytes, last: bytes | memoryview) -> None:
        """Queue a two-frame message (a wire type and its payload) in ``out``."""
        out = self.out
        out += bytes((_MORE, len(first))) if len(first) < 256 else _header(len(first), _MORE)
        out += first
        out += _header(len(last), 0)
        out += last


def _header(size: int, flags: int) -> bytes:
    if size > 255:
        return bytes((flags | _LONG,)) + size.to_bytes(8, "big")
    return bytes((flags, size))


def _frame_at(buf: bytearray, pos: int) -> tuple[int, int, int]:
    """(flags, body start, body end) of the complete frame at ``pos``."""
    flags = buf[pos]
    if flags & _LONG:
        start = pos + 9
        return flags, start, start + int.from_bytes(buf[pos + 1 : start], "big")
    start = pos + 2
    return flags, start, start + buf[pos + 1]


def _split_command(buf: bytearray, start: int, end: int) -> tuple[bytes | None, bytes | None]:
    if end <= start or start + 1 + buf[start] > end:
        return None, None
    n = buf[start]
    return bytes(buf[start + 1 : start + 1 + n]), bytes(buf[start + 1 + n : end])


def _properties(data: bytes | None) -> dict[bytes, bytes] | None:
    if data is None:
        return None
    props: dict[bytes, bytes] = {}
    pos, end = 0, len(data)
    while pos < end:
        n = data[pos]
        value_at = pos + 1 + n + 4
        if value_at > end:
            return None
        size = int.from_bytes(data[pos + 1 + n : value_at], "big")
        if value_at + size > end:
            return None
        props[data[pos + 1 : pos + 1 + n]] = data[value_at : value_at + size]
        pos = value_at + size
    return props


def _reason(data: bytes | None) -> str:
    if not data:
        return "(no reason)"
    return data[1 : 1 + data[0]].decode("ascii", "replace")


def _needs_signature(s: Session, buf: bytearray, pos: int) -> int:
    return pos + _SIGNATURE


def _needs_greeting(s: Session, buf: bytearray, pos: int) -> int:
    return pos + _GREETING


_NEEDS: dict[Phase, Callable[[Session, bytearray, int], int | None]] = {
    Phase.SIGNATURE: _needs_signature,
    Phase.GREETING: _needs_greeting,
    Phase.READY: Session._frame_need,
    Phase.TRAFFIC: Session._frame_need,
}
_STEPS: dict[Phase, Callable[[Session, bytearray, int], int]] = {
    Phase.SIGNATURE: Session._signature,
    Phase.GREETING: Session._greeting,
    Phase.READY: Session._ready,
    Phase.TRAFFIC: Session._traffic,
}
