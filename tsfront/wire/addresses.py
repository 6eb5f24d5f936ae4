"""ZMQ endpoints: checking them, binding with port 0, per-engine outputs, what to advertise.

`check_endpoint` is the one place an address is judged: `ClientConfig`, `tsfront.sim` and every
``tsfront`` command call it, so a bad address is the same one-line `ConfigError` everywhere
(never a ``ZMQError: Invalid argument`` from deep inside a bind).

An engine must be told an address it can ``connect()`` to, so a wildcard bind (``*`` or
``0.0.0.0``) is advertised with the handshake address's host when that is concrete, else as
loopback.
"""

from __future__ import annotations

import zmq

from tsfront.errors import ConfigError

_WILDCARDS = {"*", "0.0.0.0", "::", "[::]"}

ENDPOINT_FORMS = "tcp://HOST:PORT (PORT 0-65535; 0 picks a free port) or ipc://PATH"
"""The accepted address forms, as every error about an address states them."""

MAX_PORT = 65535


def check_endpoint(value: object, name: str, *, tcp_only: bool = False) -> str:
    """Return ``value`` if it is an endpoint tsfront can bind or dial, else raise `ConfigError`.

    Accepted: ``tcp://HOST:PORT`` with a port in 0..65535 (``*`` as port is ZMQ's "any"), and,
    unless ``tcp_only``, ``ipc://PATH``. ``name`` is how the caller calls the address (a field
    or an option); the message names it, the value and the accepted forms.
    """
    forms = "tcp://HOST:PORT (PORT 0-65535; 0 picks a free port)" if tcp_only else ENDPOINT_FORMS

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{name}={value!r}: {why}; use {forms}")

    if not isinstance(value, str) or not value:
        raise bad("not an address")
    if value.startswith("tcp://"):
        host, sep, port = value[len("tcp://") :].rpartition(":")
        if not sep or not host:
            raise bad("missing HOST or :PORT")
        if port == "*":
            return value
        if not port.isdigit() or not 0 <= int(port) <= MAX_PORT:
            raise bad(f"port {port!r} is not in 0-{MAX_PORT}")
        return value
    if value.startswith("ipc://"):
        if tcp_only:
            raise bad("TokenSpeed engines dial this address over TCP")
        if not value[len("ipc://") :]:
            raise bad("missing PATH")
        return value
    if "://" in value:
        raise bad(f"unknown scheme {value.split('://', 1)[0]}://")
    raise bad("missing the tcp:// scheme" if tcp_only else "missing the tcp:// or ipc:// scheme")


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
