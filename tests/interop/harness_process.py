"""Starting and stopping the harness subprocess (used by conftest and by tests directly)."""

from __future__ import annotations

import json
import selectors
import subprocess
import time
from pathlib import Path
from typing import Any

HARNESS = Path(__file__).resolve().parent / "harness.py"
READY_LINE = "HARNESS READY"


class Harness:
    """A running harness subprocess and its JSON-lines log."""

    def __init__(self, proc: subprocess.Popen[str], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """Log records so far (optionally only one ``event`` kind)."""
        if not self.log_path.exists():
            return []
        records = [json.loads(line) for line in self.log_path.read_text().splitlines() if line]
        return [r for r in records if event is None or r["event"] == event]

    def stop(self, timeout_s: float = 5.0) -> int:
        """SIGTERM, then reap; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def _wait_for_line(proc: subprocess.Popen[str], line: str, timeout_s: float) -> None:
    """Block until ``proc`` prints ``line`` on stdout (deadline, not sleep)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                raise TimeoutError(f"harness did not print {line!r} within {timeout_s} s")
            got = proc.stdout.readline()
            if not got:
                raise RuntimeError(f"harness exited (rc={proc.wait()}) before {line!r}")
            if got.strip() == line:
                return


def spawn_harness(
    python: Path, handshake: str, log_path: Path, num_engines: int, first_index: int, *extra: str
) -> Harness:
    """Start the harness and wait for its ``HARNESS READY`` line."""
    cmd = [
        str(python),
        str(HARNESS),
        "--handshake",
        handshake,
        "--num-engines",
        str(num_engines),
        "--first-engine-index",
        str(first_index),
        "--log",
        str(log_path),
        *extra,
    ]
    harness = Harness(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True), log_path)
    try:
        _wait_for_line(harness.proc, READY_LINE, timeout_s=30.0)
    except BaseException:
        harness.stop()
        raise
    return harness
