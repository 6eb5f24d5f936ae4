"""The transport `tsfront serve`'s HTTP protocol hands to uvicorn: the connection's own
transport, and the write state the drain's native pass reads.

`ConnectionTransport` stands in front of the event loop's transport of one connection
(`tsfront.serve.protocol.EdgeProtocol.connection_made` wraps it before uvicorn sees it), so
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
"""

from __future__ import annotations

import asyncio
from typing import Any

from tsfront import _native

__all__ = ["ConnectionTransport"]


class ConnectionTransport(_native.ConnectionBase):
    """One connection's transport (``inner``) with the clean flag of its writes (see the
    module's doc). ``clean_sends`` counts the events sent while it was set."""

    __slots__ = ("_inner",)

    def __init__(self, inner: asyncio.Transport) -> None:
        self._inner = inner
        self._clean = False

    @property
    def inner(self) -> asyncio.Transport:
        """The event loop's transport this one stands in front of."""
        return self._inner

    def unclean(self) -> None:
        """Something may have changed what the native pass checks: it checks again."""
        self._clean = False

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
