"""The engine-group options every command that runs an I/O process shares, and their checks.

`add_engine_arguments` declares them (``--handshake``, ``--num-engines``,
``--first-engine-index``, ``--handshake-timeout``, ``--input-address``, ``--output-address``,
``--load-balance``, ``--stall-timeout``, ``--stall-fail-timeout``); every address is judged
while the command line is parsed, by `tsfront.wire.addresses.check_endpoint` (through
`endpoint`), so a malformed one is a usage error (exit 2) before anything loads or binds.
`config_from_args` turns them into a `ClientConfig` (a stall option's 0 is None, "never"),
naming the option (not the config field) in what `ClientConfig` refuses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tsfront.commands.base import UsageError
from tsfront.config import ClientConfig, LoadBalance, Routing
from tsfront.errors import ConfigError
from tsfront.wire.addresses import check_endpoint

__all__ = ["HANDSHAKE_TIMEOUT_S", "add_engine_arguments", "config_from_args", "endpoint"]

#: ``--handshake-timeout``'s default in every command that waits for engines (``generate``,
#: ``io``, ``serve``; ``sim`` waits as long for INIT): loading a real model takes minutes.
HANDSHAKE_TIMEOUT_S = 600.0

#: The ClientConfig fields the engine options set, by option dest.
_FIELDS = {
    "handshake": "handshake_address",
    "input_address": "input_address",
    "output_address": "output_address",
    "num_engines": "num_engines",
    "first_engine_index": "first_engine_index",
    "handshake_timeout": "handshake_timeout",
}
#: Those whose 0 on the command line is the config's None ("never").
_ZERO_IS_NEVER = {
    "stall_timeout": "stall_timeout",
    "stall_fail_timeout": "stall_fail_timeout",
}


def endpoint(*, tcp_only: bool = False) -> Callable[[str], str]:
    """An argparse ``type=`` that accepts only what `check_endpoint` accepts (one-line error)."""

    def parse(text: str) -> str:
        try:
            return check_endpoint(text, "address", tcp_only=tcp_only)
        except ConfigError as exc:
            # argparse prefixes "argument --handshake: "; drop our own "address=...: " prefix.
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None

    parse.__name__ = "address"
    return parse


def add_engine_arguments(
    parser: argparse.ArgumentParser,
    *,
    handshake_timeout: float,
    num_engines: int | None = None,
    handshake_in: Any = None,
    load_balance: bool = True,
) -> Any:
    """Add the options that describe the engine group and the frontend's sockets.

    ``num_engines`` is the default of ``--num-engines`` (None: required). ``handshake_in`` is
    where ``--handshake`` goes instead of the group (a mutually exclusive group, as
    ``tsfront serve``'s with ``--attach``; it is then not required by itself). Returns the
    group, for a command's own engine options.
    """
    group = parser.add_argument_group("engine group")
    (handshake_in or group).add_argument(
        "--handshake",
        required=handshake_in is None,
        type=endpoint(tcp_only=True),
        metavar="ADDR",
        help="handshake endpoint to BIND, which the engines dial (TokenSpeed's "
        "--data-parallel-address/--data-parallel-rpc-port), e.g. tcp://127.0.0.1:30500; "
        "port 0 picks a free port (the bound address is printed)",
    )
    group.add_argument(
        "--num-engines",
        type=int,
        required=num_engines is None,
        default=num_engines,
        metavar="N",
        help="number of attention-DP ranks expected (--data-parallel-size)"
        + ("" if num_engines is None else f"; default {num_engines}"),
    )
    group.add_argument(
        "--first-engine-index",
        type=int,
        default=0,
        metavar="K",
        help="identity of rank 0 (the engines' --zmq-engine-index); default 0",
    )
    group.add_argument(
        "--handshake-timeout",
        type=float,
        default=handshake_timeout,
        metavar="S",
        help=f"seconds for every engine to register; default {handshake_timeout:g}",
    )
    group.add_argument(
        "--input-address",
        default="tcp://127.0.0.1:0",
        type=endpoint(),
        metavar="ADDR",
        help="endpoint of the input ROUTER the engines connect to; default tcp://127.0.0.1:0",
    )
    group.add_argument(
        "--output-address",
        default="tcp://127.0.0.1:0",
        type=endpoint(),
        metavar="ADDR",
        help="output PULL endpoint: port 0 = ephemeral per engine, port P = P+rank, "
        "ipc://path = ipc://path.rank; default tcp://127.0.0.1:0",
    )
    if load_balance:
        group.add_argument(
            "--load-balance",
            choices=[lb.value for lb in LoadBalance],
            default=LoadBalance.LEAST_IN_FLIGHT.value,
            help="placement of unpinned requests; default least_in_flight",
        )
    defaults = ClientConfig()
    group.add_argument(
        "--stall-timeout",
        type=float,
        default=defaults.stall_timeout,
        metavar="S",
        help="seconds a rank with requests in flight may send no output before it is marked "
        "stalled: nothing more is placed on it and it is probed with a one-token request of "
        f"the frontend's own until it answers; default {defaults.stall_timeout:g} (0: never)",
    )
    group.add_argument(
        "--stall-fail-timeout",
        type=float,
        default=defaults.stall_fail_timeout,
        metavar="S",
        help="seconds a stalled rank keeps its requests before they end with a retryable "
        "EngineStalled error (HTTP 503) and are aborted on it; default "
        f"{defaults.stall_fail_timeout:g} (0: never)",
    )
    return group


def config_from_args(args: argparse.Namespace, **overrides: object) -> ClientConfig:
    """The `ClientConfig` the engine-group options describe (raises `UsageError`).

    A value `ClientConfig` refuses is a bad command line: exit 2 with a pointer to ``--help``,
    the message naming the option the user wrote (``overrides`` name config fields, and are
    reported as ``--field-name``).
    """
    values: dict[str, Any] = {field: getattr(args, dest) for dest, field in _FIELDS.items()}
    for dest, field in _ZERO_IS_NEVER.items():
        seconds = getattr(args, dest)
        if not seconds >= 0:  # NaN too
            raise UsageError(
                f"tsfront {args.command}",
                f"--{dest.replace('_', '-')}={seconds:g}: must be >= 0 seconds (0: never)",
            )
        values[field] = seconds or None
    if getattr(args, "load_balance", None) is not None:
        values["routing"] = Routing.aggregated(LoadBalance(args.load_balance))
    values.update(overrides)
    try:
        return ClientConfig(**values)
    except ConfigError as exc:
        field, sep, rest = str(exc).partition("=")
        if sep and field in values:
            option = (
                "--handshake" if field == "handshake_address" else "--" + field.replace("_", "-")
            )
            raise UsageError(f"tsfront {args.command}", f"{option}={rest}") from None
        raise UsageError(f"tsfront {args.command}", str(exc)) from None
