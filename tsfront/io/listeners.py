"""The listening sockets of the I/O process's own ports (`tsfront.io.outputs`,
`tsfront.io.inputs`): bind one at an address as libzmq would, and accept what waits on it."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Callable, Iterator

from tsfront.errors import ConfigError
from tsfront.wire.addresses import split_tcp

__all__ = ["MAX_CONNECTIONS", "Warn", "accepted", "bind_listener", "log_warning"]

log = logging.getLogger("tsfront.io")

#: Connections a port holds at once (an engine needs one; a restart briefly two).
MAX_CONNECTIONS = 64
_WILDCARDS = {"*", "0.0.0.0"}

Warn = Callable[..., None]
"""``warn(kind, message, *args)``: a problem of a kind, logged (the loop's is rate-limited)."""


def log_warning(kind: str, message: str, *args: object) -> None:
    """A port's `Warn` when its owner gives none: the log, not rate-limited."""
    log.warning(message, *args)


def bind_listener(address: str) -> tuple[socket.socket, str]:
    """A non-blocking listening socket at ``address`` (``tcp://HOST:PORT``, port 0 or ``*``
    for any; ``ipc://PATH``, ``@NAME`` for Linux's abstract namespace) and the address bound,
    in libzmq's ``LAST_ENDPOINT`` form. An ipc path left by an earlier process is replaced, as
    libzmq's bind does (and `OutputPort.close` removes its own)."""
    try:
        if address.startswith("ipc://"):
            path = address[len("ipc://") :]
            if path == "*":
                raise ConfigError(f"cannot bind {address!r}: give the ipc path of the output")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if path.startswith("@"):
                sock.bind("\0" + path[1:])
            else:
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
                sock.bind(path)
            bound = address
        else:
            host, port = split_tcp(address)
            name = "0.0.0.0" if host in _WILDCARDS else host.strip("[]")
            family, kind, proto, _, where = socket.getaddrinfo(
                name,
                0 if port == "*" else int(port),
                type=socket.SOCK_STREAM,
                flags=socket.AI_PASSIVE,
            )[0]
            sock = socket.socket(family, kind, proto)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
            real = sock.getsockname()
            shown = f"[{real[0]}]" if family == socket.AF_INET6 else real[0]
            bound = f"tcp://{shown}:{real[1]}"
        sock.listen(64)
        sock.setblocking(False)
        return sock, bound
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot bind {address!r}: {exc}") from None


def accepted(
    listener: socket.socket,
    warn: Warn,
    what: str,
    address: str,
    room: Callable[[], bool],
    held: str,
) -> Iterator[socket.socket]:
    """Every connection waiting on the non-blocking ``listener``, non-blocking, until none is
    left or the accept fails (EMFILE and the like, logged as ``{what}-accept``: the peer waits
    in the backlog). One that finds no ``room()`` (the port made none) is closed at once and
    logged as ``{what}-full``, its port's connections all ``held``."""
    while True:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            warn(f"{what}-accept", "%s %s: accept failed: %s", what, address, exc)
            return
        if not room():
            sock.close()
            warn(
                f"{what}-full",
                "%s %s: every connection %s: a new one was closed",
                what,
                address,
                held,
            )
            continue
        sock.setblocking(False)
        yield sock
