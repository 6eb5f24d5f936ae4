"""``tsfront serve --state-dir``: the server recovers from a SIGKILLed I/O process by itself.

A server (master, I/O process, two workers) on fixed engine addresses with a state directory,
against two in-process simulated ranks. Its I/O process is SIGKILLed while a stream is open:
that stream ends (it never hangs), the master starts a new I/O process that takes the same
ranks over (no handshake: the sim ranks never handshake twice, so a served request proves
it), the same worker processes attach to it, and completions are served again; the request
that was in flight is aborted on its engine. A stop on purpose then forgets the engines.
About 10 s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from functools import partial

import httpx
import pytest
from support.core_fixtures import free_port, wait_until_blocking
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


def _pids(server: ServeProcess, marker: bytes) -> set[int]:
    """The server's processes whose command line holds ``marker``."""
    found = set()
    for pid in server.group_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    found.add(pid)
        except OSError:
            continue
    return found


def _io_pid(server: ServeProcess) -> int:
    (pid,) = _pids(server, b"tsfront: io")  # its title (tsfront.process.title)
    return pid


#: Polls with a deadline (the interval is not a synchronisation).
_wait = partial(wait_until_blocking, timeout=DEADLINE, interval=0.01)


def _complete(url: str) -> httpx.Response | None:
    """A completion's response if it succeeded; None while the server is not back (the old
    workers answer 503 until they stop, then nobody listens until the new ones do)."""
    try:
        response = httpx.post(
            f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 3}, timeout=DEADLINE
        )
    except httpx.TransportError:
        return None
    if response.status_code == 503:
        return None
    return response


def test_serve_recovers_from_a_sigkilled_io_process(model_dir: str, tmp_path) -> None:
    state = tmp_path / "state"
    private = f"ipc://@tsfront-serve-{secrets.token_hex(8)}"
    handshake = f"tcp://127.0.0.1:{free_port()}"
    server = ServeProcess(
        ["--model", model_dir, "--handshake", handshake, "--num-engines", "2",
         "--input-address", f"{private}-in", "--output-address", f"{private}-out",
         "--state-dir", str(state), "--workers", "2", "--port", "0",
         "--handshake-timeout", "30"]
    )  # fmt: skip
    group = SimGroup(handshake, 2, token_fn=token_fn, max_model_len=4096).start()
    try:
        url = server.wait_line(r"^listening: (http://\S+)", 60).group(1)
        assert _complete(url).status_code == 200
        old_io = _io_pid(server)
        workers = _pids(server, b"tsfront: worker ")
        assert len(workers) == 2
        threads = list(group.engines)
        aborts = sum(c["aborts"] for c in group.counters().values())
        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 3000, "stream": True},
            timeout=DEADLINE,
        ) as response:
            lines = (line for line in response.iter_lines() if line.startswith("data: "))
            assert json.loads(next(lines)[6:])["choices"][0]["text"].startswith(" w100")
            t0 = time.monotonic()
            os.kill(old_io, signal.SIGKILL)
            with pytest.raises((httpx.TransportError, StopIteration)):  # ends, never hangs
                for line in lines:
                    if line == "data: [DONE]":
                        raise StopIteration
        served = _wait(lambda: _complete(url), "a completion served again")
        took = time.monotonic() - t0
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["text"] == "".join(f" w{FIRST + p}" for p in range(3))
        print(f"\nI/O process SIGKILLed -> served again after {took:.2f}s")
        new_io = _io_pid(server)
        assert new_io != old_io and server.proc.poll() is None
        # The same worker processes, attached to the new I/O process in place.
        assert _pids(server, b"tsfront: worker ") == workers
        # The same rank threads, never restarted (a sim rank handshakes once in its life).
        assert group.engines == threads and all(group.threads_alive())
        # The stream that was open is aborted on its engine (an orphan of the old process).
        _wait(
            lambda: sum(c["aborts"] for c in group.counters().values()) > aborts,
            "the orphan aborted",
        )
        assert sorted(p.name for p in state.glob("engine-*.json")) == [
            "engine-0.json",
            "engine-1.json",
        ]
        assert server.stop() == 0
        assert list(state.glob("engine-*.json")) == []  # a stop on purpose forgets them
    finally:
        server.stop()
        group.stop()
