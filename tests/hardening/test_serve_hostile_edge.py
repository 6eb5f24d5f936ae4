"""Hostile clients at ``tsfront serve``'s HTTP edge (tsfront/serve/edge/protocol.py), with raw
sockets.

One server (one worker, two `SimGroup` ranks at 2 ms a step) with short deadlines
(``--timeout-header 1 --timeout-body 1``): idle and trickling clients are closed after the
header deadline, a body that stops coming gets a 408, huge headers a 431 in bounded CPU,
pipelined requests whose client leaves are aborted at the engine at once (streamed ones
without a traceback in the server's stderr). A second server starts with a low fd limit and
takes an idle-connection flood. Every wait has a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.serve_fixtures import ServeProcess

from tsfront.sim import SimGroup

FIRST = 100
DEADLINE = 15.0


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


class Edge:
    def __init__(self, server: ServeProcess, group: SimGroup, url: str, stderr: Path) -> None:
        self.server = server
        self.group = group
        self.url = url
        self.stderr = stderr
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.addr = (host, int(port))

    def aborts(self) -> int:
        return sum(c["aborts"] for c in self.group.counters().values())

    def in_flight(self) -> int:
        body = httpx.get(f"{self.url}/health", timeout=5).json()
        return sum(e["in_flight"] for e in body["engines"])

    def wait(self, what: str, predicate, timeout: float = DEADLINE) -> float:
        t0 = time.monotonic()
        while not predicate():
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.01)
        return time.monotonic() - t0

    def connect(self) -> socket.socket:
        return socket.create_connection(self.addr, timeout=DEADLINE)


def start_edge(model_dir: str, tmp: Path, *extra: str, **popen: object) -> Edge:
    stderr = tmp / "stderr.txt"
    server = ServeProcess(
        ["--model", model_dir, "--handshake", "tcp://127.0.0.1:0", "--num-engines", "2",
         "--workers", "1", "--port", "0", "--handshake-timeout", "30", *extra],
        stderr=stderr, **popen,
    )  # fmt: skip
    group = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        group = SimGroup(handshake, 2, token_fn=token_fn, max_model_len=8192).start()
        url = server.wait_line(r"^listening: (http://\S+)", 60).group(1)
    except BaseException:
        server.stop()
        if group is not None:
            group.stop()
        raise
    return Edge(server, group, url, stderr)


@contextlib.contextmanager
def running_edge(model_dir: str, tmp: Path, *extra: str) -> Iterator[Edge]:
    """`start_edge`, then a clean stop of the server (exit status 0) and of its ranks."""
    e = start_edge(model_dir, tmp, *extra)
    try:
        yield e
    finally:
        assert e.server.stop() == 0
        e.group.stop()


@pytest.fixture(scope="module")
def edge(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(
        model_dir,
        tmp_path_factory.mktemp("edge"),
        "--timeout-header", "1", "--timeout-body", "1", "--timeout-keep-alive", "30",
    ) as e:  # fmt: skip
        yield e


def closed_within(sock: socket.socket, timeout: float) -> tuple[bool, bytes]:
    """Read until EOF or ``timeout``: (closed, what was read)."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, data
        ready, _, _ = select.select([sock], [], [], remaining)
        if not ready:
            continue
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return True, data
        if not chunk:
            return True, data
        data += chunk


def request(path: str, body: dict | None = None, headers: str = "") -> bytes:
    if body is None:
        return f"GET {path} HTTP/1.1\r\nhost: x\r\n{headers}\r\n".encode()
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n{headers}\r\n"
    )
    return head.encode() + data


def worker_pid(e: Edge) -> int:
    """The pid of the server's worker that listens on its port (its one worker; the master,
    which binds the workers' listening sockets and keeps them for replacements, holds them too
    and is not it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == e.addr[1]:
                inodes.add(fields[9])
    for pid in e.server.group_pids() - {e.server.proc.pid}:
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return pid
    raise AssertionError("no process of the server listens on its port")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def edge_events(edge: Edge) -> dict[str, float]:
    """``tsfront:http_edge_events_total`` by event, from the server's ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{edge.url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "tsfront:http_edge_events":
            return {s.labels["event"]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError("no tsfront:http_edge_events family in /metrics")


def test_what_the_edge_refuses_is_counted_in_metrics(edge: Edge) -> None:
    """Idle connections closed at the header deadline and a 431 show in ``/metrics``
    (published with the worker's heartbeat, so within about a second)."""
    before = edge_events(edge)
    socks = [edge.connect() for _ in range(5)]
    for sock in socks:
        closed, _ = closed_within(sock, 8)
        assert closed
        sock.close()
    big = httpx.get(f"{edge.url}/health", headers={"x-big": "a" * 120_000}, timeout=5)
    assert big.status_code == 431
    edge.wait(
        "the header timeouts and the 431 in /metrics",
        lambda: (
            (now := edge_events(edge))["header_timeout"] >= before["header_timeout"] + 5
            and now["too_large"] >= before["too_large"] + 1
        ),
    )
    assert set(before) == {"refused", "evicted", "header_timeout", "body_timeout", "too_large"}


# ---------------------------------------------------------------------- header deadline


def test_idle_connection_closed_before_its_first_byte(edge: Edge) -> None:
    sock = edge.connect()
    t0 = time.monotonic()
    closed, data = closed_within(sock, 8)
    assert closed and data == b""
    assert time.monotonic() - t0 < 6  # --timeout-header 1, with room for a loaded machine
    sock.close()


def test_slowloris_trickling_headers_is_closed(edge: Edge) -> None:
    socks = [edge.connect() for _ in range(50)]
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
    t0 = time.monotonic()
    open_ = set(socks)
    # Keep trickling a header byte to every socket (the old keep-alive timer restarted on any
    # byte); wait on the sockets themselves for the server's close.
    while open_ and time.monotonic() - t0 < 8:
        for s in list(open_):
            try:
                s.send(b"x")
            except OSError:
                open_.discard(s)
        ready, _, _ = select.select(list(open_), [], [], 0.2)
        for s in ready:
            try:
                if not s.recv(4096):
                    open_.discard(s)
            except OSError:
                open_.discard(s)
    assert not open_, f"{len(open_)} trickling connections still open after 8 s"
    for s in socks:
        s.close()


def test_keep_alive_connection_must_send_its_next_headers_in_time(edge: Edge) -> None:
    sock = edge.connect()
    sock.sendall(request("/health"))
    closed, data = closed_within(sock, 0.5)
    assert not closed and data.startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\n")  # the next request's headers, never finished
    t0 = time.monotonic()
    closed, _ = closed_within(sock, 8)
    assert closed and time.monotonic() - t0 < 6
    sock.close()


@pytest.fixture(scope="module")
def short_keep_alive(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    """A server whose keep-alive deadline (1 s) comes before its header deadline (4 s)."""
    with running_edge(
        model_dir,
        tmp_path_factory.mktemp("keepalive"),
        "--timeout-header", "4", "--timeout-body", "4", "--timeout-keep-alive", "1",
    ) as e:  # fmt: skip
        yield e


def test_keep_alive_closes_an_idle_connection_and_any_byte_ends_it(
    short_keep_alive: Edge,
) -> None:
    """uvicorn's keep-alive, kept by the edge's header timer: idle after a response, closed at
    ``--timeout-keep-alive`` (not counted as a header timeout); a connection that keeps
    sending requests is never cut; a byte after a response ends the keep-alive deadline,
    and the header deadline applies to the rest of the headers."""
    edge = short_keep_alive
    before = edge_events(edge)["header_timeout"]
    sock = edge.connect()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5:  # past the keep-alive deadline, with requests
        sock.sendall(request("/health"))
        closed, data = closed_within(sock, 0.3)
        assert not closed and data.startswith(b"HTTP/1.1 200"), data
    t1 = time.monotonic()  # 0.3 s after the last response came
    closed, _ = closed_within(sock, 6)
    idle = time.monotonic() - t1
    assert closed and 0.4 < idle < 3, idle  # the keep-alive (1 s), not the header deadline (4)
    sock.close()
    sock = edge.connect()
    sock.sendall(request("/health"))
    closed, data = closed_within(sock, 0.5)
    assert not closed and data.startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\n")  # a byte: the keep-alive deadline is over
    t2 = time.monotonic()
    closed, _ = closed_within(sock, 8)
    waited = time.monotonic() - t2
    assert closed and 3 < waited < 7, waited  # the header deadline (4 s)
    sock.close()
    edge.wait(
        "the one header timeout in /metrics",
        lambda: edge_events(edge)["header_timeout"] >= before + 1,
    )
    assert edge_events(edge)["header_timeout"] == before + 1  # the idle close is not one


def test_a_request_longer_than_the_header_deadline_is_not_cut_and_idle_is_closed_after(
    edge: Edge,
) -> None:
    # The header deadline armed at the accept passes while the request streams (a deadline is
    # a time the timer looks at when it fires, not a timer per request): the response must
    # still end whole, and the idle connection after it must still meet a fresh deadline.
    sock = edge.connect()
    t0 = time.monotonic()
    body = {"prompt": "w5", "max_tokens": 1000, "stream": True, "ignore_eos": True}  # 2 s
    sock.sendall(request("/v1/completions", body))
    data = b""
    while not data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):  # the chunked body's end
        closed, more = closed_within(sock, 0.5)
        data += more
        assert not closed, f"closed mid-response after {time.monotonic() - t0:.1f} s"
        assert time.monotonic() - t0 < 60
    assert time.monotonic() - t0 > 1.5  # it did outlast --timeout-header 1
    assert b'"finish_reason":"length"' in data
    closed, more = closed_within(sock, 8)
    assert closed and more == b""
    sock.close()


def test_pipelined_requests_with_a_blank_line_split_across_reads(edge: Edge) -> None:
    # The held-back header bytes must still see a blank line that began in the bytes already
    # fed (the first request, and the start of the second, arrive in one read).
    sock = edge.connect()
    first = request("/health")
    sock.sendall(first + b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r")
    closed, data = closed_within(sock, 0.5)
    assert data.count(b"HTTP/1.1 200") == 1
    sock.sendall(b"\n")
    closed, data = closed_within(sock, 0.5)
    assert not closed
    assert data.startswith(b"HTTP/1.1 200") and b"tiny-words" in data
    sock.close()


# ---------------------------------------------------------------------- response writes


def read_until(sock: socket.socket, marker: bytes, timeout: float = DEADLINE) -> bytes:
    """Read until ``marker`` has arrived (fails on EOF or after ``timeout``)."""
    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} within {timeout} s: {data[-200:]!r}"
        ready, _, _ = select.select([sock], [], [], remaining)
        if ready:
            chunk = sock.recv(65536)
            assert chunk, f"closed before {marker!r}: {data[-200:]!r}"
            data += chunk
    return data


def write_syscalls(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/PID/io")


def test_a_response_head_and_its_body_go_out_in_one_write(edge: Edge) -> None:
    # The worker holds a response's status line and headers until its first body bytes and
    # writes both at once: N answers on one connection cost about N writes, not 2N.
    pid = worker_pid(edge)
    sock = edge.connect()
    n = 200
    before = write_syscalls(pid)
    for _ in range(n):
        sock.sendall(request("/v1/models"))
        data = read_until(sock, b"}]}")
        assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1") == 1
    writes = write_syscalls(pid) - before
    sock.close()
    assert writes < 1.5 * n, f"{writes} write system calls for {n} responses"


def test_expect_100_continue_is_answered_before_the_body_then_the_response(edge: Edge) -> None:
    # What a cycle writes before its response (the interim 100) is not held with the head.
    sock = edge.connect()
    data = json.dumps({"prompt": "w5", "max_tokens": 2}).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(data)
    )
    got = read_until(sock, b"\r\n\r\n")
    assert got == b"HTTP/1.1 100 Continue\r\n\r\n", got
    sock.sendall(data)
    got = read_until(sock, b'"finish_reason"')
    assert got.startswith(b"HTTP/1.1 200 OK\r\n"), got
    sock.close()


# ---------------------------------------------------------------------- body deadline


def test_partial_bodies_get_408_and_are_closed(edge: Edge) -> None:
    socks = []
    for _ in range(10):
        s = edge.connect()
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 16777216\r\n\r\n" + b" " * (1 << 20)
        )
        socks.append(s)
    t0 = time.monotonic()
    for s in socks:
        closed, data = closed_within(s, 10)
        assert closed, "a partial body held its connection open"
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error" and "did not arrive" in error["message"]
        s.close()
    assert time.monotonic() - t0 < 10
    # The worker still serves.
    assert httpx.get(f"{edge.url}/health", timeout=5).status_code == 200


# ---------------------------------------------------------------------- header size


def test_huge_header_431_in_bounded_cpu(edge: Edge) -> None:
    pid = worker_pid(edge)
    cpu0 = cpu_seconds(pid)
    sock = edge.connect()
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
    sent = 0
    piece = b"a" * 16384
    try:
        while sent < 128 << 20:  # a 128 MiB header, as the attack
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass  # the server answered and closed
    closed, data = closed_within(sock, 8)
    sock.close()
    assert closed
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["type"] == "invalid_request_error"
    assert sent < 16 << 20  # refused long before the end
    assert cpu_seconds(pid) - cpu0 < 1.0


def test_headers_under_the_limit_are_served(edge: Edge) -> None:
    big = "a" * 60000  # default --max-header-bytes is 65536
    response = httpx.get(f"{edge.url}/health", headers={"x-big": big}, timeout=5)
    assert response.status_code == 200
    too_big = httpx.get(f"{edge.url}/health", headers={"x-big": big * 2}, timeout=5)
    assert too_big.status_code == 431


# ---------------------------------------------------------------------- disconnects


def _pipelined_then_close(edge: Edge, stream: bool) -> float:
    aborts = edge.aborts()
    body = {"prompt": "w5", "max_tokens": 4000, "stream": stream}
    sock = edge.connect()
    sock.sendall(request("/v1/completions", body) + request("/v1/completions", body))
    edge.wait("the first request in flight", lambda: edge.in_flight() >= 1)
    if stream:
        closed, data = closed_within(sock, 0.5)
        assert b"data: " in data and not closed
    t0 = time.monotonic()
    sock.close()
    edge.wait("the ABORT at the engine", lambda: edge.aborts() > aborts, 4)
    edge.wait("no request in flight", lambda: edge.in_flight() == 0, 4)
    return time.monotonic() - t0


def test_pipelined_disconnect_aborts_the_running_request(edge: Edge) -> None:
    # 4000 tokens at 2 ms a step run 8 s: the abort must come well before.
    assert _pipelined_then_close(edge, stream=False) < 4


def test_pipelined_streamed_client_leaving_is_aborted_without_a_traceback(edge: Edge) -> None:
    assert _pipelined_then_close(edge, stream=True) < 4
    response = httpx.get(f"{edge.url}/health", timeout=5)  # the worker's log is flushed by now
    assert response.status_code == 200
    log = edge.stderr.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_over_deep_pipelining_closes_the_connection(edge: Edge) -> None:
    sock = edge.connect()
    body = {"prompt": "w5", "max_tokens": 4000}
    sock.sendall(request("/v1/completions", body) + request("/health") * 40)
    closed, _ = closed_within(sock, 8)
    assert closed
    sock.close()
    edge.wait("no request in flight", lambda: edge.in_flight() == 0, 4)


# ---------------------------------------------------------------------- fd limit, idle flood


def _limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def test_idle_flood_at_a_low_fd_limit(model_dir: str, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the fd hard limit ({hard}) is too low for a flood")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))

    def low_fds() -> None:  # soft 200, hard 300: the worker must raise its soft limit to 300
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 300))

    e = start_edge(model_dir, tmp_path, "--log-level", "info", preexec_fn=low_fds)
    flood: list[socket.socket] = []
    try:
        pid = worker_pid(e)
        assert _limits(pid) == (300, 300)
        for _ in range(800):  # far more than the 236 the worker may hold (300 - 64 reserved)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(e.addr)
            flood.append(s)
        # The flood's connections are all open on our side; a real client still gets through.
        client = httpx.Client(timeout=10)
        for _ in range(5):
            assert client.get(f"{e.url}/health").status_code == 200
        out = client.post(f"{e.url}/v1/completions", json={"prompt": "w5", "max_tokens": 3})
        assert out.status_code == 200 and out.json()["choices"][0]["text"] == " w100 w101 w102"
        client.close()
        e.wait(
            "the connection cap's log line",
            lambda: "connection cap (236 per worker) reached" in e.stderr.read_text(),
        )
        log = e.stderr.read_text()
        assert log.count("connection cap (236 per worker) reached") == 1  # rate-limited
    finally:
        for s in flood:
            s.close()
        e.server.stop()
        e.group.stop()
