"""Each engine group's input address, served on the I/O process's own thread (no libzmq).

The engines' input DEALERs (one per rank, each with its identity) dial the address they were
given in INIT; `InputPort` is the listening socket there and every connection accepted on it,
each speaking ZMTP 3 through one `tsfront.wire.zmtp.RouterSession`. It replaces a libzmq
ROUTER with ``ROUTER_MANDATORY``: an ADD then went through libzmq's pipe to its I/O thread,
which woke, wrote it to the kernel and armed and disarmed its poll for writing; here the loop
writes it itself, and every message a turn queued for one engine goes in one ``send`` at the
end of the turn (`flush`). (docs/PERFORMANCE.md, "I/O process: the engine input without
libzmq".) A routed connection's outgoing stream is a lane of `tsfront._native.InputLanes`
(native/lanes.c): the native turn (native/turn.c) queues the ADDs it places on the same lanes,
so what this port and the native turn write to an engine is one ordered stream.

What the ROUTER did is kept:

* **routing by identity**: a connection is known by its DEALER's ``Identity`` once its ZMTP
  handshake is done (one that gives none is named ``00`` + a number, as libzmq names it).
  `send` to an identity with no connection is `UNREACHABLE` (``ROUTER_MANDATORY``'s
  ``EHOSTUNREACH``); to one whose queue holds ``queue_depth`` messages the kernel has not
  taken, `FULL` (``SNDHWM``'s ``EAGAIN``): nothing of the message is queued then.
* **an identity in use**: a second connection with it waits, its messages held, and takes the
  identity over when the first one ends (libzmq's "anonymous pipe"); a restarted engine's
  new connection is not lost to its predecessor's that has not closed yet.
* what arrives (the registration, one message a rank) is one queue of messages for the loop
  (`take`), each ``[identity, *frames]``.
* ``LINGER``: `close` gives what is still queued up to ``linger`` seconds to go.

A peer that is not a ZMTP 3 DEALER is dropped at its first wrong byte; one that has not
finished its handshake within ``handshake_timeout`` is dropped; a port holds at most
``max_connections`` (64), and past that a new connection takes the place of the oldest one
in its handshake, else of the oldest waiting one, else is closed. Drops are logged through the
``warn`` the loop gives (rate-limited by kind). A connection that ended calls ``on_close`` with
its fd before it is closed (the loop takes it out of its poll then); ``on_write(fd, wanted)``
says when a connection has bytes the kernel would not take (the loop polls it for writing
until they are gone).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections import deque
from collections.abc import Callable

from tsfront import _native
from tsfront.io.core import FULL, SENT, UNREACHABLE
from tsfront.io.listeners import MAX_CONNECTIONS, Warn, accepted, bind_listener, log_warning
from tsfront.wire.zmtp import RouterSession

__all__ = ["InputPort"]
#: Bytes read from a connection per readiness (registrations are a few hundred bytes).
_READ = 1 << 16
#: Unread messages of one connection (a DEALER that talks past its registration) past which
#: it is dropped: an engine sends one.
_MAX_HELD = 1024
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_anonymous = itertools.count(1)
if (SENT, FULL, UNREACHABLE) != (
    _native.LANE_SENT,
    _native.LANE_FULL,
    _native.LANE_UNREACHABLE,
):  # pragma: no cover - a guard of an edit to either side
    raise ImportError("the lanes' send codes are no longer the core's")


class _Peer:
    __slots__ = ("deadline", "fd", "lane", "polled", "session", "sock", "waiting")

    def __init__(self, sock: socket.socket, max_message: int, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.session = RouterSession(max_message)
        self.deadline = deadline  # for its handshake
        self.waiting = False  # its identity is another connection's: held until that ends
        # Its lane once routed (-1 before: its handshake's bytes go from ``session.out``).
        self.lane = -1
        self.polled = False  # for writing: it holds bytes the kernel would not take


class InputPort:
    """One engine group's input address (see the module's doc)."""

    def __init__(
        self,
        address: str,
        max_message: int,
        queue_depth: int,
        handshake_timeout: float,
        *,
        max_connections: int = MAX_CONNECTIONS,
        warn: Warn = log_warning,
        on_close: Callable[[int], None] | None = None,
        on_write: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.listener, self.address = bind_listener(address)
        self.max_message = max_message
        self.queue_depth = queue_depth
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.warn = warn
        self.on_close = on_close
        self.on_write = on_write
        self.connections: dict[int, _Peer] = {}  # by fd, in accept order
        self.routes: dict[bytes, _Peer] = {}  # by identity: the connections `send` reaches
        self.items: deque[list[bytes]] = deque()
        # One lane a routed connection (never more than the connections held).
        self.lanes = _native.InputLanes(max_connections, queue_depth)
        self._free_lanes = list(range(max_connections - 1, -1, -1))
        self._by_lane: list[_Peer | None] = [None] * max_connections
        self._view = memoryview(bytearray(_READ))
        self.due = float("inf")  # the next handshake deadline (`tick`)

    # ------------------------------------------------------------------ the loop's calls

    def accept(self, now: float) -> list[int]:
        """Accept every waiting connection; their fds, for the poll."""
        fds: list[int] = []
        room, address = self._room, self.address
        for sock in accepted(self.listener, self.warn, "input", address, room, "routed"):
            if sock.family != socket.AF_UNIX:  # small messages go at once, as libzmq's do
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(sock, self.max_message, now + self.handshake_timeout)
            self.connections[peer.fd] = peer
            self.due = min(self.due, peer.deadline)
            if self._write(peer):  # our greeting
                fds.append(peer.fd)
        return fds

    def read(self, fd: int) -> bool:
        """Read what connection ``fd`` sent; False if that ended it."""
        peer = self.connections[fd]
        view = self._view
        try:
            n = peer.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            self._end(peer, f"read failed: {exc}")
            return False
        if not n:
            self._end(peer, None)
            return False
        session = peer.session
        was_ready = session.ready
        session.feed(view[:n])
        if session.error is not None:
            self._end(peer, session.error)
            return False
        if session.ready and not was_ready:
            self._route(peer)
        if session.messages and not peer.waiting:
            self._deliver(peer)
        elif len(session.messages) > _MAX_HELD:
            self._end(peer, f"more than {_MAX_HELD} messages held while its identity is in use")
            return False
        return self._write(peer)

    def writable(self, fd: int) -> None:
        """Connection ``fd`` can take bytes again."""
        peer = self.connections.get(fd)
        if peer is not None:
            self._write(peer)

    def take(self) -> list[bytes] | None:
        """The next message that arrived, ``[identity, *frames]``, or None."""
        items = self.items
        return items.popleft() if items else None

    def send(self, identity: bytes, kind: bytes, payload: bytes | memoryview) -> int:
        """Queue the message ``[kind, payload]`` to the connection of ``identity``: `SENT`,
        `FULL` or `UNREACHABLE` (nothing queued then). It goes at the next `flush`."""
        peer = self.routes.get(identity)
        if peer is None:
            return UNREACHABLE
        return self.lanes.send(peer.lane, kind, payload)

    def flush(self) -> None:
        """Offer every connection's queued bytes to the kernel (the end of a loop turn), and
        act on what changed since the last flush (the native turn's flushes too): a lane whose
        send failed ends its connection, one the kernel would not take all of is polled for
        writing."""
        if not self.lanes.dirty:
            return
        by_lane = self._by_lane
        for lane, failed, polled in self.lanes.flush():
            peer = by_lane[lane]
            if peer is not None:
                self._lane_state(peer, failed, polled)

    def tick(self, now: float) -> None:
        """Drop the connections whose handshake is past its deadline; `due` is the next."""
        due = float("inf")
        for peer in list(self.connections.values()):
            if peer.session.ready:
                continue
            if now >= peer.deadline:
                self._end(peer, f"no handshake in {self.handshake_timeout:.1f} s")
            else:
                due = min(due, peer.deadline)
        self.due = due

    def close(self, linger: float = 0.0) -> None:
        """Give queued messages up to ``linger`` seconds to go, then close every connection
        and the listener (no callbacks: the loop is going)."""
        end = time.monotonic() + linger
        for peer in self.connections.values():
            out = peer.session.out
            if peer.lane >= 0:
                out = bytearray(self.lanes.pending(peer.lane)) + out
            while out and peer.session.ready:
                left = end - time.monotonic()
                if left <= 0:
                    break
                try:
                    peer.sock.settimeout(left)
                    del out[: peer.sock.send(out, socket.MSG_NOSIGNAL)]
                except OSError:
                    break
            peer.sock.close()
        self.connections.clear()
        self.routes.clear()
        self.listener.close()

    # ------------------------------------------------------------------ inside

    def _route(self, peer: _Peer) -> None:
        """Its handshake is done: reachable by its identity, or waiting for it."""
        session = peer.session
        if not session.identity:
            session.identity = b"\x00" + next(_anonymous).to_bytes(4, "big")
        if session.identity in self.routes:
            peer.waiting = True
            self.warn(
                "input-identity",
                "input %s: a second connection with identity %s waits for the first to end",
                self.address,
                session.identity.hex(),
            )
        else:
            self.routes[session.identity] = peer
            self._open_lane(peer)

    def _open_lane(self, peer: _Peer) -> None:
        """The routed connection's writing goes to a lane from now on, behind what it held."""
        lane = self._free_lanes.pop()  # never empty: a lane per connection the port may hold
        peer.lane = lane
        self._by_lane[lane] = peer
        self.lanes.open(lane, peer.fd, peer.session.identity)
        out = peer.session.out
        if out:
            self.lanes.put(lane, out)
            out.clear()

    def _deliver(self, peer: _Peer) -> None:
        identity = peer.session.identity
        messages = peer.session.messages
        while messages:
            self.items.append([identity, *messages.popleft()])

    def _write(self, peer: _Peer) -> bool:
        """Send what the kernel takes of the peer's queued bytes; False if that ended it."""
        out = peer.session.out
        if peer.lane >= 0:
            if out:  # a PONG the session answered with: behind what the lane holds
                self.lanes.put(peer.lane, out)
                out.clear()
            failed, polled = self.lanes.write(peer.lane)
            return self._lane_state(peer, failed, polled)
        if not out:
            return True
        try:
            sent = peer.sock.send(out, _SEND_FLAGS)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._end(peer, f"write failed: {exc}")
            return False
        if sent:
            del out[:sent]
        self._polled(peer, bool(out))
        return True

    def _lane_state(self, peer: _Peer, failed: int, polled: bool) -> bool:
        """What a lane's write left: an error ends the connection (False); bytes the kernel
        did not take have it polled for writing."""
        if failed:
            self._end(peer, f"write failed: {os.strerror(failed)}")
            return False
        self._polled(peer, polled)
        return True

    def _polled(self, peer: _Peer, wanted: bool) -> None:
        if wanted is not peer.polled:
            peer.polled = wanted
            if self.on_write is not None:
                self.on_write(peer.fd, wanted)

    def _room(self) -> bool:
        """Whether a new connection may be held (an older one made room)."""
        return len(self.connections) < self.max_connections or self._make_room()

    def _make_room(self) -> bool:
        """End the oldest connection in its handshake, else the oldest waiting one (True),
        if there is one."""
        for why, pick in (
            ("in its handshake", lambda p: not p.session.ready),
            ("waiting for its identity", lambda p: p.waiting),
        ):
            for peer in self.connections.values():  # in accept order
                if pick(peer):
                    self._end(peer, f"the port is full: the oldest connection {why} made room")
                    return True
        return False

    def _end(self, peer: _Peer, why: str | None) -> None:
        del self.connections[peer.fd]
        if peer.lane >= 0:  # what it held is dropped with it, as libzmq drops a pipe's
            self.lanes.close(peer.lane)
            self._by_lane[peer.lane] = None
            self._free_lanes.append(peer.lane)
            peer.lane = -1
        identity = peer.session.identity
        if why is not None:
            self.warn("input-dropped", "input %s: dropped a connection: %s", self.address, why)
        if self.on_close is not None:
            self.on_close(peer.fd)
        peer.sock.close()
        if self.routes.get(identity) is peer:
            del self.routes[identity]
            for other in self.connections.values():  # the oldest waiting one takes it over
                if other.waiting and other.session.identity == identity:
                    other.waiting = False
                    self.routes[identity] = other
                    self._open_lane(other)
                    self._deliver(other)
                    break
