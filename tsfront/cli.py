"""The ``tsfront`` command: a demo, a one-shot generator, a standalone I/O process, simulators.

Subcommands:

* ``tsfront demo`` — simulated engines, an I/O process and two worker processes, no GPU;
* ``tsfront generate`` — be the frontend of a running engine group and run requests;
* ``tsfront io`` — run an I/O process on its own, for a server's workers to attach to;
* ``tsfront sim`` — run simulated TokenSpeed ranks against a frontend.

Progress goes to stderr, results to stdout. An error is one line on stderr,
``tsfront: error: ...``, and a non-zero exit: 2 for a bad command line (an unknown option, a
malformed address, a value out of range; the line ends with ``see 'tsfront CMD --help'``),
1 for anything else, 130 when interrupted (Ctrl-C).

``TSFRONT_LOG=LEVEL`` (e.g. ``INFO``, ``DEBUG``) shows the ``tsfront.*`` loggers of this
process and of the I/O process it starts on stderr; unset, the commands keep them quiet.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from tsfront.config import ClientConfig, LoadBalance, Routing
from tsfront.errors import ConfigError, Error
from tsfront.io.addresses import check_endpoint

__all__ = [
    "CommandError",
    "MissingExtra",
    "UsageError",
    "add_engine_arguments",
    "config_from_args",
    "endpoint",
    "main",
    "progress",
]

USAGE_EXIT = 2
ERROR_EXIT = 1
INTERRUPTED_EXIT = 130


class CommandError(Error):
    """A subcommand cannot go on (bad input file, ...); reported as one line."""


class MissingExtra(CommandError):
    """An optional dependency the subcommand needs is not installed (exit 2; the message
    carries the ``pip install`` line)."""


class UsageError(CommandError):
    """The command line asks for something impossible (exit 2, with a pointer to ``--help``).

    ``prog`` is the command whose help to read, e.g. ``"tsfront generate"``.
    """

    def __init__(self, prog: str, message: str) -> None:
        self.prog = prog
        super().__init__(message)


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors become one line instead of usage plus a message."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


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


# Options whose value is a list of token ids: "-5,3" must be read as their value, not as an
# unknown option, so that the refusal says what is wrong with it (token ids are >= 0).
_ID_OPTIONS = ("--input-ids", "--stop-token-ids")


def _join_id_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in _ID_OPTIONS:
            value = next(it, None)
            if value is not None and value.startswith("-") and value[1:2].isdigit():
                out.append(f"{arg}={value}")
                continue
            out.append(arg)
            if value is not None:
                out.append(value)
            continue
        out.append(arg)
    return out


def one_line(text: object) -> str:
    """``text`` as a single line (newlines folded)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def progress(command: str, message: str) -> None:
    """Write one progress line to stderr."""
    sys.stderr.write(f"tsfront {command}: {message}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------- shared arguments


def add_engine_arguments(parser: argparse.ArgumentParser, *, handshake_timeout: float) -> None:
    """The options that describe the engine group and the frontend's sockets."""
    group = parser.add_argument_group("engine group")
    group.add_argument(
        "--handshake",
        required=True,
        type=endpoint(tcp_only=True),
        metavar="ADDR",
        help="handshake endpoint to BIND, which the engines dial (TokenSpeed's "
        "--data-parallel-address/--data-parallel-rpc-port), e.g. tcp://127.0.0.1:30500; "
        "port 0 picks a free port (reported on stderr)",
    )
    group.add_argument(
        "--num-engines",
        type=int,
        required=True,
        metavar="N",
        help="number of attention-DP ranks expected (--data-parallel-size)",
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
    group.add_argument(
        "--load-balance",
        choices=[lb.value for lb in LoadBalance],
        default=LoadBalance.LEAST_IN_FLIGHT.value,
        help="placement of unpinned requests; default least_in_flight",
    )


def config_from_args(args: argparse.Namespace, **overrides: object) -> ClientConfig:
    """The `ClientConfig` the engine-group options describe (raises `UsageError`).

    A value `ClientConfig` refuses is a bad command line: exit 2 with a pointer to ``--help``.
    """
    values: dict = {
        "handshake_address": args.handshake,
        "input_address": args.input_address,
        "output_address": args.output_address,
        "num_engines": args.num_engines,
        "first_engine_index": args.first_engine_index,
        "handshake_timeout": args.handshake_timeout,
        "routing": Routing.aggregated(LoadBalance(args.load_balance)),
    }
    values.update(overrides)
    try:
        return ClientConfig(**values)
    except ConfigError as exc:
        # Name the option the user wrote, not the ClientConfig field behind it.
        field, sep, rest = str(exc).partition("=")
        if sep and field in values:
            option = (
                "--handshake" if field == "handshake_address" else "--" + field.replace("_", "-")
            )
            raise UsageError(f"tsfront {args.command}", f"{option}={rest}") from None
        raise UsageError(f"tsfront {args.command}", str(exc)) from None


# ---------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The whole ``tsfront`` command line."""
    from tsfront import __version__
    from tsfront.sim.cli import add_arguments as add_sim_arguments

    parser = _Parser(
        prog="tsfront",
        description=__doc__.split("\n\n")[0],
        epilog="Run 'tsfront COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"tsfront {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="run the demo against simulated engines (no GPU)",
        description="Start two simulated engine ranks, an I/O process and two worker "
        "processes attached to it; stream a handful of requests (each line prefixed with "
        "its worker and rid) and print a per-rank summary. Finishes in a few seconds.",
    )
    demo.add_argument("--requests", type=int, default=4, metavar="N", help="requests to run (4)")
    demo.add_argument(
        "--max-new-tokens", type=int, default=10, metavar="M", help="tokens per request (10)"
    )
    demo.add_argument("--workers", type=int, default=2, metavar="W", help="worker processes (2)")
    demo.add_argument("--engines", type=int, default=2, metavar="N", help="simulated ranks (2)")
    demo.add_argument(
        "--step-ms", type=float, default=20.0, metavar="MS", help="simulated decode step (20)"
    )
    demo.add_argument(
        "--sim-processes",
        action="store_true",
        help="run each simulated rank as its own OS process (default: threads of this process)",
    )
    demo.add_argument(
        "--quiet", action="store_true", help="print only the summary, not every token line"
    )
    demo.set_defaults(run="tsfront.demo:run")

    gen = sub.add_parser(
        "generate",
        help="bind the handshake, wait for the engines, run requests and print their tokens",
        description="Be the frontend of an engine group: bind the handshake at --handshake, "
        "wait for --num-engines engines to dial it and register, run one request "
        "(--input-ids) or many (--requests FILE.jsonl), printing tokens as they arrive.",
        epilog="Each line of a --requests file is a JSON object with 'input_ids' (a list of "
        "ints) and optionally 'rid', 'data_parallel_rank', and any SamplingParams field "
        "('max_new_tokens', 'stop_token_ids', 'temperature', 'top_p', 'top_k', 'ignore_eos', "
        "'seed', ...), at the top level or under 'sampling_params'. Stop strings are refused: "
        "tsfront sends token ids only. Exit status: 0 if every request finished, 1 otherwise.",
    )
    add_engine_arguments(gen, handshake_timeout=60.0)
    req = gen.add_argument_group("requests")
    what = req.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--input-ids", metavar="IDS", help="the prompt of one request, comma-separated token ids"
    )
    what.add_argument(
        "--requests",
        metavar="FILE",
        help="a JSON-lines file of requests, one object per line ('-' reads stdin)",
    )
    req.add_argument(
        "--max-new-tokens",
        type=int,
        default=16,
        metavar="M",
        help="default max_new_tokens (16)",
    )
    req.add_argument(
        "--stop-token-ids",
        metavar="IDS",
        help="default stop_token_ids, comma-separated",
    )
    req.add_argument(
        "--temperature", type=float, default=None, metavar="T", help="default temperature"
    )
    req.add_argument(
        "--rank",
        type=int,
        default=None,
        metavar="R",
        help="pin requests to this data-parallel rank (default: load-balanced)",
    )
    req.add_argument(
        "--concurrency",
        type=int,
        default=64,
        metavar="C",
        help="requests in flight at once (64)",
    )
    out = gen.add_argument_group("output")
    out.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per chunk (rid, output_ids, finish_reason, prompt_tokens, "
        "completion_tokens, cached_tokens, engine_index); errors as {rid, error}",
    )
    out.add_argument(
        "--quiet", action="store_true", help="no progress on stderr (errors still shown)"
    )
    gen.set_defaults(run="tsfront.generate:run")

    io = sub.add_parser(
        "io",
        help="run an I/O process on its own, for a server's workers to attach to",
        description="Start an I/O process bound to --handshake, print its attach address "
        "(workers call EngineClient.attach(ADDRESS)) and serve until SIGINT/SIGTERM. Engine "
        "registration and liveness changes are reported on stderr.",
    )
    add_engine_arguments(io, handshake_timeout=600.0)
    tune = io.add_argument_group("I/O process")
    defaults = ClientConfig()
    tune.add_argument(
        "--max-workers",
        type=int,
        default=defaults.max_workers,
        help=f"worker processes that may attach at once ({defaults.max_workers}; one more is "
        "taken by this command's own monitor unless --no-monitor)",
    )
    tune.add_argument(
        "--slots-per-worker",
        type=int,
        default=defaults.slots_per_worker,
        help=f"requests one worker may have in flight ({defaults.slots_per_worker})",
    )
    tune.add_argument(
        "--send-timeout",
        type=float,
        default=defaults.send_timeout,
        help=f"seconds an engine may take to accept a request ({defaults.send_timeout:g})",
    )
    tune.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.heartbeat_timeout,
        help=f"seconds of silence before an engine is dead ({defaults.heartbeat_timeout:g})",
    )
    tune.add_argument(
        "--stall-timeout",
        type=float,
        default=defaults.stall_timeout,
        help="seconds an engine with requests in flight may send no output before it is "
        f"marked stalled and new requests go elsewhere ({defaults.stall_timeout:g}; 0: never)",
    )
    tune.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="keep each engine's registration in DIR, so that a new 'tsfront io' started with "
        "the same options and DIR takes the running engines over (after a crash, or SIGUSR1 "
        "for an upgrade) instead of waiting for them to restart; needs fixed addresses",
    )
    io.add_argument(
        "--json",
        action="store_true",
        help="print the addresses as one JSON object (address, handshake_address, "
        "input_address, output_addresses, pid)",
    )
    io.add_argument(
        "--no-monitor",
        action="store_true",
        help="do not attach a monitor (no engine reports on stderr; exit only on a signal or "
        "if the I/O process dies)",
    )
    io.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics (GET /metrics, every worker's and engine's figures) on "
        "0.0.0.0:PORT once every engine registered; uses the monitor's attachment",
    )
    io.set_defaults(run="tsfront.iocmd:run")

    sim = sub.add_parser(
        "sim",
        help="run simulated TokenSpeed ranks that dial a frontend",
        description="Run simulated TokenSpeed ranks (no GPU) that dial --handshake exactly as "
        "real engines do; serve until SIGINT/SIGTERM. Exits 1 as soon as a rank dies.",
    )
    add_sim_arguments(sim)
    sim.set_defaults(run="tsfront.cli:_run_sim")

    from tsfront.bench import cli as bench_cli

    bench = sub.add_parser(
        "bench",
        help="run the throughput suite (I/O process, workers, baselines)",
        description="Measure tsfront against the floor and the designs users would pick "
        "instead, on replayed engine frames; --quick finishes in under a minute.",
    )
    bench_cli.add_arguments(bench)
    bench.set_defaults(run="tsfront.bench.cli:run")

    from tsfront.serve import cli as serve_cli

    serve = sub.add_parser(
        "serve",
        help="serve the OpenAI API (completions, chat) from W worker processes",
        description="Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, "
        "/health) from W worker processes on one port, for an engine group that dials "
        "--handshake. Prints 'handshake: ADDR', then 'listening: http://HOST:PORT' once every "
        "engine registered and every worker listens; SIGINT/SIGTERM stop it.",
    )
    serve_cli.add_arguments(serve)
    serve.set_defaults(run="tsfront.serve.cli:run")
    return parser


def _run_sim(args: argparse.Namespace) -> int:
    from tsfront.sim import cli as sim_cli

    # Check what the simulator would refuse first, so it is one line like every other error.
    try:
        sim_cli._group_from_args(args)
    except (TypeError, ValueError) as exc:
        message = one_line(exc)
        field, sep, rest = message.partition("=")
        if sep and field.isidentifier() and field != "handshake_address":
            # The options are named after the EngineOptions fields (minus the "_s" unit).
            message = f"--{field.removesuffix('_s').replace('_', '-')}={rest}"
        raise UsageError("tsfront sim", message) from None
    return sim_cli.cli_main(args.argv)


def _resolve(target: str) -> Any:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tsfront`` console script; returns the exit status."""
    argv = _join_id_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    level = os.environ.get("TSFRONT_LOG")
    if level:
        try:
            logging.basicConfig(
                level=level.upper(),
                format="tsfront[%(process)d] %(name)s %(levelname)s %(message)s",
            )
        except ValueError:
            _error(f"TSFRONT_LOG={level!r}: not a logging level; use DEBUG, INFO, WARNING or ERROR")
            return USAGE_EXIT
    try:
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit as exc:  # --help / --version
            return exc.code if isinstance(exc.code, int) else 0
        if extra:
            # Unknown options belong to the subcommand: point at its help, not the top level's.
            raise UsageError(
                f"tsfront {args.command}", f"unrecognized arguments: {' '.join(extra)}"
            )
        args.argv = argv[argv.index(args.command) + 1 :]
        return int(_resolve(args.run)(args) or 0)
    except UsageError as exc:
        hint = f" (see '{exc.prog} --help')"
        _error(f"{one_line(exc)}{hint}")
        return USAGE_EXIT
    except MissingExtra as exc:
        _error(one_line(exc))
        return USAGE_EXIT
    except KeyboardInterrupt:
        _error("interrupted")
        return INTERRUPTED_EXIT
    except Error as exc:
        _error(one_line(exc))
        return ERROR_EXIT
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        _error(f"{exc.strerror or exc}{where}")
        return ERROR_EXIT


def _error(message: str) -> None:
    try:
        sys.stderr.write(f"tsfront: error: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    # Run the imported module's main, so that its exception classes are the ones raised by
    # the subcommand modules (which import tsfront.cli, not __main__).
    from tsfront.cli import main as _main

    sys.exit(_main())
