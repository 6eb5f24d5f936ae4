"""`tsfront.serve.edge.transport.ConnectionTransport`: every call is the wrapped transport's, and
exactly the ones that may change what the drain's native pass checks (a write, an end, a
close, an abort, another protocol) clear the connection's clean flag; the socket's descriptor
is found once per connection and forgotten when it is lost."""

from __future__ import annotations

import socket
import types
from typing import Any

import pytest

from tsfront import _native
from tsfront.serve.edge.transport import ConnectionTransport


class _Inner:
    """Records each call and its arguments; returns a marker per method."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.custom = "forwarded"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def method(*args: Any) -> Any:
            self.calls.append((name, args))
            return f"{name}-result"

        return method


CLEARING = [
    ("write", (b"x",)),
    ("writelines", ([b"x", b"y"],)),
    ("write_eof", ()),
    ("close", ()),
    ("abort", ()),
    ("set_protocol", ("proto",)),
]
KEEPING = [
    ("is_closing", ()),
    ("get_write_buffer_size", ()),
    ("get_extra_info", ("socket", None)),
    ("pause_reading", ()),
    ("resume_reading", ()),
    ("is_reading", ()),
    ("can_write_eof", ()),
    ("get_protocol", ()),
    ("set_write_buffer_limits", (1024, 256)),  # not spelled out: through __getattr__
]


def test_it_is_the_native_base_and_starts_unclean() -> None:
    conn = ConnectionTransport(_Inner())  # type: ignore[arg-type]
    assert isinstance(conn, _native.ConnectionBase)
    assert conn._clean is False and conn.clean_sends == 0
    with pytest.raises(AttributeError):
        conn.clean_sends = 1  # type: ignore[misc]  # the native pass's count


@pytest.mark.parametrize(("name", "args"), CLEARING + KEEPING)
def test_every_call_is_the_inner_transports(name: str, args: tuple[Any, ...]) -> None:
    inner = _Inner()
    conn = ConnectionTransport(inner)  # type: ignore[arg-type]
    result = getattr(conn, name)(*args)
    assert inner.calls == [(name, args)]
    if name in ("is_closing", "get_write_buffer_size", "get_extra_info", "is_reading"):
        assert result == f"{name}-result"
    assert conn.inner is inner and conn.custom == "forwarded"


@pytest.mark.parametrize(("name", "args"), CLEARING)
def test_writes_ends_and_other_protocols_clear_the_flag(name: str, args: tuple[Any, ...]) -> None:
    conn = ConnectionTransport(_Inner())  # type: ignore[arg-type]
    conn._clean = True  # as the native pass sets it
    getattr(conn, name)(*args)
    assert conn._clean is False


@pytest.mark.parametrize(("name", "args"), KEEPING)
def test_reads_of_its_state_keep_the_flag(name: str, args: tuple[Any, ...]) -> None:
    conn = ConnectionTransport(_Inner())  # type: ignore[arg-type]
    conn._clean = True
    getattr(conn, name)(*args)
    assert conn._clean is True
    conn.unclean()
    assert conn._clean is False


def test_a_write_that_raises_still_clears_the_flag() -> None:
    class _Broken(_Inner):
        def write(self, data: bytes) -> None:
            raise ConnectionResetError("gone")

    conn = ConnectionTransport(_Broken())  # type: ignore[arg-type]
    conn._clean = True
    with pytest.raises(ConnectionResetError):
        conn.write(b"x")
    assert conn._clean is False


def test_an_instance_without_its_transport_raises_instead_of_recursing() -> None:
    conn = ConnectionTransport.__new__(ConnectionTransport)  # as copy/pickle would make it
    with pytest.raises(AttributeError):
        conn.write_buffer_limits  # noqa: B018  # an unknown name, forwarded to nothing


class _Plain(_Inner):
    """A plain transport over ``sock``: no TLS, nothing buffered."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        self.calls.append(("get_extra_info", (name,)))
        return self.sock if name == "socket" else default

    def get_write_buffer_size(self) -> int:
        return 0


def test_the_descriptor_is_found_once_per_connection_and_forgotten_when_lost() -> None:
    from tsfront.serve.core.push import direct_target

    with socket.socket() as sock:
        inner = _Plain(sock)
        conn = ConnectionTransport(inner)  # type: ignore[arg-type]
        assert conn.direct() == (conn, sock.fileno())
        asked = len(inner.calls)
        # Again, and through a writer standing in front of it (tsfront serve's head writer):
        # the same answer, the transport not asked again.
        assert conn.direct() == (conn, sock.fileno())
        assert direct_target(types.SimpleNamespace(connection_transport=conn)) == (
            conn,
            sock.fileno(),
        )
        assert direct_target(conn) == (conn, sock.fileno())
        assert len(inner.calls) == asked
        conn._clean = True
        conn.lost()  # the protocol's connection_lost: the descriptor may be another's soon
        assert conn.direct() == (None, -1) and conn._clean is False


def test_a_connection_without_a_stream_socket_has_no_descriptor() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        inner = _Plain(sock)
        conn = ConnectionTransport(inner)  # type: ignore[arg-type]
        assert conn.direct() == (None, -1)
        asked = len(inner.calls)
        assert conn.direct() == (None, -1) and len(inner.calls) == asked
