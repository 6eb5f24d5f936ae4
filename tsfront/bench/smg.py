"""The SMG gateway (PyPI ``tokenspeed-smg``) as a baseline: finding it and its command line.

The benchmarks that compare against SMG (``tsfront bench serve``, ``tsfront bench routing``)
launch it the same way (see ``../shared/anchors/SMG.md``): bound for N engine ranks over
TokenSpeed's ZMQ wire, with a Prometheus port of its own (its default, 29000, collides
between runs), its ranks dialling the handshake port it derives from its worker URL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
from pathlib import Path

__all__ = ["add_arguments", "find_smg", "free_port", "handshake_port", "launch_command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--smg`` / ``--no-smg``, shared by every suite that compares against SMG."""
    g = parser.add_argument_group("SMG baseline (bench serve, bench routing)")
    g.add_argument("--smg", help="the smg executable (default: .smg-venv/bin/smg, then PATH)")
    g.add_argument("--no-smg", action="store_true", help="do not run SMG")


def find_smg(explicit: str | None) -> str | None:
    """The ``smg`` executable: ``explicit``, else ``.smg-venv/bin/smg`` here, else PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    local = Path.cwd() / ".smg-venv" / "bin" / "smg"
    if os.access(local, os.X_OK):
        return str(local)
    return shutil.which("smg")


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def handshake_port(smg: str, worker_url: str) -> int:
    """The handshake port SMG binds for ``worker_url`` (its engines must dial it), asked of
    SMG's own code in its venv."""
    python = str(Path(smg).with_name("python"))
    code = "from smg.serve import _zmq_handshake_port as f; import sys; print(f(sys.argv[1]))"
    return int(subprocess.check_output([python, "-c", code, worker_url], text=True))


def launch_command(
    smg: str,
    *,
    port: int,
    worker_url: str,
    model_dir: str,
    engines: int,
    policy: str | None = None,
    log_level: str = "warn",
) -> list[str]:
    """``smg launch`` serving HTTP on ``port`` for ``engines`` TokenSpeed ranks."""
    command = [
        smg,
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(free_port()),
        "--worker-urls",
        worker_url,
        "--backend",
        "tokenspeed",
        "--model-path",
        model_dir,
        "--zmq-engine-count",
        str(engines),
    ]
    if policy is not None:
        command += ["--policy", policy]
    return [*command, "--log-level", log_level]
