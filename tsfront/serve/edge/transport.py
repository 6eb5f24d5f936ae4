"""The transport `tsfront serve`'s HTTP protocol hands to uvicorn: the connection's own
transport, and the write state the drain's native pass reads.

`ConnectionTransport` stands in front of the event loop's transport of one connection
(`tsfront.serve.edge.protocol.EdgeProtocol.connection_made` wraps it before uvicorn sees it), so
every write, close and abort that uvicorn or the response's task makes on the connection
passes through it; each clears the connection's *clean* flag (``_clean``, a field of the
native base). The drain's native pass (native/push.c) sets the flag after it has sent a whole
event on the socket itself with every check passed (the transport held nothing and was not
closing, flow control not paused, the client there, the response streaming); while the flag
is set it sends the next events without making those checks again, which is most of the
native pass's cost a token above the send (docs/PERFORMANCE.md, "Owning the connection's
write state"). The protocol clears the flag in ``pause_writing`` and ``connection_lost`` too:
the event loop closes the socket only after ``connection_lost`` returns, so a set flag also
means the descriptor is still this connection's. Everything else is the wrapped transport's,
unchanged.

It also knows, once per connection, the descriptor the native pass may send on (`direct`):
the socket of a plain TCP connection, found on the first streamed response and forgotten when
the connection is lost (``lost``), so that a descriptor is handed out only while it is this
connection's. `socket_target` is the same question asked of any transport.

`FlowControl` is a connection's reading and writing pauses: the protocol pauses writing when
the transport's buffer is over its high-water mark, and a response's ``send`` (and the native
pass, by ``write_paused``) waits until it is resumed.

`LOST_HOOK` names the attribute of a request's uvicorn cycle through which the protocol tells
the app that the request's connection is lost (the protocol's doc has the rule).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from tsfront import _native

__all__ = ["LOST_HOOK", "ConnectionTransport", "FlowControl", "socket_target"]

#: The attribute of a request's cycle (`tsfront.serve.edge.protocol`) that holds what to call, once,
#: if the request's connection is lost while it runs: None, or a callable the app put there.
LOST_HOOK = "tsfront_on_lost"


class ConnectionTransport(_native.ConnectionBase):
    """One connection's transport (``inner``) with the clean flag of its writes (see the
    module's doc). ``clean_sends`` counts the events sent while it was set."""

    __slots__ = ("_fd", "_inner")

    def __init__(self, inner: asyncio.Transport) -> None:
        self._inner = inner
        self._clean = False
        self._fd: int | None = None  # the socket's descriptor (-1: none), once found

    @property
    def inner(self) -> asyncio.Transport:
        """The event loop's transport this one stands in front of."""
        return self._inner

    def unclean(self) -> None:
        """Something may have changed what the native pass checks: it checks again."""
        self._clean = False

    def lost(self) -> None:
        """The connection is lost (its socket is closed once the protocol's
        ``connection_lost`` returns): not clean, and no descriptor for a new response."""
        self._clean = False
        self._fd = -1

    def direct(self) -> tuple[ConnectionTransport | None, int]:
        """This connection's target for the drain's native pass, as `socket_target` finds it
        (``(self, descriptor)`` or ``(None, -1)``), the descriptor found once per connection."""
        fd = self._fd
        if fd is None:
            fd = self._fd = socket_target(self)[1]
        return (self, fd) if fd >= 0 else (None, -1)

    # Writes and ends: each clears the flag, then is the transport's.

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._clean = False
        self._inner.write(data)

    def writelines(self, data: Any) -> None:
        self._clean = False
        self._inner.writelines(data)

    def write_eof(self) -> None:
        self._clean = False
        self._inner.write_eof()

    def close(self) -> None:
        self._clean = False
        self._inner.close()

    def abort(self) -> None:
        self._clean = False
        self._inner.abort()

    # The rest, as the transport's: the ones uvicorn and the native pass call per request
    # spelled out (a method, not a lookup through __getattr__), anything else below.

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._clean = False  # another protocol (an upgrade) writes as it likes
        self._inner.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set (a copy made without __init__): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)


class FlowControl:
    """One connection's pauses (see the module's doc). ``write_paused`` is read by name by the
    native pass; a waiter future is made only while writing is paused."""

    __slots__ = ("_transport", "_writable", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None

    async def drain(self) -> None:
        """Wait until writing is resumed (at once if it is not paused)."""
        while self.write_paused:
            waiter = self._writable
            if waiter is None or waiter.done():
                waiter = self._writable = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def socket_target(transport: Any) -> tuple[Any, int]:
    """``transport`` and its socket's descriptor when it is a plain TCP transport (a send on
    that socket is what the transport's own write would first do); ``(None, -1)`` for
    anything else (TLS: the socket carries ciphertext; a transport with no socket or no buffer
    size to ask)."""
    info = getattr(transport, "get_extra_info", None)
    if info is None or not callable(getattr(transport, "get_write_buffer_size", None)):
        return None, -1
    if info("sslcontext") is not None or info("ssl_object") is not None:
        return None, -1
    sock = info("socket")
    try:
        fd = sock.fileno() if sock is not None and sock.type == socket.SOCK_STREAM else -1
    except (OSError, ValueError):
        fd = -1
    return (transport, fd) if fd >= 0 else (None, -1)
