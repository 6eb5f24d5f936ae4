"""``tsfront serve`` survives its workers, drains on SIGTERM and serves ``/metrics``.

Real servers (master, I/O process, uvicorn workers, each server a session of its own) against
two in-process `SimGroup` ranks that step every 10 ms (one token per request per step), so a
stream of T tokens lasts about T/100 s and its text is known (`expected`). A worker's engine
requests are told apart at the ranks by their rid, which starts ``w<place>-<pid>-``; the ranks'
logs say which rids were aborted. Every wait has a deadline. About 45 s in all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.core_fixtures import wait_until_blocking
from support.serve_fixtures import ServeProcess, start_served

from tsfront.sim import SimGroup

FIRST = 100
DEADLINE = 20.0
STEP_MS = 10.0


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


def expected(tokens: int) -> str:
    return "".join(f" w{FIRST + p}" for p in range(tokens))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


#: Polls with a deadline (the interval is not a synchronisation).
wait = partial(wait_until_blocking, timeout=DEADLINE, interval=0.02)


class Server:
    """A running server, its ranks and what it wrote."""

    def __init__(self, proc: ServeProcess, group: SimGroup, url: str) -> None:
        self.proc = proc
        self.group = group
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])

    def workers(self) -> set[int]:
        found = set()
        for pid in self.proc.group_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(
                        b"tsfront: worker "
                    ):  # its title (tsfront.process.title)
                        found.add(pid)
            except OSError:
                continue
        return found

    def adds(self) -> list[str]:
        return [r.rid for e in self.group.engines for r in e.requests()]

    def aborts(self) -> set[str]:
        return {rid for e in self.group.engines for rid in e.aborts()}

    def served_by(self, pid: int, timeout: float = DEADLINE) -> None:
        """Wait until worker ``pid`` served a completion (new connections until one lands on
        it); every completion meanwhile must be right."""

        def served() -> bool:
            out = httpx.post(f"{self.url}/v1/completions", json={"prompt": "w5", "max_tokens": 2})
            assert out.status_code == 200 and out.json()["choices"][0]["text"] == expected(2)
            return any(_owner(r) == pid for r in self.adds())

        wait(served, f"a completion served by worker {pid}", timeout=timeout)

    def in_flight(self) -> int:
        body = httpx.get(f"{self.url}/health", timeout=5).json()
        return sum(e["in_flight"] for e in body["engines"])

    def metrics(self, url: str | None = None) -> dict[str, Any]:
        text = httpx.get(url or f"{self.url}/metrics", timeout=10).text
        return {f.name: f for f in text_string_to_metric_families(text)}


def start(model_dir: str, tmp_path: Path, workers: int, *extra: str) -> Server:
    s = start_served(
        model_dir,
        workers=workers,
        args=extra,
        stderr=tmp_path / "serve.stderr",
        timeout=60,
        token_fn=token_fn,
        max_model_len=8192,
        step_ms=STEP_MS,
    )
    return Server(s.server, s.group, s.url)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.proc.stop()
        s.group.stop()


class Stream:
    """One streamed completion read on a thread: its text, whether it ended with [DONE]."""

    def __init__(self, url: str, tokens: int) -> None:
        self.text = ""
        self.events = 0
        self.done = False
        self.server_error: str | None = None  # an error event's message
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self.first = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, tokens), daemon=True)
        self._thread.start()

    def _run(self, url: str, tokens: int) -> None:
        body = {"prompt": "w5", "max_tokens": tokens, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            self.server_error = event["error"]["message"]
                            continue
                        self.text += event["choices"][0]["text"]
                        self.events += 1
                        self.first.set()
        except BaseException as exc:  # a cut stream: the connection breaks
            self.error = exc
        finally:
            self.first.set()
            self.ended.set()


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def _owner(rid: str) -> int:
    """The pid of the worker that sent engine request ``rid`` (``w<place>-<pid>-...``)."""
    return int(rid.split("-")[1])


# ---------------------------------------------------------------------- supervision


def test_a_sigkilled_worker_costs_only_its_own_streams_and_is_replaced(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 2)
    servers.append(s)
    old = s.workers()
    assert len(old) == 2
    tokens = 600  # ~6 s per stream: longer than the replacement takes
    streams: list[Stream] = []
    # Open streams (each on a new connection) until both workers have some.
    while len({_owner(r) for r in s.adds()}) < 2 or len(streams) < 6:
        assert len(streams) < 40, "the kernel never spread the connections"
        streams.append(Stream(s.url, tokens))
        wait(streams[-1].first.wait, "the stream's first event")
        assert streams[-1].error is None
    victim = _owner(s.adds()[0])
    assert victim in old
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    # A new worker serves within 5 s of the kill (while the others still stream): a
    # completion reaches a rank from its pid.
    (fresh,) = wait(lambda: s.workers() - old, "the replacement", timeout=5.0)
    s.served_by(fresh, max(0.5, 5.0 - (time.monotonic() - t0)))
    took = time.monotonic() - t0
    assert not all(st.ended.is_set() for st in streams)  # the others were still streaming
    for st in streams:
        assert st.ended.wait(DEADLINE)
    victims_rids = {r for r in s.adds() if _owner(r) == victim}
    survivors = [st for st in streams if st.done]
    cut = [st for st in streams if not st.done]
    # Every stream of the other worker has every token; only the victim's were cut.
    assert all(st.text == expected(tokens) and st.events > 1 for st in survivors)
    assert len(cut) == len(victims_rids) >= 1
    assert all(st.error is not None and len(st.text) < len(expected(tokens)) for st in cut)
    assert len(survivors) == len(streams) - len(cut) >= 1
    # The victim's engine requests were aborted at the ranks (the I/O process saw the detach).
    wait(lambda: victims_rids <= s.aborts(), "the victim's requests aborted at the engines")
    print(f"\nworker SIGKILLed -> its replacement served a request {took:.2f}s later")
    wait(lambda: s.in_flight() == 0, "no request in flight")
    m = s.metrics()
    assert m["tsfront:io_requests_in_flight"].samples[0].value == 0
    assert m["tsfront:worker_restarts"].samples[0].value == 1
    assert httpx.get(f"{s.url}/health", timeout=5).json()["worker_restarts"] == 1
    assert "was killed by SIGKILL; replacing it" in s.proc.stderr()
    assert s.proc.stop() == 0


def test_a_stopped_worker_is_killed_after_the_worker_timeout_and_replaced(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 2, "--worker-timeout", "2")
    servers.append(s)
    old = s.workers()
    victim = min(old)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    try:
        wait(lambda: victim not in s.workers(), "the stopped worker killed", timeout=DEADLINE)
    finally:
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass
    took = time.monotonic() - t0
    assert took >= 2.0  # not before its timeout
    (fresh,) = wait(lambda: s.workers() - old, "the replacement")
    s.served_by(fresh)  # the server keeps serving, the replacement included
    for _ in range(10):
        out = httpx.post(f"{s.url}/v1/completions", json={"prompt": "w5", "max_tokens": 3})
        assert out.status_code == 200 and out.json()["choices"][0]["text"] == expected(3)
    assert "sent no heartbeat" in s.proc.stderr()
    assert "--worker-timeout 2" in s.proc.stderr()
    assert s.metrics()["tsfront:worker_restarts"].samples[0].value == 1
    assert s.proc.stop() == 0


def test_a_worker_dying_past_the_restart_budget_stops_the_server_exit_1(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 1, "--max-worker-restarts", "1")
    servers.append(s)
    (first,) = s.workers()
    os.kill(first, signal.SIGKILL)
    (second,) = wait(lambda: s.workers() - {first}, "the replacement")
    os.kill(second, signal.SIGKILL)  # the second death in the window: past the budget
    assert s.proc.proc.wait(DEADLINE) == 1
    err = s.proc.stderr()
    assert f"worker 0 (pid {second}) was killed by SIGKILL; 1 worker restart(s) within 60s" in err
    assert "(--max-worker-restarts, --worker-restart-window): stopping" in err
    wait(lambda: not s.proc.group_pids(), "every process of the server gone", timeout=10)


# ---------------------------------------------------------------------- drain


def test_sigterm_drains_running_streams_refuses_new_connections_and_503s_health(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 1, "--graceful-timeout", "15")
    servers.append(s)
    kept = httpx.Client(base_url=s.url, timeout=10)  # a keep-alive connection, opened now
    assert kept.get("/health").status_code == 200
    tokens = 300  # ~3 s
    streams = [Stream(s.url, tokens) for _ in range(4)]
    for st in streams:
        assert st.first.wait(DEADLINE) and st.error is None
    t0 = time.monotonic()
    s.proc.proc.send_signal(signal.SIGTERM)
    wait(lambda: _refused(s.port), "new connections refused", timeout=5.0)
    assert not all(st.ended.is_set() for st in streams)  # refused while streams still run
    health = kept.get("/health")
    assert health.status_code == 503
    assert health.headers["connection"] == "close"
    assert "shutting down" in health.json()["error"]["message"]
    for st in streams:
        assert st.ended.wait(DEADLINE)
    took = time.monotonic() - t0
    assert all(st.done and st.text == expected(tokens) for st in streams), [
        (st.done, len(st.text), st.error) for st in streams
    ]
    assert s.proc.proc.wait(DEADLINE) == 0
    assert took < 15
    assert not s.aborts() & set(s.adds())  # nothing was cut
    kept.close()
    print(f"\nSIGTERM with 4 streams of {tokens} tokens: all done {took:.2f}s later")


def test_streams_longer_than_the_graceful_timeout_are_cut_and_aborted(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 1, "--graceful-timeout", "1")
    servers.append(s)
    streams = [Stream(s.url, 3000) for _ in range(3)]  # ~30 s each
    for st in streams:
        assert st.first.wait(DEADLINE) and st.error is None
    t0 = time.monotonic()
    s.proc.proc.send_signal(signal.SIGTERM)
    for st in streams:
        assert st.ended.wait(DEADLINE)
    took = time.monotonic() - t0
    # Each cut stream ends with an error event that says why, then [DONE]: a clean end of
    # the response, not a broken connection, and no traceback in the server's log.
    for st in streams:
        assert st.error is None and st.done, (st.error, st.done)
        assert st.server_error is not None and "shutting down" in st.server_error
        assert 0 < len(st.text) < len(expected(3000))
    assert "Traceback" not in s.proc.stderr()
    assert 1.0 <= took < 10.0
    print(f"\n--graceful-timeout 1: streams cut {took:.2f}s after SIGTERM")
    rids = set(s.adds())
    assert len(rids) == 3
    wait(lambda: rids <= s.aborts(), "the cut streams' requests aborted at the engines")
    assert s.proc.proc.wait(DEADLINE) == 0


def test_a_cut_responses_stream_ends_with_its_own_error_event(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    """A /v1/responses stream cut by the graceful timeout ends with the Responses API's own
    ``error`` event (not chat's ``data: {"error"}`` and ``[DONE]``)."""
    s = start(model_dir, tmp_path, 1, "--graceful-timeout", "1")
    servers.append(s)
    lines: list[str] = []
    began = threading.Event()
    ended = threading.Event()

    def read() -> None:
        body = {"input": "w5", "max_output_tokens": 3000, "stream": True, "store": False}
        try:
            with httpx.stream("POST", f"{s.url}/v1/responses", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    lines.append(line)
                    if line.startswith("event: response.output_text.delta"):
                        began.set()
        finally:
            began.set()
            ended.set()

    threading.Thread(target=read, daemon=True).start()
    assert began.wait(DEADLINE)
    s.proc.proc.send_signal(signal.SIGTERM)
    assert ended.wait(DEADLINE)
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[-1] == "error", events[-3:]
    last = json.loads(next(line for line in reversed(lines) if line.startswith("data: "))[6:])
    assert last["type"] == "error" and "shutting down" in last["message"], last
    numbers = [
        json.loads(line[6:])["sequence_number"] for line in lines if line.startswith("data: ")
    ]
    assert numbers == list(range(len(numbers)))  # the cut's event numbered after the rest
    assert "data: [DONE]" not in lines
    assert "Traceback" not in s.proc.stderr()
    assert s.proc.proc.wait(DEADLINE) == 0


def test_a_second_sigterm_stops_at_once(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 1, "--graceful-timeout", "60")
    servers.append(s)
    streams = [Stream(s.url, 3000) for _ in range(2)]
    for st in streams:
        assert st.first.wait(DEADLINE) and st.error is None
    t0 = time.monotonic()
    s.proc.proc.send_signal(signal.SIGTERM)
    wait(lambda: _refused(s.port), "the drain to begin (connections refused)", timeout=5.0)
    s.proc.proc.send_signal(signal.SIGTERM)
    assert s.proc.proc.wait(DEADLINE) == 0
    took = time.monotonic() - t0
    assert took < 10.0  # not the 60 s of the graceful timeout
    print(f"\na second SIGTERM: the server exited {took:.2f}s after the first")
    for st in streams:
        assert st.ended.wait(5) and st.error is None
        assert st.server_error is not None and "shutting down" in st.server_error
    assert "Traceback" not in s.proc.stderr()
    rids = set(s.adds())
    wait(lambda: rids <= s.aborts(), "the cut streams' requests aborted at the engines")
    assert "cutting 1 worker(s)' running requests now" in s.proc.stderr()


# ---------------------------------------------------------------------- /metrics


def _requests(m: dict[str, Any]) -> dict[tuple[str, str], float]:
    family = m["tsfront:http_requests"]
    return {
        (x.labels["route"], x.labels["status"]): x.value
        for x in family.samples
        if x.name == "tsfront:http_requests_total"
    }


def test_metrics_count_every_workers_requests_by_route_and_status_and_the_restarts(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 2)
    servers.append(s)
    for _ in range(20):  # a new connection each: the kernel spreads them over the workers
        out = httpx.post(f"{s.url}/v1/completions", json={"prompt": "w5", "max_tokens": 2})
        assert out.status_code == 200
    for _ in range(3):
        bad = httpx.post(f"{s.url}/v1/completions", json={"prompt": "w5", "top_p": 7})
        assert bad.status_code == 400
    for _ in range(2):
        assert httpx.get(f"{s.url}/v1/nothing").status_code == 404
    for _ in range(4):
        assert httpx.get(f"{s.url}/health").status_code == 200
    assert len({_owner(r) for r in s.adds()}) == 2  # both workers served some
    m = s.metrics()
    assert _requests(m) == {
        ("completions", "200"): 20,
        ("completions", "400"): 3,
        ("other", "404"): 2,
        ("health", "200"): 4,
    }
    assert m["tsfront:worker_restarts"].samples[0].value == 0
    # The frontend's own figures are in the same page: every worker's, and the engines'.
    assert m["tsfront:requests"].samples[0].value == 20
    assert m["tsfront:workers_attached"].samples[0].value == 2
    assert {x.labels["engine"] for x in m["tsfront:engine_up"].samples} == {"0", "1"}
    # A worker dies: its counts stay, the restart is counted, any worker's page shows it all.
    old = s.workers()
    os.kill(min(old), signal.SIGKILL)
    (fresh,) = wait(lambda: s.workers() - old, "the replacement")
    s.served_by(fresh)
    wait(
        lambda: s.metrics()["tsfront:worker_restarts"].samples[0].value == 1,
        "the restart counted",
    )
    for _ in range(6):
        assert s.metrics()["tsfront:worker_restarts"].samples[0].value == 1
    counts = _requests(s.metrics())
    served = len(s.adds()) - 20  # the completions that looked for the replacement
    assert counts[("completions", "200")] == 20 + served
    assert counts[("completions", "400")] == 3
    # The scrapes so far: 8 at least before this reading. A worker counts a response after
    # its last byte went out, so the count of one just answered (by either worker) may land
    # after the next scrape read the counters: wait for it rather than race it.
    wait(lambda: _requests(s.metrics())[("metrics", "200")] >= 8, "the scrapes counted")
    assert s.proc.stop() == 0


def test_metrics_port_keeps_metrics_off_the_api_port(
    model_dir: str, tmp_path: Path, servers: list[Server]
) -> None:
    s = start(model_dir, tmp_path, 1, "--metrics-port", "0")
    servers.append(s)
    # (printed right after the listening line)
    metrics_url = s.proc.wait_line(r"^metrics: (http://\S+)", 5).group(1)
    assert httpx.get(f"{s.url}/metrics").status_code == 404
    out = httpx.post(f"{s.url}/v1/completions", json={"prompt": "w5", "max_tokens": 2})
    assert out.status_code == 200
    assert (
        httpx.post(metrics_url.replace("/metrics", "/v1/completions"), json={}).status_code == 404
    )
    m = s.metrics(metrics_url)
    # (the route is the path's: a completion asked on the metrics port is a completions 404)
    assert _requests(m) == {
        ("metrics", "404"): 1,
        ("completions", "200"): 1,
        ("completions", "404"): 1,
    }
    assert m["tsfront:requests"].samples[0].value == 1
    assert s.proc.stop() == 0


# ---------------------------------------------------------------------- a plain install

_BLOCK_UVICORN = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("uvicorn", "httptools"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from tsfront.commands import main
sys.exit(main(sys.argv[1:]))
"""


def test_serve_without_the_serve_extra_exits_2_with_the_install_line_before_starting(
    model_dir: str,
) -> None:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _BLOCK_UVICORN, "serve", "--model", model_dir,
         "--handshake", "tcp://127.0.0.1:0", "--port", "0"],
        capture_output=True, text=True, timeout=60, start_new_session=True,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert out.returncode == 2, out.stderr
    # The line names the checkout this tsfront was installed from, with its serve extra.
    line = re.search(r"(\S+) -m pip install '(\S+)\[serve\]'", out.stderr)
    assert line, out.stderr
    assert Path(line.group(1)).samefile(sys.executable)
    pyproject = (Path(line.group(2)) / "pyproject.toml").read_text()
    assert "\nserve = [" in pyproject
    assert "uvicorn, httptools" in out.stderr
    assert "handshake:" not in out.stdout  # no I/O process was started
    assert "Traceback" not in out.stderr
    print(f"\nrefused in {took:.2f}s: {out.stderr.strip()}")
