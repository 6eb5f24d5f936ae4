"""``tsfront serve --request-timeout 3`` on ``tsfront io --stall-timeout 1``, with a rank that
freezes while alive.

Two in-process sim ranks; `SimEngine.stall` freezes one while its sockets stay up (the ZMTP
heartbeats keep being answered, so nothing at the connection level notices). Seen as a user
sees it, over HTTP: ``/health`` and ``/metrics`` report the rank stalled, new requests all go
to the other rank and complete, the frozen rank's stream ends with a timeout error event and
``[DONE]`` at the request timeout, and the rank, resumed, is placed on again. Then both ranks
freeze: ``/health`` answers 503, requests are still placed (not refused) and end with 504.
Every wait has a deadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.core_fixtures import free_port
from support.serve_fixtures import ServeProcess

from tsfront.sim import SimGroup

DEADLINE = 15.0
STALL_S = 1.0
TIMEOUT_S = 3.0


def token_fn(rid: str, position: int) -> int:
    return 100 + position


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, SimGroup, str]]:
    """`tsfront io --stall-timeout 1 --metrics-port P` (its Prometheus endpoint: the whole
    frontend's figures) and `tsfront serve --attach ... --request-timeout 3` on it."""
    from tsfront.text.testing import make_test_model

    model = str(
        make_test_model(
            tmp_path_factory.mktemp("model") / "tiny-words",
            "wordlevel",
            max_position_embeddings=32768,  # the 20,000-token streams fit its context
        )
    )
    port = free_port()
    io = subprocess.Popen(
        [sys.executable, "-m", "tsfront", "io", "--handshake", "tcp://127.0.0.1:0",
         "--num-engines", "2", "--stall-timeout", str(STALL_S), "--metrics-port", str(port),
         "--json"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    group = server = None
    try:
        info = json.loads(io.stdout.readline())
        group = SimGroup(info["handshake_address"], 2, token_fn=token_fn).start()
        server = ServeProcess(
            ["--model", model, "--attach", info["address"], "--workers", "1", "--port", "0",
             "--request-timeout", str(TIMEOUT_S)]
        )  # fmt: skip
        url = server.wait_line(r"^listening: (http://\S+)", 60).group(1)
        yield url, f"http://127.0.0.1:{port}/metrics", group, model
        assert server.stop() == 0
    finally:
        if server is not None:
            server.stop()
        io.terminate()
        io.wait(10)
        if group is not None:
            group.stop()


def _wait(what: str, predicate, timeout: float = DEADLINE):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling interval of a wait with a deadline, not a synchronisation


def _states(url: str) -> tuple[int, list[str]]:
    r = httpx.get(f"{url}/health", timeout=5)
    return r.status_code, [e["state"] for e in r.json()["engines"]]


def _metric(metrics_url: str, name: str, engine: int) -> float:
    text = httpx.get(metrics_url, timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels.get("engine") == str(engine):
                return s.value
    raise AssertionError(f"/metrics has no {name}{{engine={engine}}}")


def _adds(group: SimGroup, index: int) -> int:
    return group.engine(index).counters()["adds"]


def _rank_of(group: SimGroup, before: list[int]) -> int:
    """The rank whose ADD count grew since ``before`` (exactly one must have)."""
    _wait("the ADD to reach a rank", lambda: sum(_adds(group, i) for i in (0, 1)) > sum(before))
    grew = [i for i in (0, 1) if _adds(group, i) > before[i]]
    assert len(grew) == 1
    return grew[0]


def test_stalled_rank_is_skipped_reported_and_its_stream_ends_with_a_timeout(served) -> None:
    url, metrics, group, _ = served
    before = [_adds(group, i) for i in (0, 1)]
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json={"prompt": "w5", "max_tokens": 20_000, "stream": True},
        timeout=DEADLINE,
    ) as response:
        t0 = time.monotonic()
        lines = (line[6:] for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(next(lines))["choices"][0]["text"].startswith(" w100")
        stuck = _rank_of(group, before)
        other = 1 - stuck
        group.engine(stuck).stall()
        # Reported within the stall timeout (plus the once-a-second check), while serving.
        status, states = _wait(
            "/health to report the stall", lambda: (s := _states(url))[1][stuck] == "stalled" and s
        )
        assert status == 200 and states[other] == "live"
        assert _metric(metrics, "tsfront:engine_stalled", stuck) == 1
        assert _metric(metrics, "tsfront:engine_stalled", other) == 0
        assert _metric(metrics, "tsfront:engine_stalls_total", stuck) == 1
        # New requests all go to the live rank and complete (sent together, so least in
        # flight alone would have put some on the frozen rank).
        stuck_adds = _adds(group, stuck)
        results: list[httpx.Response] = []

        def one() -> None:
            results.append(
                httpx.post(
                    f"{url}/v1/completions",
                    json={"prompt": "w5", "max_tokens": 4},
                    timeout=DEADLINE,
                )
            )

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert [r.status_code for r in results] == [200] * 6
        assert all(r.json()["choices"][0]["text"] == " w100 w101 w102 w103" for r in results)
        assert _adds(group, stuck) == stuck_adds
        # The frozen rank's stream ends at the request timeout: an error event, then [DONE].
        rest = list(lines)
        elapsed = time.monotonic() - t0
    assert rest[-1] == "[DONE]"
    error = json.loads(rest[-2])["error"]
    assert error["type"] == "timeout_error" and error["code"] == 504
    assert "not finished within 3 s" in error["message"]
    assert TIMEOUT_S - 0.5 <= elapsed < TIMEOUT_S + DEADLINE / 2
    # Resumed: it holds nothing now, takes its turn, and its first output clears the stall.
    group.engine(stuck).resume()
    _wait("the stall to clear", lambda: _requests_until_live(url, stuck))
    assert _metric(metrics, "tsfront:engine_stalled", stuck) == 0
    assert _metric(metrics, "tsfront:engine_stalls_total", stuck) == 1


def _requests_until_live(url: str, rank: int) -> bool:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 2}, timeout=5)
    assert r.status_code == 200
    return _states(url)[1][rank] == "live"


@pytest.fixture(scope="module")
def own_io(served) -> Iterator[tuple[str, SimGroup]]:
    """`tsfront serve` starting its own I/O process: ``--stall-timeout`` is the server's."""
    model = served[3]
    server = ServeProcess(
        ["--model", model, "--handshake", "tcp://127.0.0.1:0", "--num-engines", "2",
         "--workers", "1", "--port", "0", "--stall-timeout", str(STALL_S),
         "--request-timeout", str(TIMEOUT_S)]
    )  # fmt: skip
    group = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        group = SimGroup(handshake, 2, token_fn=token_fn).start()
        url = server.wait_line(r"^listening: (http://\S+)", 60).group(1)
        yield url, group
        assert server.stop() == 0
    finally:
        server.stop()
        if group is not None:
            group.stop()


def test_every_rank_stalled_answers_503_on_health_and_504_after_the_timeout(own_io) -> None:
    url, group = own_io
    _wait("both ranks live", lambda: _states(url) == (200, ["live", "live"]))
    for rank in (0, 1):
        group.engine(rank).stall()
    results: dict[str, httpx.Response] = {}

    def one(name: str, body: dict) -> None:
        results[name] = httpx.post(f"{url}/v1/completions", json=body, timeout=DEADLINE)

    # One request per rank (least in flight), neither answered: both ranks stall.
    plain = {"prompt": "w5", "max_tokens": 4}
    threads = [threading.Thread(target=one, args=(f"r{i}", plain)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        status, _ = _wait(
            "both stalls", lambda: (s := _states(url))[1] == ["stalled", "stalled"] and s
        )
        assert status == 503
        # Placed anyway (not refused with 503), and bounded by the request timeout; a streamed
        # request that never got its first token gets the status too.
        late = threading.Thread(target=one, args=("late", {**plain, "stream": True}))
        late.start()
        threads.append(late)
        for t in threads:
            t.join(DEADLINE)
    finally:
        for rank in (0, 1):
            group.engine(rank).resume()
    for name in ("r0", "r1", "late"):
        r = results[name]
        assert r.status_code == 504, (name, r.text)
        error = r.json()["error"]
        assert error["type"] == "timeout_error" and "not finished within 3 s" in error["message"]
    _wait("the stalls to clear", lambda: _requests_until_live(url, 0) and _states(url)[0] == 200)


def test_stall_timeout_with_attach_is_refused_as_the_io_process_s() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "serve", "--model", "unused", "--attach",
         "unix:@nothing", "--stall-timeout", "5"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--stall-timeout belongs to the I/O process" in out.stderr


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--request-timeout", "0", "must be > 0"), ("--stall-timeout", "-1", "must be >= 0")],
)
def test_bad_timeouts_are_usage_errors(flag: str, value: str, says: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "serve", "--model", "unused", "--handshake",
         "tcp://127.0.0.1:0", flag, value],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert out.returncode == 2 and says in out.stderr
