"""ZMQ endpoints: binding with port 0, per-engine output endpoints, what to advertise.

An engine must be told an address it can ``connect()`` to, so a wildcard bind (``*`` or
``0.0.0.0``) is advertised with the handshake address's host when that is concrete, else as
loopback.
"""

from __future__ import annotations

import zmq

from tsfront.errors import ConfigError

_WILDCARDS = {"*", "0.0.0.0", "::", "[::]"}


def split_tcp(address: str) -> tuple[str, str]:
    """``tcp://host:port`` → ``(host, port)``."""
    rest = address[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{address!r} is not 'tcp://HOST:PORT'")
    return host, port


def output_address_for(base: str, row: int) -> str:
    """The output endpoint of engine ``row``: its own port (or ipc path) derived from ``base``."""
    if base.startswith("tcp://"):
        host, port = split_tcp(base)
        if port in ("0", "*"):
            return base
        if not port.isdigit() or int(port) + row > 65535:
            raise ConfigError(f"output_address {base!r}: port {port}+{row} is not a valid port")
        return f"tcp://{host}:{int(port) + row}"
    if base.startswith("ipc://"):
        return base if row == 0 else f"{base}.{row}"
    raise ConfigError(f"output_address {base!r}: use tcp:// or ipc://")


def bind_socket(sock: zmq.Socket, address: str) -> str:
    """Bind, and return the endpoint actually bound (port 0 resolved)."""
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        raise ConfigError(f"cannot bind {address!r}: {exc}") from None
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def advertised(bound: str, handshake_address: str) -> str:
    """The endpoint to put in INIT for a socket bound at ``bound``."""
    if not bound.startswith("tcp://"):
        return bound
    host, port = split_tcp(bound)
    if host in _WILDCARDS:
        hs_host, _ = split_tcp(handshake_address)
        host = hs_host if hs_host not in _WILDCARDS else "127.0.0.1"
    return f"tcp://{host}:{port}"
