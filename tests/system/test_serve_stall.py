"""``tsfront serve --request-timeout 3`` on ``tsfront io --stall-timeout 1``, with a rank that
freezes while alive.

Two in-process sim ranks; `SimEngine.stall` freezes one while its sockets stay up (the ZMTP
heartbeats keep being answered, so nothing at the connection level notices). Seen as a user
sees it, over HTTP: ``/health`` and ``/metrics`` report the rank stalled, new requests all go
to the other rank and complete, the frozen rank's stream ends with a timeout error event and
``[DONE]`` at the request timeout, and the rank, resumed, is placed on again. Then both ranks
freeze: ``/health`` answers 503, new requests are refused at once with a retryable 503 (no
client request tests a stalled rank), and those in flight end with 504 at the timeout. And
with ``--stall-fail-timeout 1.5`` and no request timeout: the frozen rank's streamed and
non-streamed requests end with a 503 saying to retry (an error event then ``[DONE]`` for the
streamed one), the I/O process's probe (never a client's request) finds the rank stepping
again, and it is placed on again. Every wait has a deadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.core_fixtures import free_port, wait_until_blocking
from support.serve_fixtures import ServeProcess, serving

from tsfront.sim import SimGroup

DEADLINE = 15.0
STALL_S = 1.0
TIMEOUT_S = 3.0
FAIL_S = 1.5


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


#: Polls with a deadline (the interval is not a synchronisation).
_wait = partial(wait_until_blocking, timeout=DEADLINE, interval=0.02)


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
    _wait(lambda: sum(_adds(group, i) for i in (0, 1)) > sum(before), "the ADD to reach a rank")
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
            lambda: (s := _states(url))[1][stuck] == "stalled" and s, "/health to report the stall"
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
    _wait(lambda: _requests_until_live(url, stuck), "the stall to clear")
    assert _metric(metrics, "tsfront:engine_stalled", stuck) == 0
    assert _metric(metrics, "tsfront:engine_stalls_total", stuck) == 1


def _requests_until_live(url: str, rank: int) -> bool:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 2}, timeout=5)
    assert r.status_code == 200
    return _states(url)[1][rank] == "live"


@pytest.fixture(scope="module")
def own_io(served) -> Iterator[tuple[str, SimGroup]]:
    """`tsfront serve` starting its own I/O process: ``--stall-timeout`` is the server's."""
    with serving(
        served[3],
        args=["--stall-timeout", str(STALL_S), "--request-timeout", str(TIMEOUT_S)],
        token_fn=token_fn,
    ) as s:
        yield s.url, s.group


def test_every_rank_stalled_answers_503_on_health_refuses_new_requests_and_504_after_the_timeout(
    own_io,
) -> None:
    url, group = own_io
    _wait(lambda: _states(url) == (200, ["live", "live"]), "both ranks live")
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
            lambda: (s := _states(url))[1] == ["stalled", "stalled"] and s, "both stalls"
        )
        assert status == 503
        # A new request (a streamed one too, before its first token) is refused at once with
        # a retryable 503: no client's request is what tests a stalled rank.
        t0 = time.monotonic()
        one("late", {**plain, "stream": True})
        assert time.monotonic() - t0 < TIMEOUT_S
        for t in threads:
            t.join(DEADLINE)
    finally:
        for rank in (0, 1):
            group.engine(rank).resume()
    for name in ("r0", "r1"):
        r = results[name]
        assert r.status_code == 504, (name, r.text)
        error = r.json()["error"]
        assert error["type"] == "timeout_error" and "not finished within 3 s" in error["message"]
    late = results["late"]
    assert late.status_code == 503 and late.headers["retry-after"]
    error = late.json()["error"]
    assert error["type"] == "service_unavailable_error"
    assert "stalled" in error["message"] and "retry" in error["message"]
    _wait(lambda: _states(url) == (200, ["live", "live"]), "the stalls to clear")


@pytest.fixture(scope="module")
def bounded(served) -> Iterator[tuple[str, SimGroup]]:
    """`tsfront serve` with its own I/O process, ``--stall-timeout 1 --stall-fail-timeout
    1.5`` and no request timeout."""
    with serving(
        served[3],
        args=["--stall-timeout", str(STALL_S), "--stall-fail-timeout", str(FAIL_S)],
        token_fn=token_fn,
    ) as s:
        yield s.url, s.group


class _Call:
    """One HTTP request on its own thread: its response (status, headers, SSE data lines or
    JSON body) and when it ended."""

    def __init__(self, url: str, body: dict) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.lines: list[str] = []
        self.body: dict = {}
        self.ended = 0.0
        self.closing = False
        self.client: httpx.Client
        self.started = threading.Event()  # the response began (streamed) or the request left
        self.thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self.thread.start()

    def _run(self, url: str, body: dict) -> None:
        with (
            httpx.Client(timeout=DEADLINE) as self.client,
            self.client.stream("POST", f"{url}/v1/completions", json=body) as r,
        ):
            self.status, self.headers = r.status_code, dict(r.headers)
            self.started.set()
            try:
                if body.get("stream"):
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            self.lines.append(line[6:])
                else:
                    self.body = json.loads(r.read())
            except httpx.HTTPError:
                if not self.closing:
                    raise
        self.ended = time.monotonic()

    def close(self) -> None:
        """Leave the response unread: the client closes its connection."""
        self.closing = True
        self.client.close()
        self.join(DEADLINE)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the request did not end"


def _client_rids(group: SimGroup, rank: int) -> list[str]:
    return [q.rid for q in group.engine(rank).requests() if not q.rid.startswith("tsfront-probe-")]


def test_a_silent_ranks_requests_end_with_a_retryable_503_and_the_probe_brings_it_back(
    bounded,
) -> None:
    url, group = bounded
    _wait(lambda: _states(url) == (200, ["live", "live"]), "both ranks live")
    long = {"prompt": "w5", "max_tokens": 20_000}
    # A streamed request on each rank (least in flight), then a non-streamed one; the rank the
    # non-streamed one landed on freezes, holding it and one streamed request.
    before = [_adds(group, i) for i in (0, 1)]
    first = _Call(url, {**long, "stream": True})
    first.started.wait(DEADLINE)
    first_rank = _rank_of(group, before)
    before = [_adds(group, i) for i in (0, 1)]
    second = _Call(url, {**long, "stream": True})
    second.started.wait(DEADLINE)
    assert _rank_of(group, before) == 1 - first_rank
    before = [_adds(group, i) for i in (0, 1)]
    whole = _Call(url, long)
    stuck = _rank_of(group, before)
    other = 1 - stuck
    streamed, healthy = (first, second) if first_rank == stuck else (second, first)
    _wait(lambda: streamed.lines and healthy.lines, "tokens on both streams")
    frozen = time.monotonic()
    group.engine(stuck).stall()
    status, states = _wait(
        lambda: (s := _states(url))[1][stuck] == "stalled" and s, "/health to report the stall"
    )
    assert status == 200 and states[other] == "live"
    # Within the bound, both of the frozen rank's requests end with a 503 that says to retry:
    # the streamed one with an error event and [DONE], the other with OpenAI's error object.
    streamed.join(STALL_S + FAIL_S + DEADLINE)
    whole.join(STALL_S + FAIL_S + DEADLINE)
    for call in (streamed, whole):
        assert STALL_S + FAIL_S - 0.05 <= call.ended - frozen < STALL_S + FAIL_S + 3.0
    assert streamed.status == 200 and streamed.lines[-1] == "[DONE]"
    event = json.loads(streamed.lines[-2])["error"]
    assert event["code"] == 503 and "stalled" in event["message"]
    assert "retry" in event["message"]
    assert whole.status == 503 and whole.headers["retry-after"]
    error = whole.body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["type"] == "service_unavailable_error"
    assert "stalled" in error["message"] and "retry" in error["message"]
    # The other rank's stream goes on; /health still says the frozen rank is stalled; new
    # requests all go to the other rank.
    seen = len(healthy.lines)
    _wait(lambda: len(healthy.lines) > seen, "the healthy stream to go on")
    assert healthy.thread.is_alive()
    assert _states(url)[1][stuck] == "stalled"
    results = [
        httpx.post(f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 2}, timeout=5)
        for _ in range(4)
    ]
    assert [r.status_code for r in results] == [200] * 4
    # Resumed: the probe of the I/O process (no client request is sent) finds it stepping.
    held = _client_rids(group, stuck)
    group.engine(stuck).resume()
    _wait(lambda: _states(url)[1][stuck] == "live", "the probe to clear the stall")
    assert _client_rids(group, stuck) == held  # only what it held before it froze
    assert len(group.engine(stuck).requests()) > len(held)  # and the probe
    assert set(group.engine(stuck).aborts()) >= set(held)  # aborted there
    # Placed on again.
    adds = _adds(group, stuck)
    _wait(lambda: _post_small(url) and _adds(group, stuck) > adds, "a request on the resumed rank")
    healthy.close()


def _post_small(url: str) -> bool:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 2}, timeout=5)
    assert r.status_code == 200
    return True


@pytest.mark.parametrize("flag", ["--stall-timeout", "--stall-fail-timeout"])
def test_stall_options_with_attach_are_refused_as_the_io_process_s(flag: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "serve", "--model", "unused", "--attach",
         "unix:@nothing", flag, "5"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"{flag} belongs to the I/O process" in out.stderr


@pytest.mark.parametrize("command", ["io", "generate"])
def test_the_stall_options_are_every_engine_commands_and_checked_there(command: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "tsfront", command, "--help"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert "--stall-timeout" in shown.stdout and "--stall-fail-timeout" in shown.stdout
    extra = ["--num-engines", "1"] + (["--input-ids", "1"] if command == "generate" else [])
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", command, "--handshake", "tcp://127.0.0.1:0",
         *extra, "--stall-fail-timeout", "-1"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert out.returncode == 2 and "--stall-fail-timeout=-1: must be >= 0" in out.stderr


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--request-timeout", "0", "must be > 0"),
        ("--stall-timeout", "-1", "must be >= 0"),
        ("--stall-fail-timeout", "-1", "must be >= 0"),
        ("--stall-fail-timeout", "nan", "must be >= 0"),
    ],
)
def test_bad_timeouts_are_usage_errors(flag: str, value: str, says: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "serve", "--model", "unused", "--handshake",
         "tcp://127.0.0.1:0", flag, value],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert out.returncode == 2 and says in out.stderr
