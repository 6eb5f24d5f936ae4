"""``tsfront serve`` as a real process group for the serve tests: the library's rig.

`ServeProcess` and `serve_children` are `tsfront.testing.serve`'s (the pytest plugin's
``tsfront_serve`` fixture is built on them): the command in its own session, its stdout lines
waited for with a deadline, SIGTERM then SIGKILL of whatever is left of the session.

`post_stream` and `read_chunked` are a raw HTTP/1.1 client for the tests that need what a
library client hides: a small receive window (a slow reader), a client that stops reading.
"""

from __future__ import annotations

import json
import socket
import time

from tsfront.testing.serve import ServeProcess, serve_children, start_served

__all__ = [
    "ServeProcess",
    "dechunk",
    "post_stream",
    "read_chunked",
    "serve_children",
    "start_served",
]


def post_stream(url: str, body: dict, *, rcvbuf: int, timeout: float) -> socket.socket:
    """A connection whose receive buffer is ``rcvbuf`` bytes, with ``POST /v1/completions``
    of ``body`` sent on it (the response is left unread)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


def read_chunked(sock: socket.socket, *, read: int, within: float) -> tuple[bytes, bytes]:
    """Read ``read`` bytes at a time until the chunked body's end, then close the socket:
    ``(head, body)`` with the body de-chunked. Fails if it has not ended ``within`` seconds."""
    data = bytearray()
    deadline = time.monotonic() + within
    while not data.endswith(b"0\r\n\r\n"):
        assert time.monotonic() < deadline, "the response never ended"
        chunk = sock.recv(read)
        assert chunk, "the server closed the connection early"
        data += chunk
    sock.close()
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    return head, dechunk(rest)


def dechunk(raw: bytes) -> bytes:
    """An HTTP/1.1 chunked body's data (up to its last chunk)."""
    out = bytearray()
    while raw:
        size, _, raw = raw.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += raw[:n]
        raw = raw[n + 2 :]
    return bytes(out)
