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

from tsfront.cli import UsageError, config_from_args, progress
from tsfront.client import EngineClient
from tsfront.errors import Error
from tsfront.io.process import IOProcess

__all__ = ["run"]

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
        stall_timeout=args.stall_timeout or None,
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
