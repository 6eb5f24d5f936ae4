"""``tsfront serve`` while its engines load, and how it stops at any moment of its start.

The port answers from the start (``/liveness`` 200; ``/readiness``, ``/health`` and the API
503 with ``Retry-After``), a line says every ``TSFRONT_SERVE_PROGRESS_S`` where the engines'
handshake stands, and the server serves once ranks that dial late have registered. A handshake
timeout, SIGTERM to the master and Ctrl-C to the whole process group at each moment of the
start-up are each an orderly end: one line, a documented exit status, no traceback. Real
servers (each a session of its own) against in-process simulated ranks; waits have deadlines.
About 40 s in all.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.core_fixtures import free_port, wait_until_blocking
from support.serve_fixtures import ServeProcess

from tsfront.process.child import python_module
from tsfront.sim import SimGroup

DEADLINE = 30.0
KEY = "sk-start"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


#: Polls with a deadline (the interval is not a synchronisation).
wait = partial(wait_until_blocking, timeout=DEADLINE, interval=0.05)


def get(url: str, **kwargs: Any) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5, **kwargs)
    except httpx.TransportError:
        return None


def kubernetes_probe_paths() -> dict[str, str]:
    """The probes of docs/SERVE.md's Kubernetes snippet: probe name -> path."""
    text = (ROOT / "docs" / "SERVE.md").read_text()
    snippet = text.split("### Kubernetes", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    return dict(re.findall(r"(\w+Probe):.*\n\s+httpGet: \{path: (/\w+)", snippet))


def test_the_port_answers_while_engines_register_late_then_serves(
    model_dir: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    err = tmp_path / "serve.stderr"
    server = ServeProcess(
        ["--model", model_dir, "--handshake", "tcp://127.0.0.1:0", "--num-engines", "2",
         "--workers", "2", "--port", str(port), "--api-key", KEY],
        env={"TSFRONT_SERVE_PROGRESS_S": "0.5"},
        stderr=err,
    )  # fmt: skip
    groups: list[SimGroup] = []
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        # No engine yet: the probes answer (without the key), the API says to come back.
        live = wait(lambda: get(f"{url}/liveness"), "/liveness")
        assert live.status_code == 200 and live.json()["live"] is True
        ready = get(f"{url}/readiness")
        assert ready is not None and ready.status_code == 503
        assert ready.headers["retry-after"] == "5"
        body = ready.json()
        assert body["ready"] is False and "0 of 2" in body["reason"]
        assert [e["state"] for e in body["engines"]] == ["absent", "absent"]
        health = get(f"{url}/health")
        assert health is not None and health.status_code == 503
        auth = {"Authorization": f"Bearer {KEY}"}
        for route in ("completions", "chat/completions"):
            answer = httpx.post(
                f"{url}/v1/{route}",
                json={"prompt": "w5", "messages": [{"role": "user", "content": "w5"}]},
                headers=auth,
                timeout=5,
            )
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "5"
            error = answer.json()["error"]
            assert error["type"] == "service_unavailable_error"
            assert "loading" in error["message"] and "/readiness" in error["message"]
        # Where the handshake stands, said on stderr while waiting.
        dial = f"they dial {handshake}"
        wait(lambda: "missing: rank 0 (engine 0), rank 1" in err.read_text(), "a progress line")
        assert dial in err.read_text() and "handshake once per start" in err.read_text()
        # Rank 0 dials: it is registered, rank 1 is still missing.
        groups.append(SimGroup(handshake, 1, 0, max_model_len=4096).start())
        wait(
            lambda: "registered: rank 0 (engine 0); missing: rank 1 (engine 1)" in err.read_text(),
            "rank 0 reported registered",
        )
        assert get(f"{url}/readiness").status_code == 503  # type: ignore[union-attr]
        # Rank 1 dials late: now it serves.
        groups.append(SimGroup(handshake, 1, 1, max_model_len=4096).start())
        assert server.wait_line(r"^listening: (http://\S+)", DEADLINE).group(1) == url
        ready = get(f"{url}/readiness")
        assert ready is not None and ready.status_code == 200 and ready.json()["ready"]
        reply = httpx.post(
            f"{url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 2},
            headers=auth,
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        # docs/SERVE.md's Kubernetes probes are these routes, and they answer without a key.
        probes = kubernetes_probe_paths()
        assert probes == {"livenessProbe": "/liveness", "readinessProbe": "/readiness"}
        for path in probes.values():
            assert get(f"{url}{path}").status_code == 200  # type: ignore[union-attr]
    finally:
        assert server.stop() == 0
        for group in groups:
            group.stop()
    assert "Traceback" not in err.read_text()


def run_serve(model: str, *args: str, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
    return subprocess.run(
        python_module("tsfront", "serve", "--model", model, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k != "TSFRONT_LOG"},
    )


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("tsfront: error:")]


def test_a_handshake_timeout_is_one_line_and_exit_1(model_dir: str) -> None:
    # Long enough for the workers to attach first (as with any real timeout): the I/O process
    # then leaves the report to them (logged as an error only when nobody is attached).
    done = run_serve(
        model_dir, "--handshake", "tcp://127.0.0.1:0", "--handshake-timeout", "6",
        "--port", "0", "--workers", "2",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = error_lines(done.stderr)
    assert "did not register within handshake_timeout=6.0s" in line, line
    assert "--zmq-engine-index 0" in line and "handshake once per start" in line
    # Every other line is the command's own progress, not a worker's or a process's report.
    others = [x for x in done.stderr.splitlines() if x != line]
    assert all(x.startswith("tsfront serve: ") for x in others), others


# The moments of a start-up, each the line printed just before the signal is sent (None: at
# once, while the command imports).
MOMENTS = {
    "at-once": None,
    "io-started": r"I/O process \d+",
    "store-started": r"responses store process",
    "workers-answer": r"answers: /liveness",
}


@pytest.mark.parametrize("how", ["sigterm-master", "ctrl-c-group"])
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_stop_at_any_moment_of_start_up_is_orderly(
    model_dir: str, tmp_path: Path, moment: str, how: str
) -> None:
    err = tmp_path / "serve.stderr"
    server = ServeProcess(
        ["--model", model_dir, "--handshake", "tcp://127.0.0.1:0", "--port", "0",
         "--workers", "2"],
        env={"TSFRONT_LOG": ""},
        stderr=err,
    )  # fmt: skip
    try:
        pattern = MOMENTS[moment]
        if pattern is not None:
            wait(lambda: re.search(pattern, err.read_text()), pattern)
        if how == "sigterm-master":
            server.proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(server.proc.pid, signal.SIGINT)
        code = server.proc.wait(DEADLINE)
    finally:
        server.stop()
    stderr = err.read_text()
    if moment == "at-once" and _interrupted_in_pythons_own_start(stderr):
        # Ctrl-C after CPython installed its handler but before it finished its own start
        # (its standard streams): CPython reports that itself, before any line of tsfront
        # runs; nothing of the server started. (Seen on a loaded machine.)
        assert wait(lambda: not server.group_pids(), "the session to end")
        return
    assert "Traceback" not in stderr, stderr
    if moment == "at-once":
        # Python still starting: the signal's default action (silent), or, once the command
        # runs, Ctrl-C's one line and 130.
        expected = (-signal.SIGTERM, 0) if how == "sigterm-master" else (-signal.SIGINT, 130, 0)
        assert code in expected, (code, stderr)
        if code == 130:
            assert error_lines(stderr) == ["tsfront: error: interrupted"]
    else:
        assert code == 0, stderr
        assert error_lines(stderr) == []
        assert "stopping" in stderr.splitlines()[-1], stderr
    assert wait(lambda: not server.group_pids(), "the session to end")


def _interrupted_in_pythons_own_start(stderr: str) -> bool:
    lines = stderr.strip().splitlines()
    return (
        bool(lines)
        and lines[0].startswith("Fatal Python error: init_")
        and (lines[-1] == "KeyboardInterrupt")
    )
