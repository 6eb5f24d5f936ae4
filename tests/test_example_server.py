"""End to end: ``examples/http_server`` with several workers against simulated engines.

The server runs as its own process group (master, I/O process, spawned workers); the engines
are in-process `SimGroup` threads whose ``token_fn`` spells a known text per rid in byte
tokens, so every streamed text can be predicted exactly, and whose logs let the test wait for
the ABORT a stop string must cause. Every wait has a deadline; teardown stops the group (kill
on timeout). The pure pieces (stop matching, detokenizers) are unit-tested at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsfront.sim import SimGroup

ROOT = Path(__file__).resolve().parents[1]
SERVER_DIR = ROOT / "examples" / "http_server"
WORKERS = 3
DEADLINE_S = 20.0

sys.path.insert(0, str(SERVER_DIR))
from textproc import ByteTokenizer, HFTokenizer, StopMatcher  # noqa: E402


def text_for(rid: str) -> bytes:
    """What the simulated engine 'says' for ``rid``: ASCII plus multi-byte characters."""
    return f"<{rid}> The quick brown fox, café ☕, jumps over the lazy dog. ".encode()


def token_fn(rid: str, position: int) -> int:
    data = text_for(rid)
    return data[position % len(data)] + 3


def expected_text(rid: str, tokens: int) -> str:
    data = text_for(rid)
    full = (data * (tokens // len(data) + 1))[:tokens]
    return full.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------- fixtures


class Server:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the server printed no line matching {pattern!r}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"the server exited ({self.proc.wait()}) before {pattern!r}")
            match = re.search(pattern, line)
            if match:
                return match

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything left in the group
        except ProcessLookupError:
            pass
        if code is None:
            self.proc.wait(5)
        return code


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, SimGroup, Server]]:
    env = {**os.environ, "TSFRONT_LOG": "ERROR"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SERVER_DIR / "server.py"),
            "--handshake",
            "tcp://127.0.0.1:0",
            "--num-engines",
            "2",
            "--workers",
            str(WORKERS),
            "--port",
            "0",
            "--handshake-timeout",
            "30",
        ],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    server = Server(proc)
    sim = None
    try:
        handshake = server.wait_line(r"^handshake: (tcp://\S+)$", DEADLINE_S).group(1)
        sim = SimGroup(handshake, 2, step_ms=3.0, token_fn=token_fn).start()
        url = server.wait_line(r"^listening: http://(\S+) workers=(\d+)$", DEADLINE_S)
        assert int(url.group(2)) == WORKERS
        yield url.group(1), sim, server
    finally:
        code = server.stop()
        if sim is not None:
            sim.stop()
    assert code == 0, f"the server exited with {code} on SIGTERM"


# ---------------------------------------------------------------------- a small HTTP client


async def post(hostport: str, body: dict, *, events_before_close: int | None = None):
    """POST /generate; returns (status, headers, events or JSON body)."""
    host, port = hostport.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        data = json.dumps(body).encode()
        writer.write(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {}
        for line in head[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") != "chunked":
            payload = await reader.readexactly(int(headers["content-length"]))
            return status, headers, json.loads(payload)
        events, buf = [], b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            buf += (await reader.readexactly(size + 2))[:-2]
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                assert event.startswith(b"data: ")
                events.append(event[6:].decode())
            if events_before_close is not None and len(events) >= events_before_close:
                return status, headers, events  # hang up mid-stream
        return status, headers, events
    finally:
        writer.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def joined(events: list[str]) -> tuple[str, dict]:
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    return "".join(e["text"] for e in parsed), parsed[-1]


# ---------------------------------------------------------------------- end to end


def test_concurrent_streams_spread_over_workers(served) -> None:
    hostport, _sim, _server = served
    lengths = [20 + 7 * i for i in range(12)]

    async def main():
        return await asyncio.gather(
            *(
                post(hostport, {"prompt": f"hi {n}", "max_tokens": n, "stream": True})
                for n in lengths
            )
        )

    results = run(main())
    workers = set()
    for n, (status, headers, events) in zip(lengths, results):
        assert status == 200
        assert headers["content-type"] == "text/event-stream"
        rid = headers["x-request-id"]
        text, last = joined(events)
        assert text == expected_text(rid, n)
        assert last["finish_reason"] == "length"
        assert last["id"] == rid
        assert last["usage"] == {"prompt_tokens": len(f"hi {n}".encode()), "completion_tokens": n}
        assert len(events) > 3, "the text must arrive as a stream, not in one piece"
        workers.add(headers["x-worker"])
    # SO_REUSEPORT hashes connections over the workers: 12 all on one of 3 is ~1e-5 likely.
    assert len(workers) >= 2, workers


def test_non_streaming_request(served) -> None:
    hostport, _sim, _server = served
    status, headers, body = run(post(hostport, {"prompt": "x", "max_tokens": 50}))
    assert status == 200
    assert body["text"] == expected_text(body["id"], 50)
    assert body["finish_reason"] == "length"
    assert headers["x-request-id"] == body["id"]


@pytest.mark.parametrize("stop", ["lazy", "é ☕", "fox,"])
def test_stop_string_ends_stream_and_aborts_engine(served, stop: str) -> None:
    hostport, sim, _server = served
    body = {"prompt": "tell me", "max_tokens": 2000, "stop": ["never-there", stop], "stream": True}
    status, headers, events = run(post(hostport, body))
    assert status == 200
    rid = headers["x-request-id"]
    text, last = joined(events)
    full = expected_text(rid, 500)
    assert text == full[: full.index(stop)], "output must end right before the stop string"
    assert stop not in text
    assert last["finish_reason"] == "stop"
    assert last["matched_stop"] == stop
    assert last["usage"]["completion_tokens"] < 2000
    # The engine received the abort: it stops decoding instead of running to max_tokens.
    assert sim.wait_abort(rid, DEADLINE_S) in (0, 1)


def test_stop_string_non_streaming(served) -> None:
    hostport, sim, _server = served
    body = {"prompt": "q", "max_tokens": 2000, "stop": "brown"}
    status, _headers, reply = run(post(hostport, body))
    assert status == 200
    full = expected_text(reply["id"], 500)
    assert reply["text"] == full[: full.index("brown")]
    assert reply["finish_reason"] == "stop"
    sim.wait_abort(reply["id"], DEADLINE_S)


def test_client_disconnect_aborts_engine_request(served) -> None:
    hostport, sim, _server = served
    body = {"prompt": "long", "max_tokens": 5000, "stream": True}
    status, headers, events = run(post(hostport, body, events_before_close=2))
    assert status == 200 and len(events) >= 2
    assert sim.wait_abort(headers["x-request-id"], DEADLINE_S) in (0, 1)


def test_bad_requests_are_400(served) -> None:
    hostport, _sim, _server = served
    for body in ({"max_tokens": 3}, {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "stop": 3}):
        status, _headers, reply = run(post(hostport, body))
        assert status == 400 and "error" in reply


# ---------------------------------------------------------------------- pure pieces


def test_stop_matcher_across_deltas() -> None:
    text = "abc STOP def"
    for split in range(1, 6):
        m = StopMatcher(["STOP", "zz"])
        out, stop = "", None
        for i in range(0, len(text), split):
            piece, stop = m.feed(text[i : i + split])
            out += piece
            if stop:
                break
        assert (out, stop) == ("abc ", "STOP")
    m = StopMatcher(["xyz"])
    assert m.feed("ab") == ("", None)  # held: could start a stop string
    assert m.feed("cx") == ("ab", None)
    assert m.flush() == "cx"
    assert StopMatcher([]).feed("anything") == ("anything", None)


def test_byte_detokenizer_holds_incomplete_utf8() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("a☕b")
    detok = tok.detokenizer()
    pieces = [detok.feed([i]) for i in ids]
    assert pieces == ["a", "", "", "☕", "b"]
    assert tok.decode([2, *tok.encode("é"), 1]) == "é"  # special ids skipped


class _FakeHF:
    """A tokenizers-like object: ids are UTF-8 bytes, so one character can span ids."""

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text, add_special_tokens=False):
        return self._Enc(list(text.encode()))

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_hf_detokenizer_incremental() -> None:
    tok = HFTokenizer.from_object(_FakeHF())
    ids = tok.encode("hé ☕!")
    detok = tok.detokenizer()
    out = "".join(detok.feed([i]) for i in ids) + detok.flush()
    assert out == "hé ☕!"


def test_server_attached_to_tsfront_io() -> None:
    """``tsfront io`` owns the engine; the server's workers only ``--attach`` to it."""
    env = {**os.environ, "TSFRONT_LOG": "ERROR"}
    io = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tsfront.cli",
            "io",
            *("--handshake", "tcp://127.0.0.1:0"),
            "--json",
            "--num-engines",
            "1",
        ],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    io_lines = Server(io)
    sim = server = None
    try:
        info = json.loads(io_lines.wait_line(r"^\{", DEADLINE_S).string)
        sim = SimGroup(info["handshake_address"], 1, token_fn=token_fn).start()
        server = Server(
            subprocess.Popen(
                [
                    *(sys.executable, str(SERVER_DIR / "server.py")),
                    *("--attach", info["address"], "--workers", "2", "--port", "0"),
                ],
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        )
        hostport = server.wait_line(r"^listening: http://(\S+) ", DEADLINE_S).group(1)
        body = {"prompt": "p", "max_tokens": 300, "stop": ["fox"], "stream": True}
        status, headers, events = run(post(hostport, body))
        assert status == 200
        text, last = joined(events)
        rid = headers["x-request-id"]
        full = expected_text(rid, 200)
        assert text == full[: full.index("fox")] and last["finish_reason"] == "stop"
        sim.wait_abort(rid, DEADLINE_S)
    finally:
        codes = [s.stop() for s in (server, io_lines) if s is not None]
        if sim is not None:
            sim.stop()
    assert codes == [0, 0]
