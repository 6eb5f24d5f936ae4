"""Each engine's output address, received on the I/O process's own thread (no libzmq).

An engine's output PUSH dials the address it was given in INIT; `OutputPort` is the listening
socket there and every connection accepted on it, each speaking ZMTP 3 through one
`tsfront.wire.zmtp.PullSession`. It replaces a libzmq PULL: a frame then crossed libzmq's I/O
thread (its wake-up, its read, a mailbox signal) before the loop's thread woke for it; here the
loop's own poll wakes on the connection and reads it, one wake-up a frame instead of two
(docs/PERFORMANCE.md, "I/O process: the engine output without libzmq").

What the port gives its loop, in arrival order, is one queue of items (`take`): a frame (the
first frame of a message, `bytes`), or a connection event ``(kind, conn)`` with ``kind``
``zmq.EVENT_ACCEPTED`` (the ZMTP handshake of a PUSH completed) or ``zmq.EVENT_DISCONNECTED``
(that connection ended: EOF, an error, a protocol breach, a missed heartbeat), ``conn`` a
number unique in the process (never a reused fd). A connection's frames come before its
DISCONNECTED. What the PULL did is kept: every connection is pinged every ``interval`` (with a
TTL of ``timeout``) and dropped after ``interval + timeout`` without a byte from it; a
connection that has not finished its handshake by then is dropped too; a peer that is not a
ZMTP 3 PUSH is dropped at its first wrong byte. A port holds at most ``max_connections``
(64): past that, a new connection takes the place of the oldest one still in its handshake,
or is closed at once if every one is a PUSH, so a flood of connections that say nothing can
neither take the process's fds nor keep the engine out. What is dropped is logged through
the ``warn`` the loop gives (rate-limited by kind).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
from collections import deque
from collections.abc import Callable

import zmq

from tsfront.io.listeners import MAX_CONNECTIONS, Warn, accepted, bind_listener, log_warning
from tsfront.wire.zmtp import PullSession

__all__ = ["MAX_OUTPUT_MESSAGE", "OutputPort"]

log = logging.getLogger("tsfront.io")

#: Largest message accepted from an engine's output (a frame of logprobs for a large batch is
#: a few MiB); a bigger one drops the connection, as a libzmq ``MAXMSGSIZE`` would.
MAX_OUTPUT_MESSAGE = 256 << 20
#: Bytes read from a connection per readiness, into the port's one buffer: ``recv(n)`` would
#: allocate ``n`` bytes each call, and at 256 KiB that allocation cost 15 µs a call here
#: (19 µs against 4 µs for a 6 KB message, PERFORMANCE.md).
_READ = 1 << 18
#: Unsent bytes (greeting, READY, PONGs, PINGs) a connection may hold before it is dropped: a
#: peer that reads nothing of what we send is not a working PUSH.
_MAX_UNSENT = 1 << 16
#: Items the loop has not taken yet past which no connection is read (the engine's PUSH and
#: the kernel's buffers hold the rest, as they did for the PULL's pipe).
_BACKLOG = 4096
_ACCEPTED, _DISCONNECTED = int(zmq.EVENT_ACCEPTED), int(zmq.EVENT_DISCONNECTED)
_numbers = itertools.count(1)


Item = bytes | tuple[int, int]


class _Connection:
    __slots__ = ("deadline", "next_ping", "number", "session", "sock")

    def __init__(self, sock: socket.socket, max_message: int, now: float, idle: float) -> None:
        self.sock = sock
        self.session = PullSession(max_message)
        self.number = next(_numbers)
        self.deadline = now + idle  # dropped if nothing arrives by then
        self.next_ping = now


class OutputPort:
    """One engine's output address (see the module's doc)."""

    def __init__(
        self,
        address: str,
        interval: float,
        timeout: float,
        max_message: int = MAX_OUTPUT_MESSAGE,
        *,
        max_connections: int = MAX_CONNECTIONS,
        warn: Warn = log_warning,
        on_close: Callable[[int], None] | None = None,
    ) -> None:
        self.listener, self.address = bind_listener(address)
        self.max_connections = max_connections
        self.warn = warn
        # Called with a connection's fd just before it is closed (whatever ends it): the
        # loop takes the fd out of its poll then, before an accept can be given the number.
        self.on_close = on_close
        path = address[len("ipc://") :] if address.startswith("ipc://") else ""
        # The socket file to remove at close, and its inode: a successor that bound the path
        # again (after our state directory's lock went) has its own, which is left alone.
        self._path = path if path and not path.startswith("@") else ""
        self._inode = os.stat(self._path).st_ino if self._path else 0
        self.interval = interval
        self.timeout = timeout
        self.max_message = max_message
        self.connections: dict[int, _Connection] = {}  # by fd
        self.items: deque[Item] = deque()
        self._view = memoryview(bytearray(_READ))  # what a read lands in (the session copies)
        # When `tick` is next needed: set by it, and made earlier by an accept (the handshake's
        # deadline) and by a handshake done (the first PING is due at once). The loop reads it
        # after each of those calls.
        self.due = float("inf")

    # ------------------------------------------------------------------ the loop's calls

    def accept(self, now: float) -> list[int]:
        """Accept every waiting connection; their fds, for the poll."""
        fds: list[int] = []
        room, address = self._room, self.address
        for sock in accepted(self.listener, self.warn, "output", address, room, "a PUSH"):
            conn = _Connection(sock, self.max_message, now, self.interval + self.timeout)
            self.connections[sock.fileno()] = conn
            self.due = min(self.due, conn.deadline)
            if self._flush(conn):  # our greeting
                fds.append(sock.fileno())
        return fds

    def read(self, fd: int, now: float) -> bool:
        """Read what connection ``fd`` sent; False if that ended it (``on_close`` was called
        with its fd before it was closed)."""
        conn = self.connections[fd]
        if len(self.items) >= _BACKLOG:  # the loop has not applied what it has: read later
            return True
        view = self._view
        try:
            n = conn.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            self._end(fd, conn, f"read failed: {exc}")
            return False
        if not n:
            self._end(fd, conn, None)
            return False
        session = conn.session
        was_ready = session.ready
        session.feed(view[:n])
        conn.deadline = now + self.interval + self.timeout
        if session.ready and not was_ready:
            self.items.append((_ACCEPTED, conn.number))
            self.due = now  # its first PING (next_ping is its accept time): the next tick
        messages = session.messages
        if messages:
            self.items.extend(messages)
            messages.clear()
        if session.error is not None:
            self._end(fd, conn, session.error)
            return False
        return self._flush(conn)

    def take(self) -> Item | None:
        """The next frame or connection event, or None."""
        items = self.items
        return items.popleft() if items else None

    def tick(self, now: float) -> None:
        """Heartbeats: ping who is due (and send what a full socket held back), drop who is
        silent (through ``on_close``); `due` is then when the next tick is needed."""
        due = float("inf")
        for fd, conn in list(self.connections.items()):
            if now >= conn.deadline:
                what = "heartbeat" if conn.session.ready else "handshake"
                self._end(fd, conn, f"no {what} for {self.interval + self.timeout:.1f} s")
                continue
            if conn.session.ready and now >= conn.next_ping:
                conn.next_ping = now + self.interval
                conn.session.ping(self.timeout)
            if not self._flush(conn):
                continue
            if conn.session.ready:
                due = min(due, conn.next_ping)
            due = min(due, conn.deadline)
        self.due = due

    def close(self) -> None:
        """Close every connection and the listener (no events: the loop is going)."""
        for conn in self.connections.values():
            conn.sock.close()
        self.connections.clear()
        self.listener.close()
        if self._path:
            with contextlib.suppress(OSError):
                if os.stat(self._path).st_ino == self._inode:
                    os.unlink(self._path)
            self._path = ""

    # ------------------------------------------------------------------ inside

    def _flush(self, conn: _Connection) -> bool:
        out = conn.session.out
        if not out:
            return True
        try:
            sent = conn.sock.send(out, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._end(conn.sock.fileno(), conn, f"write failed: {exc}")
            return False
        del out[:sent]
        if len(out) > _MAX_UNSENT:
            self._end(conn.sock.fileno(), conn, "it reads nothing we send")
            return False
        return True

    def _room(self) -> bool:
        """Whether a new connection may be held (the oldest in its handshake made room)."""
        return len(self.connections) < self.max_connections or self._make_room()

    def _make_room(self) -> bool:
        """End the oldest connection still in its handshake (True), if there is one."""
        for fd, conn in self.connections.items():  # in accept order
            if not conn.session.ready:
                self._end(fd, conn, "the port is full: the oldest handshake made room")
                return True
        return False

    def _end(self, fd: int, conn: _Connection, why: str | None) -> None:
        del self.connections[fd]
        if conn.session.ready:
            self.items.append((_DISCONNECTED, conn.number))
        if why is not None:
            self.warn("output-dropped", "output %s: dropped a connection: %s", self.address, why)
        if self.on_close is not None:
            self.on_close(fd)
        conn.sock.close()
