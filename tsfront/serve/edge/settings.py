"""The HTTP edge's settings: ``tsfront serve``'s flags for it, and a worker's setup from them.

`add_edge_arguments` adds the flags (timeouts, header size, connection cap, API keys, CORS,
access log, log level and format); `edge_settings` turns the parsed ones into `EdgeSettings`
(picklable: it crosses the spawn in `tsfront.serve.processes.worker.WorkerOptions`);
`raise_fd_limit`, `connection_cap` and `configure_logging` are what a worker does with them at start
(`tsfront.serve.processes.worker` builds the protocol class and the gate from them, so this module
imports neither).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import time
from dataclasses import dataclass

import msgspec

__all__ = [
    "FD_RESERVE",
    "EdgeSettings",
    "add_edge_arguments",
    "configure_logging",
    "connection_cap",
    "edge_settings",
    "raise_fd_limit",
]

#: File descriptors of a worker kept out of the connection cap (the I/O process's sockets,
#: the shared memory, the listening socket, logs, the model's files).
FD_RESERVE = 64
_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class EdgeSettings:
    """The HTTP edge of every worker (the defaults are the flags')."""

    timeout_header: float = 10.0
    timeout_body: float = 60.0
    timeout_keep_alive: float = 5.0
    max_header_bytes: int = 65536
    max_connections: int = 8192
    api_keys: tuple[str, ...] = ()
    protect_metrics: bool = False
    allowed_origins: tuple[str, ...] = ()
    access_log: bool = False
    log_level: str = "warning"
    log_format: str = "text"


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the HTTP edge's flags to ``tsfront serve``'s ``parser``."""
    d = EdgeSettings()
    edge = parser.add_argument_group("HTTP edge (limits against slow and hostile clients)")
    edge.add_argument(
        "--timeout-header",
        type=float,
        default=d.timeout_header,
        metavar="S",
        help="seconds a connection has to send a request's complete headers, from its accept "
        f"or its previous response's end; then it is closed ({d.timeout_header:g})",
    )
    edge.add_argument(
        "--timeout-body",
        type=float,
        default=d.timeout_body,
        metavar="S",
        help="seconds a request body may take to arrive after its headers; then 408 and the "
        f"connection is closed ({d.timeout_body:g})",
    )
    edge.add_argument(
        "--timeout-keep-alive",
        type=float,
        default=d.timeout_keep_alive,
        metavar="S",
        help="seconds an idle keep-alive connection stays open after a response "
        f"({d.timeout_keep_alive:g})",
    )
    edge.add_argument(
        "--max-header-bytes",
        type=int,
        default=d.max_header_bytes,
        metavar="N",
        help="largest request line + headers in bytes; more is answered 431 "
        f"({d.max_header_bytes})",
    )
    edge.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="open connections per worker (at most the fd limit minus a reserve); past it a new "
        "connection replaces the oldest idle one, or is closed if none is idle "
        f"({d.max_connections})",
    )
    edge.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/* (repeatable; also TSFRONT_API_KEY, "
        "comma-separated); default: no auth",
    )
    edge.add_argument(
        "--protect-metrics",
        action="store_true",
        help="require the API key on /metrics too (/health stays open for probes)",
    )
    edge.add_argument(
        "--allowed-origins",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="CORS: an origin browsers may call from, e.g. https://app.example.com, or * "
        "(repeatable); default: no CORS headers",
    )
    edge.add_argument(
        "--access-log",
        action="store_true",
        help="one line per request on stdout: request id, method, route, status, tokens, TTFT, "
        "duration, finish reason (off)",
    )
    edge.add_argument(
        "--log-level",
        default=d.log_level,
        choices=_LEVELS,
        help=f"level of the workers' logs on stderr ({d.log_level})",
    )
    edge.add_argument(
        "--log-format",
        default=d.log_format,
        choices=("text", "json"),
        help="text, or JSON lines (the access log and the workers' logs)",
    )


def edge_settings(args: argparse.Namespace) -> EdgeSettings:
    """`EdgeSettings` from parsed flags; raises ValueError naming a bad one."""
    for name in ("timeout_header", "timeout_body", "timeout_keep_alive"):
        value = getattr(args, name)
        if not 0 < value <= 86400:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag}={value:g}: must be a number of seconds in (0, 86400]")
    if not 1024 <= args.max_header_bytes <= 1 << 24:
        raise ValueError(f"--max-header-bytes={args.max_header_bytes}: must be 1024..16777216")
    if args.max_connections < 1:
        raise ValueError(f"--max-connections={args.max_connections}: must be at least 1")
    keys = list(args.api_key or ())
    keys.extend(k.strip() for k in os.environ.get("TSFRONT_API_KEY", "").split(",") if k.strip())
    for key in keys:
        if not key or any(c.isspace() for c in key) or not key.isascii():
            raise ValueError("--api-key: a key is printable ASCII without spaces")
    origins = tuple(args.allowed_origins or ())
    for origin in origins:
        if origin != "*" and ("://" not in origin or origin.endswith("/")):
            raise ValueError(
                f"--allowed-origins {origin}: an origin is * or scheme://host[:port] (no path)"
            )
    return EdgeSettings(
        timeout_header=args.timeout_header,
        timeout_body=args.timeout_body,
        timeout_keep_alive=args.timeout_keep_alive,
        max_header_bytes=args.max_header_bytes,
        max_connections=args.max_connections,
        api_keys=tuple(dict.fromkeys(keys)),
        protect_metrics=args.protect_metrics,
        allowed_origins=origins,
        access_log=args.access_log,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's fd soft limit to its hard limit; returns the (soft, hard) now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            # An unlimited hard limit is capped by the kernel's nr_open.
            target = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def connection_cap(max_connections: int, soft_fd_limit: int) -> int:
    """The connection cap a worker applies: ``--max-connections``, kept below its fd limit."""
    if soft_fd_limit == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft_fd_limit - FD_RESERVE))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "time": time.time() if record.created is None else record.created,
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(body).decode()


def configure_logging(settings: EdgeSettings) -> None:
    json_lines = settings.log_format == "json"
    base = logging.getLogger("tsfront")
    if not base.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            _JsonFormatter()
            if json_lines
            else logging.Formatter("tsfront[%(process)d] %(name)s %(levelname)s %(message)s")
        )
        base.addHandler(handler)
    base.setLevel(settings.log_level.upper())
    access = logging.getLogger("tsfront.serve.access")
    access.propagate = False
    access.handlers.clear()
    if settings.access_log:
        out = logging.StreamHandler(sys.stdout)
        out.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(out)
        access.setLevel(logging.INFO)
    else:
        access.setLevel(logging.CRITICAL + 1)
