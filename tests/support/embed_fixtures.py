"""Another server hosting tsfront's app, as a real process group for the embedding tests.

`spawn` starts a command in its own session (stdout piped for `read_line`, stderr dropped);
`stop` sends SIGTERM, waits, and checks nothing of the session is left (SIGKILL for what is);
`read_line` waits, with a deadline, for a line of stdout that starts with a prefix;
`wait_healthy` waits, with a deadline, for ``/health`` to answer 200; `uvicorn_command` is a
``uvicorn`` command line on 127.0.0.1; `io_and_ranks` runs ``tsfront io`` with two in-process
simulated ranks dialed in, for servers whose workers attach to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from tsfront.sim import SimGroup
from tsfront.testing.serve import serve_children

__all__ = [
    "DEADLINE",
    "io_and_ranks",
    "read_line",
    "spawn",
    "stop",
    "uvicorn_command",
    "wait_healthy",
]

DEADLINE = 60.0


def spawn(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen:
    """``cmd`` in a session of its own, with ``env`` over this process's (and TSFRONT_LOG=ERROR)."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, "TSFRONT_LOG": "ERROR", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen) -> int | None:
    """SIGTERM ``proc``; its exit code (None: it had to be killed). Fails if any process of
    its session is still there 10 s after it exits."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        code = None
    # What outlives the master must leave by itself soon after (a child still exiting is not
    # left behind); anything still there after the deadline is.
    deadline = time.monotonic() + 10
    while (left := serve_children(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(5)
    assert left == set(), f"processes left after SIGTERM: {left}"
    return code


def read_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The rest of the first line of ``proc``'s stdout that starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        while time.monotonic() < deadline:
            if not sel.select(deadline - time.monotonic()):
                continue
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
    raise TimeoutError(f"no line starting {prefix!r} (exit {proc.poll()})")


def wait_healthy(url: str) -> None:
    """Until ``url``'s /health answers 200 (TimeoutError after `DEADLINE`)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url}/health never answered 200")


def uvicorn_command(port: int, *args: str) -> list[str]:
    """``python -m uvicorn ARGS`` serving on 127.0.0.1:``port``, logging warnings only."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


@contextlib.contextmanager
def io_and_ranks(token_fn: Callable[[str, int], int]) -> Iterator[tuple[str, SimGroup]]:
    """``tsfront io`` (two engines) with two in-process `SimGroup` ranks dialed in, whose
    output token ``p`` of request ``rid`` is ``token_fn(rid, p)``: the I/O process's attach
    address and the ranks. Both are stopped on exit (the I/O process's session checked empty)."""
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
    group = None
    try:
        info = json.loads(read_line(io, "", DEADLINE))
        group = SimGroup(info["handshake_address"], 2, token_fn=token_fn).start()
        yield info["address"], group
    finally:
        stop(io)
        if group is not None:
            group.stop()
