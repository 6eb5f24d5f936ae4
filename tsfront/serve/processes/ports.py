"""The server's listening sockets: claimed by the master, one per worker place, kept by it.

``tsfront serve``'s master claims each TCP port it serves (the API port, ``--metrics-port``)
before it starts anything (`claim_port`):

1. Under a short lock shared by every tsfront server of the host (an abstract unix socket
   named after the port: no file, released by the kernel when the process dies), so that two
   servers starting at once cannot both pass step 2;
2. it checks the port with a bind WITHOUT ``SO_REUSEPORT`` (``SO_REUSEADDR`` only, so that a
   previous server's connections in TIME_WAIT do not count): that bind fails while any
   socket listens on the port, whoever owns it, including another tsfront server's workers.
   A port in use is `PortInUse`, one line naming the address;
3. it binds and listens ``count`` sockets with ``SO_REUSEPORT``, one per worker place, which
   it hands to the workers (a spawned process gets a socket as an argument) and keeps for the
   replacements: a worker that dies is replaced on the very socket it served, so the
   connections the kernel queued on it meanwhile are answered by its successor, not reset.

One socket per worker, not one shared by all, keeps the kernel's SO_REUSEPORT balancing:
each connection is hashed to one socket, so keep-alive clients spread over the workers
instead of piling onto whichever worker's loop woke first on a shared accept queue
(docs/SERVE.md, *Ports*, has the measurement). Linux lets any socket of the same user with
``SO_REUSEPORT`` join such a group; tsfront servers never do (step 2 refuses them), and a
program of the same user that binds with ``SO_REUSEPORT`` without checking is not excluded.
"""

from __future__ import annotations

import errno
import socket
import time

from tsfront.errors import Error

__all__ = ["BACKLOG", "PortInUse", "claim_port"]

#: The listen backlog of each worker's socket (connections accepted by the kernel, not yet by
#: the worker; they wait there while a worker starts or is replaced).
BACKLOG = 2048
#: Seconds `claim_port` waits for another tsfront server's claim of the same port to end.
CLAIM_WAIT_S = 5.0
_CLAIM_POLL_S = 0.01


class PortInUse(Error):
    """The port is held by another program (or another tsfront server)."""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _claim_lock(port: int, deadline: float) -> socket.socket:
    """The host-wide lock on claiming ``port`` (an abstract unix socket name)."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    name = f"\0tsfront-serve-port-{port}"
    while True:
        try:
            lock.bind(name)
            return lock
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                lock.close()
                raise PortInUse(
                    f"port {port}: another tsfront server is claiming it right now"
                ) from None
        time.sleep(_CLAIM_POLL_S)  # a claim takes microseconds; this waits for its end


def _check_free(host: str, port: int) -> int:
    """Bind ``host:port`` without SO_REUSEPORT (fails while anything listens there); the
    port bound (``port`` 0 resolved)."""
    probe = socket.socket(_family(host), socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        bound: int = probe.getsockname()[1]
        return bound
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"{_where(host, port)} is already in use by another program (or another "
                "tsfront serve); stop it or choose another port"
            ) from None
        raise PortInUse(f"{_where(host, port)}: cannot bind: {exc.strerror or exc}") from None
    finally:
        probe.close()


def _listener(host: str, port: int) -> socket.socket:
    sock = socket.socket(_family(host), socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def claim_port(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host:port`` (0: a free port), one SO_REUSEPORT group
    of this process alone; raises `PortInUse` if anything listens there already."""
    if port == 0:
        port = _check_free(host, 0)  # a free port now; claimed (and checked again) below
    lock = _claim_lock(port, time.monotonic() + CLAIM_WAIT_S)
    sockets: list[socket.socket] = []
    try:
        _check_free(host, port)
        for _ in range(count):
            try:
                sockets.append(_listener(host, port))
            except OSError as exc:
                raise PortInUse(
                    f"{_where(host, port)}: cannot listen: {exc.strerror or exc}"
                ) from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    finally:
        lock.close()
    return sockets
