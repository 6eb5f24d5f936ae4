"""tsfront's ASGI app hosted by a plain uvicorn (``uvicorn --factory
tsfront.serve.asgi:app_from_env``, attached to ``tsfront io``), as docs/SERVE.md's
"Embedding it" says any ASGI server can host it, against two simulated ranks.

Under ``tsfront serve`` the HTTP protocol tells the app of a lost connection itself
(`tsfront.serve.protocol`); under any other server the app watches ``receive()`` for
``http.disconnect`` (`tsfront.serve.asgi._DisconnectWatch`). These tests are that watch's, by
a client that leaves mid-stream and one that leaves before the first token: each must abort
its engine request. About 5 s.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from support.core_fixtures import free_port
from support.embed_fixtures import DEADLINE, read_line, spawn, stop, wait_healthy

from tsfront.sim import SimGroup

FIRST = 100


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


class Hosted:
    def __init__(self, url: str, group: SimGroup) -> None:
        self.url = url
        self.group = group

    def aborts(self) -> int:
        return sum(c["aborts"] for c in self.group.counters().values())

    def in_flight(self) -> int:
        body = httpx.get(f"{self.url}/health", timeout=5).json()
        return sum(e["in_flight"] for e in body["engines"])

    def wait(self, what: str, predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.01)


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosted]:
    from tsfront.text.testing import make_test_model

    model = str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))
    io = spawn(
        [
            sys.executable,
            "-m",
            "tsfront",
            "io",
            "--handshake",
            "tcp://127.0.0.1:0",
            "--num-engines",
            "2",
            "--no-monitor",
            "--json",
        ],
        {},
    )
    server = group = None
    try:
        info = json.loads(read_line(io, "", DEADLINE))
        group = SimGroup(info["handshake_address"], 2, token_fn=token_fn).start()
        port = free_port()
        server = spawn(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "tsfront.serve.asgi:app_from_env",
                "--http",
                "httptools",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            {"TSFRONT_ATTACH": info["address"], "TSFRONT_MODEL": model},
        )
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        yield Hosted(url, group)
    finally:
        if server is not None:
            stop(server)
        stop(io)
        if group is not None:
            group.stop()


def test_a_stream_under_plain_uvicorn(hosted: Hosted) -> None:
    client = openai.OpenAI(base_url=f"{hosted.url}/v1", api_key="none", max_retries=0)
    events = client.completions.create(model="tiny-words", prompt="w5", max_tokens=6, stream=True)
    assert "".join(e.choices[0].text for e in events) == "".join(f" w{FIRST + p}" for p in range(6))


def test_a_client_leaving_mid_stream_aborts_the_engine_request(hosted: Hosted) -> None:
    before = hosted.aborts()
    with httpx.stream(
        "POST",
        f"{hosted.url}/v1/completions",
        json={"prompt": "w5", "max_tokens": 3000, "stream": True},
        timeout=DEADLINE,
    ) as response:
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"].startswith(f" w{FIRST}")
    # The connection is closed here, mid-stream.
    hosted.wait("the disconnect's ABORT at the engine", lambda: hosted.aborts() > before)
    hosted.wait("no request in flight", lambda: hosted.in_flight() == 0)


def test_a_client_leaving_before_the_first_token_aborts_the_engine_request(
    hosted: Hosted,
) -> None:
    # The ranks are frozen: nothing is being sent that could fail; only the watch on
    # receive() can see the client leave.
    before = hosted.aborts()
    host, port = hosted.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"prompt": "w5", "max_tokens": 50, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    engines = [hosted.group.engine(r) for r in range(2)]
    for engine in engines:
        engine.stall()
    try:
        sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
        sock.sendall(head + body)
        hosted.wait("the request in flight", lambda: hosted.in_flight() == 1)
        sock.close()
        hosted.wait("the disconnect to free it, the ranks frozen", lambda: hosted.in_flight() == 0)
    finally:
        for engine in engines:
            engine.resume()
    hosted.wait("the disconnect's ABORT at the engine", lambda: hosted.aborts() > before)
