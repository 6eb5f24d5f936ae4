"""`IOProcess`: start, address and stop the I/O process from the server's master.

This runs in the process that starts the I/O process (a server's master, a command, a test),
never inside it: what runs inside is `tsfront.io`.

The I/O process is a child (``python -m tsfront.io.main``) so it has its own interpreter and
GIL; it is bound to its parent's life by PR_SET_PDEATHSIG, so it never outlives the process
that started it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import selectors
import signal
import subprocess
import time

from tsfront.config import ClientConfig
from tsfront.errors import ConfigError, Error, StateDirInUse, StateDirMismatch
from tsfront.process.child import python_module
from tsfront.process.sigint import hold_sigint

START_TIMEOUT = 30.0
_START_REFUSALS: dict[str, type[ConfigError]] = {
    "StateDirMismatch": StateDirMismatch,
    "StateDirInUse": StateDirInUse,
}

log = logging.getLogger("tsfront.io.process")  # the name the logs have always carried


class IOProcess:
    """A running I/O process.

    Attributes:
        address: where workers attach (`EngineClient.attach(address)`), a string.
        handshake_address: the bound handshake endpoint (port resolved).
        input_address: the input endpoint advertised to engines.
        output_addresses: each engine's output endpoint, by rank.
        prefill: under `Routing.disaggregated`, the prefill group's bound addresses (a dict
            with ``handshake_address``, ``input_address``, ``output_addresses``); the fields
            above are the decode group's. ``None`` otherwise.
        pid: the process id.
    """

    def __init__(self, proc: subprocess.Popen, info: dict) -> None:
        self._proc = proc
        self.address: str = info["address"]
        self.handshake_address: str = info["handshake_address"]
        self.input_address: str = info["input_address"]
        self.output_addresses: list[str] = list(info["output_addresses"])
        self.prefill: dict | None = info.get("prefill")
        self.pid: int = proc.pid

    @classmethod
    def start(cls, config: ClientConfig, *, timeout: float = START_TIMEOUT) -> IOProcess:
        """Start an I/O process; return once its sockets are bound.

        Raises `ConfigError` if an address cannot be bound (`StateDirMismatch` or
        `StateDirInUse` if ``config.state_dir`` cannot be used), `Error` if the process fails
        to start within ``timeout`` seconds.
        """
        if not isinstance(config, ClientConfig):
            raise ConfigError(f"IOProcess.start takes a ClientConfig, got {type(config).__name__}")
        token = f"{os.getpid()}-{secrets.token_hex(6)}"
        hold = hold_sigint()
        try:
            proc = subprocess.Popen(
                python_module("tsfront.io.main"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
        except BaseException:
            hold.release()
            raise
        try:
            # A Ctrl-C that came while SIGINT was held is raised here; the child is reaped.
            hold.release()
            assert proc.stdin is not None  # stdin=subprocess.PIPE
            proc.stdin.write(json.dumps({"config": config.to_dict(), "token": token}).encode())
            proc.stdin.write(b"\n")
            proc.stdin.close()
            line = _read_line(proc, timeout)
        except BaseException:
            _reap(proc)
            raise
        info = json.loads(line) if line else {"error": "the I/O process exited at start"}
        if "error" in info:
            try:
                proc.wait(timeout)  # it exits by itself after reporting
            except subprocess.TimeoutExpired:
                pass
            _reap(proc)
            # A refusal keeps its type (e.g. StateDirMismatch), so a caller can tell it apart.
            kind = _START_REFUSALS.get(info.get("kind", ""), ConfigError)
            raise kind(f"I/O process could not start: {info['error']}")
        log.info(
            "I/O process %d started: engines dial %s, workers attach at %s",
            proc.pid,
            info["handshake_address"],
            info["address"],
        )
        return cls(proc, info)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._proc.poll() is None

    def stop(self, timeout: float = 5.0, *, handover: bool = False) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``timeout``); idempotent.

        Its open streams end (`IOProcessDied` in the workers, ABORTs to the engines). A stop
        forgets the engines' registrations in ``state_dir``; with ``handover`` (SIGUSR1 instead
        of SIGTERM) they are kept, so that a new I/O process started with the same config
        takes the running engines over (an upgrade).
        """
        if self._proc.returncode is None:
            log.info("stopping I/O process %d%s", self.pid, " (handover)" if handover else "")
        _reap(self._proc, timeout, signal.SIGUSR1 if handover else signal.SIGTERM)

    def __enter__(self) -> IOProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"IOProcess(pid={self.pid}, address={self.address!r})"


def _read_line(proc: subprocess.Popen, timeout: float) -> bytes:
    assert proc.stdout is not None  # started with stdout=subprocess.PIPE
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Error(f"the I/O process did not report its addresses within {timeout}s")
            if not sel.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
    return buf.split(b"\n", 1)[0]


def _reap(proc: subprocess.Popen, timeout: float = 5.0, signum: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signum)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
