"""``tsfront serve``'s ports: refused when anything listens there, never shared with another
server, kept by the master for a replaced worker (tsfront/serve/processes/ports.py).

Real servers (each a session of its own) against in-process simulated ranks; a port is held
the way other servers hold one (``SO_REUSEADDR``, listening; or ``SO_REUSEPORT``, as a
tsfront server's workers). Every wait has a deadline. About 20 s in all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.serve_fixtures import serve_children, start_served

from tsfront.process.child import python_module
from tsfront.testing.serve import Served

DEADLINE = 30.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def held_port(reuseport: bool = False) -> socket.socket:
    """A listening socket on a free loopback port, as another server holds its port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def serve(model: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``tsfront serve`` run to its end (it is expected to refuse at once)."""
    return subprocess.run(
        python_module(
            "tsfront", "serve", "--model", model, "--handshake", "tcp://127.0.0.1:0", *args
        ),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={k: v for k, v in os.environ.items() if k != "TSFRONT_LOG"},
    )


def one_line_refusal(done: subprocess.CompletedProcess[str], where: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tsfront: error: "), lines[0]
    assert where in lines[0] and "in use" in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    # Refused before anything started: no I/O process, so no handshake address printed.
    assert done.stdout == "", done.stdout


@pytest.mark.parametrize("reuseport", [False, True], ids=["reuseaddr", "reuseport"])
def test_a_port_another_program_listens_on_is_refused_before_anything_starts(
    model_dir: str, reuseport: bool
) -> None:
    with held_port(reuseport) as held:
        port = held.getsockname()[1]
        done = serve(model_dir, "--port", str(port), "--workers", "2")
    one_line_refusal(done, f"127.0.0.1:{port}")


def test_a_metrics_port_in_use_is_refused_naming_it(model_dir: str) -> None:
    with held_port() as held:
        port = held.getsockname()[1]
        done = serve(model_dir, "--port", "0", "--metrics-port", str(port))
    one_line_refusal(done, f"127.0.0.1:{port}")


def test_a_second_server_on_a_served_port_is_refused_and_the_first_keeps_every_client(
    model_dir: str, served: list[Served]
) -> None:
    first = start_served(model_dir, workers=2, ranks=1, args=["--served-model-name", "first"])
    served.append(first)
    port = int(first.url.rsplit(":", 1)[1])
    done = serve(model_dir, "--port", str(port), "--served-model-name", "second")
    one_line_refusal(done, f"127.0.0.1:{port}")
    # Every new connection still reaches the first server's workers (two servers sharing a
    # SO_REUSEPORT group would split them).
    for _ in range(16):
        with httpx.Client() as client:  # a connection of its own each time
            reply = client.get(f"{first.url}/v1/models", timeout=10)
        assert reply.json()["data"][0]["id"] == "first"


def _worker_pids(served: Served) -> set[int]:
    pids = set()
    for pid in serve_children(served.server.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            continue
        if line.startswith(b"tsfront: worker "):  # its title (tsfront.process.title)
            pids.add(pid)
    return pids


def test_a_replaced_worker_answers_the_connections_queued_while_its_place_was_empty(
    model_dir: str, served: list[Served], tmp_path: Path
) -> None:
    # One worker: while it is dead nobody accepts, so only a socket the master kept open can
    # hold the connection until the replacement takes it.
    s = start_served(model_dir, workers=1, ranks=1, stderr=tmp_path / "serve.stderr")
    served.append(s)
    deadline = time.monotonic() + DEADLINE
    while not (pids := _worker_pids(s)):
        assert time.monotonic() < deadline, "no worker process found"
    (pid,) = pids
    os.kill(pid, signal.SIGKILL)
    while pid in serve_children(s.server.proc.pid):
        assert time.monotonic() < deadline, "the killed worker is still there"
    # The connection is made while the place is empty (or its replacement still starting).
    reply = httpx.post(
        f"{s.url}/v1/completions", json={"prompt": "w5", "max_tokens": 2}, timeout=DEADLINE
    )
    assert reply.status_code == 200, reply.text
    assert "replaced by pid" in s.server.stderr()
