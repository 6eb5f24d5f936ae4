"""Running ``tsfront serve`` as a real process group for tests (shared by the serve tests).

`ServeProcess` starts the command in its own session, reads its stdout lines on a thread and
waits for a line with a deadline (stderr goes to a file if asked); `stop` sends SIGTERM, waits,
and kills whatever is left of the group. `serve_children` lists the live processes of the
group (to check nothing outlives the server).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ServeProcess:
    """A ``tsfront serve`` process (its own session) and its printed lines."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        stderr: Path | None = None,
        **popen: object,
    ) -> None:
        # ``stderr``: a file the server's stderr goes to; ``popen``: more `subprocess.Popen`
        # arguments (e.g. ``preexec_fn``).
        self.stderr_path = stderr
        err = None if stderr is None else stderr.open("wb")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tsfront", "serve", *args],
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, "TSFRONT_LOG": "ERROR", **(env or {})},
                start_new_session=True,
                **popen,  # type: ignore[call-overload]
            )
        finally:
            if err is not None:
                err.close()
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, pattern: str, timeout: float) -> re.Match:
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
        return serve_children(self.proc.pid)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``; kill the group if anything is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if code is None:
            self.proc.wait(5)
        return code


def serve_children(session: int) -> set[int]:
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
