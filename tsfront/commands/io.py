"""``tsfront io``: run an I/O process on its own, for a server's workers to attach to.

Starts the I/O process (`IOProcess.start`), prints its attach address on stdout (one line, or
one JSON object with ``--json``) and serves until SIGINT/SIGTERM, then stops it and exits 0.
Unless ``--no-monitor``, the command attaches a monitor of its own (one worker place) that
reports on stderr when every engine has registered and whenever an engine's liveness
changes; a failed handshake is the command's error (exit 1). If the I/O process dies, the
command exits 1. With ``--state-dir`` the engines' registrations are kept there: SIGUSR1 stops
the command keeping them (a handover, for an upgrade), and a new ``tsfront io`` with the same
options and directory takes the running engines over (see docs/RELIABILITY.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from tsfront.client.engine_client import EngineClient
from tsfront.commands.base import Command, UsageError, progress
from tsfront.commands.options import HANDSHAKE_TIMEOUT_S, add_engine_arguments, config_from_args
from tsfront.config import ClientConfig
from tsfront.errors import Error
from tsfront.process.ioproc import IOProcess

__all__ = ["COMMAND", "arguments", "run"]

_WATCH_S = 0.25


def _note(message: str) -> None:
    progress("io", message)


async def _monitor(io: IOProcess, metrics_port: int | None = None) -> None:
    """Attach, report registration, then report every liveness change until cancelled."""
    client = await EngineClient.attach(io.address)
    server = None
    try:
        if metrics_port is not None:
            from tsfront.metrics import serve

            server = serve(metrics_port, client)
            _note(f"metrics at http://0.0.0.0:{metrics_port}/metrics")
        engines = ", ".join(f"rank {e.rank} = engine {e.index}" for e in client.engines())
        states = {load.index: load.state for load in client.load()}
        waiting = [f"engine {i} {state}" for i, state in states.items() if state != "live"]
        if waiting:  # engines taken over from a predecessor come back one by one
            _note(f"serving ({engines}); not live yet: {', '.join(waiting)}")
        else:
            _note(f"every engine registered ({engines}); serving")
        while not client.closed:
            await asyncio.sleep(_WATCH_S)
            for load in client.load():
                if states.get(load.index) != load.state:
                    _note(f"engine {load.index} (rank {load.rank}) is now {load.state}")
                    states[load.index] = load.state
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        await client.close()


async def _main(args: argparse.Namespace) -> int:
    if args.metrics_port is not None and args.no_monitor:
        raise UsageError(
            "tsfront io", "--metrics-port serves from the monitor's attachment: drop --no-monitor"
        )
    if args.max_workers < 1:
        raise UsageError("tsfront io", f"--max-workers={args.max_workers}: must be at least 1")
    config = config_from_args(
        args,
        max_workers=args.max_workers + (0 if args.no_monitor else 1),
        slots_per_worker=args.slots_per_worker,
        send_timeout=args.send_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        state_dir=args.state_dir,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    handover = False

    def on_handover() -> None:
        nonlocal handover
        handover = True
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, on_handover)
    io = await loop.run_in_executor(None, IOProcess.start, config)
    try:
        info = {
            "address": io.address,
            "handshake_address": io.handshake_address,
            "input_address": io.input_address,
            "output_addresses": io.output_addresses,
            "pid": io.pid,
        }
        sys.stdout.write((json.dumps(info) if args.json else io.address) + "\n")
        sys.stdout.flush()
        _note(
            f"I/O process {io.pid} up; engines dial {io.handshake_address} "
            f"({config.num_engines} expected, timeout {config.handshake_timeout:g}s); workers "
            f"attach at {io.address}; SIGINT/SIGTERM stops it"
        )
        monitor = (
            None if args.no_monitor else asyncio.ensure_future(_monitor(io, args.metrics_port))
        )
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                waits = {stopping} | ({monitor} if monitor is not None else set())
                done, _ = await asyncio.wait(
                    waits, timeout=_WATCH_S, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping in done:
                    _note("handing over (registrations kept)" if handover else "stopping")
                    return 0
                if not io.alive():
                    raise Error(f"the I/O process {io.pid} exited unexpectedly")
                if monitor is not None and monitor in done:
                    exc, monitor = monitor.exception(), None
                    if exc is not None and io.alive():
                        raise exc  # e.g. HandshakeTimeout: this I/O process is of no use
        finally:
            stopping.cancel()
            if monitor is not None:
                monitor.cancel()
                await asyncio.gather(monitor, return_exceptions=True)
    finally:
        await loop.run_in_executor(None, lambda: io.stop(handover=handover))
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            loop.remove_signal_handler(signum)


def run(args: argparse.Namespace) -> int:
    """Run ``tsfront io``; returns the exit status."""
    import uvloop

    return uvloop.run(_main(args))


def arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tsfront io`` options to ``parser``."""
    add_engine_arguments(parser, handshake_timeout=HANDSHAKE_TIMEOUT_S)
    tune = parser.add_argument_group("I/O process")
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
        "--state-dir",
        default=None,
        metavar="DIR",
        help="keep each engine's registration in DIR, so that a new 'tsfront io' started with "
        "the same options and DIR takes the running engines over (after a crash, or SIGUSR1 "
        "for an upgrade) instead of waiting for them to restart; needs fixed addresses",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the addresses as one JSON object (address, handshake_address, "
        "input_address, output_addresses, pid)",
    )
    parser.add_argument(
        "--no-monitor",
        action="store_true",
        help="do not attach a monitor (no engine reports on stderr; exit only on a signal or "
        "if the I/O process dies)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics (GET /metrics, every worker's and engine's figures) on "
        "0.0.0.0:PORT once every engine registered; uses the monitor's attachment",
    )


COMMAND = Command(
    name="io",
    help="run an I/O process on its own, for a server's workers to attach to",
    description="Start an I/O process bound to --handshake, print its attach address "
    "(workers call EngineClient.attach(ADDRESS)) and serve until SIGINT/SIGTERM. Engine "
    "registration and liveness changes are reported on stderr.",
    arguments=arguments,
    run=run,
)
