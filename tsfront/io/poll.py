"""The I/O loop's one wait: an epoll over every descriptor, libzmq sockets through their
``ZMQ_FD``.

`zmq.Poller` reads each of its ZMQ sockets' events before and after every wait (in libzmq a
``poll`` of the socket's mailbox and a ``getpid``, twice per socket per turn), so every turn
of the loop paid for every ZMQ socket, busy or not. Here a ZMQ socket costs nothing until its
``ZMQ_FD`` fires or the loop used it.

The rule that makes that correct (libzmq's, for ``ZMQ_FD``): the descriptor says only that the
socket's events *may* have changed, and any send or receive on the socket may consume that
signal without the loop seeing it. So a ZMQ socket is **due**, and its ``ZMQ_EVENTS`` read
before the next wait, when its descriptor fired, when it was just registered, and after the
loop used it (`touched`: every send, every drain, which may stop at its limit with messages
left). A due socket with a message waiting is returned without waiting. A socket that is not
due has been drained to ``EAGAIN`` since its last signal, and libzmq signals its descriptor
again when the next message arrives.

Masks are epoll's: `READ`, `WRITE` (and ``EPOLLERR`` / ``EPOLLHUP`` on a plain descriptor). A
ZMQ socket is returned with `READ` only: the loop never waits for one to be writable.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable
from typing import cast

import zmq
import zmq.backend

READ = select.EPOLLIN
WRITE = select.EPOLLOUT

# The backend's getter, no sugar on the loop's path; ZMQ_EVENTS is an int.
_events = cast(Callable[[zmq.Socket, int], int], zmq.backend.Socket.get)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

Key = int | zmq.Socket


class Poll:
    """One epoll: plain descriptors by number, ZMQ sockets by their ``ZMQ_FD``."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.masks: dict[int, int] = {}  # plain descriptor → what it is waited for
        self.zmq_of: dict[int, zmq.Socket] = {}  # ZMQ_FD → its socket
        self.due: dict[zmq.Socket, None] = {}  # ordered: the sockets to read events of

    # ------------------------------------------------------------------ registration

    def register(self, fd: int, mask: int = READ) -> None:
        """Wait for ``mask`` on the plain descriptor ``fd``."""
        self.epoll.register(fd, mask)
        self.masks[fd] = mask

    def modify(self, fd: int, mask: int) -> None:
        self.epoll.modify(fd, mask)
        self.masks[fd] = mask

    def want(self, fd: int, mask: int) -> None:
        """Wait for ``mask`` on ``fd`` from now on, registered or not yet."""
        if fd in self.masks:
            self.modify(fd, mask)
        else:
            self.register(fd, mask)

    def unregister(self, fd: int) -> None:
        """Stop waiting on ``fd`` (before it is closed: its number may come back)."""
        if self.masks.pop(fd, None) is None:
            return
        with contextlib.suppress(OSError):  # already closed: epoll forgot it then
            self.epoll.unregister(fd)

    def register_zmq(self, sock: zmq.Socket) -> None:
        """Wait for messages on the ZMQ socket ``sock`` (due at once)."""
        fd = cast(int, sock.get(zmq.FD))
        self.zmq_of[fd] = sock
        self.epoll.register(fd, READ)
        self.due[sock] = None

    def touched(self, sock: zmq.Socket) -> None:
        """The loop sent on ``sock`` or received from it: its events are read before the next
        wait (the operation may have taken the signal of a message that waits)."""
        self.due[sock] = None

    # ------------------------------------------------------------------ the wait

    def poll(self, timeout_ms: int) -> list[tuple[Key, int]]:
        """What is ready: ``(fd or ZMQ socket, mask)`` pairs, each key once. Waits up to
        ``timeout_ms`` (negative: no limit) unless a due ZMQ socket has a message. A ZMQ
        signal with no message in it (a peer's read freed a pipe, a connection came or went)
        does not end the wait, as in ``zmq_poll``: the loop's turn is not spent on it."""
        ready = self.due_ready()
        if ready:
            timeout_ms = 0
        wait = timeout_ms / 1000 if timeout_ms >= 0 else -1.0
        end = time.monotonic() + wait if wait > 0 else 0.0
        while True:
            events = self.epoll.poll(wait)
            self.resolve(events, ready)
            if ready or not events or wait == 0:
                return ready
            if wait > 0:
                wait = max(0.0, end - time.monotonic())

    def due_ready(self) -> list[tuple[Key, int]]:
        """The due ZMQ sockets with a message waiting (each no longer due): what the next wait
        must not block on. A loop that waits on `fileno` itself (the native turn) calls this
        first, and `resolve` on what its wait returned."""
        ready: list[tuple[Key, int]] = []
        due = self.due
        if due:
            for sock in due:
                if _events(sock, _EVENTS) & _POLLIN:
                    ready.append((sock, READ))
            due.clear()
        return ready

    def resolve(
        self, events: list[tuple[int, int]], ready: list[tuple[Key, int]]
    ) -> list[tuple[Key, int]]:
        """Add to ``ready`` what the epoll's ``events`` say is ready: a plain descriptor as it
        is, a ZMQ socket (by its ``ZMQ_FD``) only if a message waits on it."""
        zmq_of = self.zmq_of
        for fd, mask in events:
            owner = zmq_of.get(fd)
            if owner is None:
                ready.append((fd, mask))
            elif (owner, READ) not in ready and _events(owner, _EVENTS) & _POLLIN:
                ready.append((owner, READ))
        return ready

    def fileno(self) -> int:
        """The epoll's descriptor (the native turn waits on it)."""
        return self.epoll.fileno()

    def close(self) -> None:
        self.epoll.close()
        self.masks.clear()
        self.zmq_of.clear()
        self.due.clear()
