"""``tsfront serve`` as a real process group for the serve tests: the library's rig.

`ServeProcess` and `serve_children` are `tsfront.testing.serve`'s (the pytest plugin's
``tsfront_serve`` fixture is built on them): the command in its own session, its stdout lines
waited for with a deadline, SIGTERM then SIGKILL of whatever is left of the session.

`session_shm` and `shm_left` tell the server's own /dev/shm entries from the machine's: other
processes (other test runs, other servers) make and remove entries there all the time.

`post_stream` and `read_chunked` are a raw HTTP/1.1 client for the tests that need what a
library client hides: a small receive window (a slow reader), a client that stops reading.

`Front` is any HTTP server in front of simulated ranks (``tsfront serve``, or another server
hosting tsfront's app): what reached the ranks, what ``/health`` says is in flight, waits with
a deadline, and the clients that leave (mid-stream, before the first token, many at once).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable

import httpx

from tsfront.sim import SimGroup
from tsfront.testing.serve import ServeProcess, serve_children, session_pids, start_served

__all__ = [
    "Front",
    "ServeProcess",
    "dechunk",
    "post_stream",
    "read_chunked",
    "serve_children",
    "session_shm",
    "shm_left",
    "start_served",
]


def session_shm(session: int) -> set[int]:
    """Inodes of the /dev/shm files the live processes of ``session`` have mapped.

    By inode, not by name: a mapping shows the name the file had when it was mapped (glibc's
    ``sem_open`` maps a temporary ``sem.XXXXXX`` and then links it as ``sem.mp-...``)."""
    inodes = set()
    for pid in session_pids(session):
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.readlines()
        except OSError:
            continue  # exited meanwhile
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                inodes.add(int(fields[4]))
    return inodes


def shm_left(inodes: set[int]) -> set[str]:
    """The /dev/shm entries that are still there among the files ``inodes`` name."""
    with os.scandir("/dev/shm") as entries:
        return {e.name for e in entries if e.inode() in inodes}


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


class Front:
    """An HTTP server at ``url`` in front of the simulated ranks ``group`` (two, in-process),
    whose every output token ``p`` is ``first + p`` (the word-level test model reads it
    ``w<first + p>``)."""

    def __init__(self, url: str, group: SimGroup, *, first: int, deadline: float) -> None:
        self.url = url
        self.group = group
        self.first = first
        self.deadline = deadline

    def aborts(self) -> int:
        return sum(c["aborts"] for c in self.group.counters().values())

    def adds(self) -> int:
        return sum(c["adds"] for c in self.group.counters().values())

    def in_flight(self) -> int:
        body = httpx.get(f"{self.url}/health", timeout=5).json()
        return sum(e["in_flight"] for e in body["engines"])

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.01)

    def leave_mid_stream(self) -> None:
        """A streamed completion whose client closes its connection after the first event:
        its ABORT reaches an engine and nothing stays in flight."""
        before = self.aborts()
        with httpx.stream(
            "POST",
            f"{self.url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 3000, "stream": True},
            timeout=self.deadline,
        ) as response:
            assert response.status_code == 200
            first = next(line for line in response.iter_lines() if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["text"].startswith(f" w{self.first}")
        # The connection is closed here, mid-stream.
        self.wait("the disconnect's ABORT at the engine", lambda: self.aborts() > before)
        self.wait("no request in flight", lambda: self.in_flight() == 0)

    def leave_before_first_token(self) -> None:
        """With the ranks frozen, a streamed completion whose client closes its connection
        while the request waits for its first output (nothing is being sent that could fail:
        only the server's word of the lost connection can end it): it leaves the in-flight
        count at once, and its ABORT reaches an engine once the ranks step again."""
        before = self.aborts()
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"prompt": "w5", "max_tokens": 50, "stream": True}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        engines = [self.group.engine(r) for r in range(2)]
        for engine in engines:
            engine.stall()
        try:
            sock = socket.create_connection((host, int(port)), timeout=self.deadline)
            sock.sendall(head + body)
            self.wait("the request in flight", lambda: self.in_flight() == 1)
            sock.close()
            self.wait("the disconnect to free it, the ranks frozen", lambda: self.in_flight() == 0)
        finally:
            for engine in engines:
                engine.resume()
        self.wait("the disconnect's ABORT at the engine", lambda: self.aborts() > before)

    def leave_together(self, n: int) -> None:
        """``n`` streamed completions, each on its own connection, all past their first event,
        whose clients then close their connections at once: every one's ABORT reaches an
        engine, nothing stays in flight, and the server answers the next request."""
        before = self.aborts()
        body = {"prompt": "w5", "max_tokens": 3000, "stream": True}
        socks = [
            post_stream(self.url, body, rcvbuf=1 << 16, timeout=self.deadline) for _ in range(n)
        ]
        try:
            for sock in socks:
                seen = b""
                while b"data: " not in seen:
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed a stream before its first event"
                    seen += chunk
            self.wait(f"{n} requests in flight", lambda: self.in_flight() >= n)
        finally:
            for sock in socks:
                sock.close()
        self.wait(f"{n} ABORTs at the engines", lambda: self.aborts() >= before + n)
        self.wait("no request in flight", lambda: self.in_flight() == 0)
        answer = httpx.post(
            f"{self.url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 2},
            timeout=self.deadline,
        )
        assert answer.status_code == 200, answer.text
