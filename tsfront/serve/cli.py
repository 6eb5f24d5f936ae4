"""``tsfront serve``: an OpenAI-compatible server with W worker processes on one port.

The master process starts one I/O process (or uses ``--attach``'s), reserves the port, and
spawns the workers; each attaches, binds the port with SO_REUSEPORT and serves HTTP. The
master prints ``handshake: ADDR`` once the I/O process is bound (the engines dial it) and
``listening: http://HOST:PORT`` once every engine registered and every worker listens, then
supervises: SIGINT/SIGTERM stop everything and exit 0; a worker dying stops everything and
exits 1 (restarting is the supervisor's job; an engine dying is not fatal: its requests end
with an error and new ones go to the live ranks). The I/O process dying stops everything too,
unless ``--state-dir`` is given: then the master starts a new I/O process with the same
config, which takes the running engines over (docs/RELIABILITY.md), and sends the workers
its address; they attach to it in place (answering 503 meanwhile). The requests in flight are
lost, the engines, their caches and the workers are not.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tsfront.config import ClientConfig
from tsfront.errors import Error
from tsfront.serve.chatsettings import add_chat_arguments, chat_settings
from tsfront.serve.edge import add_edge_arguments, edge_settings

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext
    from multiprocessing.queues import Queue

    from tsfront.io.process import IOProcess
    from tsfront.serve.worker import WorkerOptions

__all__ = ["add_arguments", "run"]

#: Seconds the workers may take beyond the handshake timeout to attach and listen.
READY_MARGIN_S = 30.0
#: Seconds stopped workers get before they are killed.
STOP_GRACE_S = 5.0
_WATCH_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tsfront serve`` options to ``parser``."""
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="model folder: tokenizer.json, tokenizer_config.json (chat template), "
        "config.json / generation_config.json",
    )
    parser.add_argument(
        "--served-model-name", metavar="NAME", help="the model's name in the API (default: DIR's)"
    )
    engines = parser.add_argument_group("engine group")
    src = engines.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--handshake",
        metavar="ADDR",
        help="handshake endpoint to bind, which the engines dial, e.g. tcp://127.0.0.1:30500 "
        "(port 0 picks a free one; the bound address is printed)",
    )
    src.add_argument(
        "--attach",
        metavar="IO_ADDRESS",
        help="use a running I/O process (the address `tsfront io` prints) instead of starting "
        "one; the engine options are then that process's",
    )
    engines.add_argument("--num-engines", type=int, default=1, metavar="N", help="ranks (1)")
    engines.add_argument(
        "--first-engine-index", type=int, default=0, metavar="I", help="identity of rank 0 (0)"
    )
    engines.add_argument(
        "--handshake-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds for every engine to register (600)",
    )
    engines.add_argument(
        "--input-address",
        default="tcp://127.0.0.1:0",
        metavar="ADDR",
        help="input endpoint the engines connect to (tcp://127.0.0.1:0: a free port)",
    )
    engines.add_argument(
        "--output-address",
        default="tcp://127.0.0.1:0",
        metavar="ADDR",
        help="output endpoint of rank 0 (rank i gets port P+i, or ipc path.i); "
        "tcp://127.0.0.1:0: free ports",
    )
    engines.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep the engines' registrations in DIR; if the I/O process dies, a new one takes "
        "the running engines over and the workers start again on it (needs fixed addresses)",
    )
    engines.add_argument(
        "--slots-per-worker",
        type=int,
        default=2048,
        metavar="S",
        help="requests one worker may have in flight; one more is answered 503 (2048)",
    )
    engines.add_argument(
        "--stall-timeout",
        type=float,
        default=ClientConfig().stall_timeout,
        metavar="S",
        help="seconds a rank with requests in flight may send no output before it is marked "
        "stalled: new requests go to the other ranks and /health reports it (30; 0: never)",
    )
    http = parser.add_argument_group("HTTP")
    http.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a request may take from submission to its last token; past it the "
        "engine request is aborted and the client gets a timeout error (default: none)",
    )
    http.add_argument("--workers", type=int, default=1, metavar="W", help="worker processes (1)")
    http.add_argument("--host", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    http.add_argument(
        "--port", type=int, default=8000, metavar="P", help="port; 0 picks a free one (8000)"
    )
    add_chat_arguments(parser)
    add_edge_arguments(parser)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _note(message: str) -> None:
    sys.stderr.write(f"tsfront serve: {message}\n")
    sys.stderr.flush()


def _start_workers(
    ctx: SpawnContext,
    worker_main: Callable[..., None],
    opts: WorkerOptions,
    events: Queue[Any],
    count: int,
    addresses: list,
) -> list:
    procs = []
    for index in range(count):
        proc = ctx.Process(
            target=worker_main,
            args=(index, opts, events, addresses[index] if addresses else None),
            name=f"tsfront-serve-{index}",
        )
        proc.start()
        procs.append(proc)
    return procs


def _wait_ready(
    events: Queue[Any],
    procs: list,
    io: IOProcess | None,
    stop: threading.Event,
    args: argparse.Namespace,
    what: str = "ready",
) -> bool:
    """Wait until every worker says ``what`` (listens, or re-attached); False if told to stop
    meanwhile."""
    deadline = time.monotonic() + args.handshake_timeout + READY_MARGIN_S
    ready: dict[int, int] = {}
    while len(ready) < len(procs):
        if stop.is_set():
            return False
        if time.monotonic() > deadline:
            raise Error("the workers did not attach and listen in time")
        try:
            kind, index, payload = events.get(timeout=_WATCH_S)
        except queue.Empty:
            if io is not None and not io.alive():
                raise Error("the I/O process exited") from None
            dead = [p.name for p in procs if p.exitcode is not None]
            if dead:
                raise Error(f"{dead[0]} exited before serving") from None
            continue
        if kind == "failed":
            raise Error(f"worker {index} failed: {payload}")
        if kind == what:
            ready[index] = payload
    return True


def _stop_workers(procs: list) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    limit = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        proc.join(max(0.0, limit - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


def run(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; returns the exit status."""
    from tsfront.cli import CommandError, UsageError
    from tsfront.io.process import IOProcess
    from tsfront.serve.worker import WorkerOptions, listening_socket, worker_main

    # A bad command line exits 2 pointing at --help, as every command's does.
    if not 1 <= args.workers <= 256:
        raise UsageError("tsfront serve", f"--workers={args.workers}: must be between 1 and 256")
    if not 1 <= args.slots_per_worker <= 65536:
        raise UsageError(
            "tsfront serve", f"--slots-per-worker={args.slots_per_worker}: must be 1..65536"
        )
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise UsageError(
            "tsfront serve", f"--request-timeout={args.request_timeout:g}: must be > 0 seconds"
        )
    if not args.stall_timeout >= 0:
        raise UsageError(
            "tsfront serve", f"--stall-timeout={args.stall_timeout:g}: must be >= 0 (0: never)"
        )
    if args.attach is not None and args.stall_timeout != ClientConfig().stall_timeout:
        raise UsageError(
            "tsfront serve",
            "--stall-timeout belongs to the I/O process: give it to `tsfront io` with --attach",
        )
    if args.attach is not None and args.slots_per_worker != 2048:
        raise UsageError(
            "tsfront serve",
            "--slots-per-worker belongs to the I/O process: give it to `tsfront io` with --attach",
        )
    try:
        edge = edge_settings(args)
        chat = chat_settings(args)
    except ValueError as exc:
        raise UsageError("tsfront serve", str(exc)) from None
    try:
        from tsfront.text import TextError, TextModel
    except ImportError as exc:
        raise CommandError(
            f"tsfront serve needs the text extra ({exc}); pip install 'tsfront[serve]'"
        ) from None
    try:
        text = TextModel.load(args.model)  # fail here, once, rather than in every worker
    except (TextError, OSError) as exc:
        raise CommandError(f"--model {args.model}: {exc}") from None
    name = args.served_model_name or text.name

    if args.state_dir is not None and args.attach is not None:
        raise UsageError(
            "tsfront serve", "--state-dir belongs to the I/O process: give it to `tsfront io`"
        )
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    procs: list = []
    addresses: list = []
    io = None
    reserved = None
    try:
        if args.attach is None:
            config = ClientConfig(
                handshake_address=args.handshake,
                num_engines=args.num_engines,
                first_engine_index=args.first_engine_index,
                handshake_timeout=args.handshake_timeout,
                max_workers=args.workers,
                slots_per_worker=args.slots_per_worker,
                input_address=args.input_address,
                output_address=args.output_address,
                state_dir=args.state_dir,
                stall_timeout=args.stall_timeout or None,
            )
            io = IOProcess.start(config)
            address = io.address
            _say(f"handshake: {io.handshake_address}")
            _note(f"I/O process {io.pid}; waiting for {args.num_engines} engine(s)")
        else:
            address = args.attach
            _note(f"attaching {args.workers} worker(s) to the I/O process at {address}")
        # Hold the port (bound, not listening: the kernel routes nothing to it) so that port 0
        # resolves once and every worker joins the same SO_REUSEPORT group.
        reserved = listening_socket(args.host, args.port, listen=False)
        port = reserved.getsockname()[1]
        opts = WorkerOptions(
            model=args.model,
            model_name=name,
            host=args.host,
            port=port,
            address=address,
            attach_timeout=args.handshake_timeout + READY_MARGIN_S,
            request_timeout=args.request_timeout,
            edge=edge,
            chat=chat,
        )
        # With a state directory the workers outlive an I/O process: each gets its successor's
        # address on a queue of its own.
        addresses = [ctx.Queue() for _ in range(args.workers)] if args.state_dir else []
        procs.extend(_start_workers(ctx, worker_main, opts, events, args.workers, addresses))
        if not _wait_ready(events, procs, io, stop, args):
            return 0
        reserved.close()
        reserved = None
        host = f"[{args.host}]" if ":" in args.host else args.host
        _say(f"listening: http://{host}:{port}")
        _note(f"{args.workers} worker(s) serving {name!r}; SIGINT/SIGTERM stops")
        while not stop.wait(_WATCH_S):
            if io is not None and not io.alive():
                if args.state_dir is None:
                    raise Error("the I/O process exited; stopping (--state-dir restarts it)")
                # A new I/O process on the same config and state directory takes the running
                # engines over; the workers attach to it in place.
                t0 = time.monotonic()
                _note(
                    f"the I/O process {io.pid} exited; starting a new one on {args.state_dir} "
                    "(the engines keep running)"
                )
                io.stop()  # reap it
                io = IOProcess.start(config)
                for q in addresses:
                    q.put(io.address)
                if not _wait_ready(events, procs, io, stop, args, "reattached"):
                    break
                _note(
                    f"I/O process {io.pid} took the engines over; {args.workers} worker(s) "
                    f"re-attached {time.monotonic() - t0:.2f}s after the restart began"
                )
                continue
            dead = [p for p in procs if p.exitcode is not None]
            if dead and not stop.is_set():  # (a terminal's Ctrl-C also reaches the workers)
                raise Error(f"{dead[0].name} exited with status {dead[0].exitcode}; stopping")
        _note("stopping")
        return 0
    finally:
        if reserved is not None:
            reserved.close()
        _stop_workers(procs)
        for q in addresses:
            q.close()
            q.join_thread()
        if io is not None:
            io.stop()
        events.close()
        events.join_thread()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
