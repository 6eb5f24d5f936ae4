"""A running ``tsfront serve`` for tests: the command in a session of its own, and its ranks.

`ServeProcess` starts the command (``python -m tsfront serve ARGS``) in its own session,
reads its stdout lines on a thread and waits for a line with a deadline (stderr goes to a
file if asked); `ServeProcess.stop` sends SIGTERM, waits, and kills whatever is left of the
session. `session_pids` lists the live processes of a session (to check nothing outlives the
server). `start_served` is the whole rig: a model folder, the server with a bound handshake
port, and simulated ranks (a `SimGroup` of this process) dialing it; `Served.close` stops both
and reports what was still alive.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tsfront.process.child import python_module
from tsfront.sim import SimGroup

__all__ = ["ServeProcess", "Served", "serve_children", "session_pids", "start_served"]


class ServeProcess:
    """A ``tsfront serve`` process (its own session) and its printed lines.

    ``stderr``: a file the server's stderr goes to; ``popen``: more `subprocess.Popen`
    arguments (e.g. ``preexec_fn``). ``TSFRONT_LOG`` is ``ERROR`` unless ``env`` says
    otherwise.
    """

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        stderr: Path | None = None,
        **popen: Any,
    ) -> None:
        self.stderr_path = stderr
        err = None if stderr is None else stderr.open("wb")
        try:
            self.proc = subprocess.Popen(
                python_module("tsfront", "serve", *args),
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, "TSFRONT_LOG": "ERROR", **(env or {})},
                start_new_session=True,
                **popen,
            )
        finally:
            if err is not None:
                err.close()
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None  # started with stdout=PIPE
        for raw in stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first printed line matching ``pattern``; raises after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"tsfront serve printed no line matching {pattern!r}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"tsfront serve exited ({self.proc.wait()}) before {pattern!r}")
            match = re.search(pattern, line)
            if match:
                return match

    def stderr(self) -> str:
        """What the server wrote to stderr so far (when started with ``stderr=``)."""
        return "" if self.stderr_path is None else self.stderr_path.read_text()

    def group_pids(self) -> set[int]:
        """Live processes of the server's session (master, I/O process, workers)."""
        return session_pids(self.proc.pid)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``; kill the session if anything is left. Returns the
        server's exit code (``None``: it did not exit in time and was killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if code is None:
            self.proc.wait(5)
        return code


def session_pids(session: int) -> set[int]:
    """Pids of live (not zombie) processes whose session id is ``session``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session:
            found.add(int(entry))
    return found


#: The name tsfront's own tests know `session_pids` by.
serve_children = session_pids


@dataclass
class Served:
    """A running server (`ServeProcess`), the simulated ranks it serves, and its URL."""

    server: ServeProcess
    group: SimGroup
    url: str
    model: str

    def close(self, timeout: float = 15.0) -> tuple[int | None, set[int]]:
        """Stop the server, then its ranks; ``(exit code, pids of its session still alive)``
        (the set is empty when nothing outlived it)."""
        try:
            code = self.server.stop(timeout)
        finally:
            self.group.stop()
        return code, self.server.group_pids()


def start_served(
    model: str | os.PathLike[str],
    *,
    workers: int = 1,
    ranks: int = 2,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    stderr: Path | None = None,
    timeout: float = 60.0,
    **sim_options: Any,
) -> Served:
    """``tsfront serve --model MODEL`` on a free port with ``workers`` HTTP workers, and
    ``ranks`` simulated ranks (`SimGroup` threads of this process; ``sim_options`` are
    `EngineOptions` fields) dialing its handshake. ``args`` are more ``tsfront serve``
    arguments. Returns once the server prints its URL; stops everything it started if it does
    not within ``timeout``."""
    server = ServeProcess(
        [
            "--model",
            str(model),
            "--handshake",
            "tcp://127.0.0.1:0",
            "--num-engines",
            str(ranks),
            "--workers",
            str(workers),
            "--port",
            "0",
            "--handshake-timeout",
            str(timeout),
            *args,
        ],
        env=env,
        stderr=stderr,
    )
    group = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", timeout).group(1)
        group = SimGroup(handshake, ranks, **sim_options).start()
        url = server.wait_line(r"^listening: (http://\S+)", timeout).group(1)
    except BaseException:
        server.stop()
        if group is not None:
            group.stop()
        raise
    return Served(server, group, url, str(model))
