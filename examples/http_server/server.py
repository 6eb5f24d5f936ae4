"""A multi-worker HTTP text-generation server on tsfront.

    python examples/http_server/server.py --handshake tcp://127.0.0.1:30500 --num-engines 2 \\
        --workers 4 --port 8000

The master process starts one tsfront I/O process (it binds the handshake the engines dial),
reserves the port, and spawns ``--workers`` worker processes. Each worker attaches to the I/O
process (``EngineClient.attach``), binds the same port with SO_REUSEPORT and serves HTTP: the
kernel spreads incoming connections over the workers' listening sockets. The master prints
``handshake: ADDR`` once the I/O process is bound and ``listening: http://HOST:PORT`` once
every worker is serving, then supervises: SIGINT/SIGTERM stop everything (exit 0); a worker or
the I/O process dying stops everything too (exit 1) — restarting is the supervisor's job.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import queue
import signal
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

PR_SET_PDEATHSIG = 1
READY_MARGIN_S = 30.0


def _log(message: str) -> None:
    sys.stderr.write(f"http-server: {message}\n")
    sys.stderr.flush()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM us when the master dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def listening_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket bound with SO_REUSEPORT (and SO_REUSEADDR), listening if asked."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(1024)
        sock.setblocking(False)
    return sock


# ---------------------------------------------------------------------- worker process


async def _serve(index: int, args: argparse.Namespace, address: str, port: int, events) -> int:
    import asyncio

    from app import Worker
    from textproc import load_tokenizer

    from tsfront import EngineClient

    tokenizer = load_tokenizer(args.tokenizer)
    client = await EngineClient.attach(address, timeout=args.handshake_timeout + READY_MARGIN_S)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    worker = Worker(index, client, tokenizer)
    sock = listening_socket(args.host, port, listen=True)
    server = await asyncio.start_server(worker.handle, sock=sock, limit=64 * 1024)
    events.put(("ready", index, os.getpid()))
    try:
        while not stop.is_set() and not client.closed:
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
    finally:
        server.close()
        for task in list(worker.connections):
            task.cancel()  # cancelling a handler aborts its stream's engine request
        await asyncio.gather(*worker.connections, return_exceptions=True)
        await client.close()
    return 0 if stop.is_set() else 1


def worker_main(index: int, args: argparse.Namespace, address: str, port: int, events) -> None:
    """Entry point of a spawned worker process."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the master, which stops us
    import uvloop

    try:
        code = uvloop.run(_serve(index, args, address, port, events))
    except BaseException as exc:
        events.put(("failed", index, f"{type(exc).__name__}: {exc}"))
        code = 1
    sys.exit(code)


# ---------------------------------------------------------------------- master process


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Multi-worker HTTP text generation on tsfront (POST /generate).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--handshake", help="handshake endpoint to bind, which the engines dial")
    src.add_argument(
        "--attach",
        metavar="ADDRESS",
        help="use a running I/O process instead of starting one (e.g. the address `tsfront io` "
        "prints); the engine options are then that process's",
    )
    p.add_argument("--num-engines", type=int, default=1, help="attention-DP ranks expected (1)")
    p.add_argument("--first-engine-index", type=int, default=0, help="identity of rank 0 (0)")
    p.add_argument(
        "--handshake-timeout", type=float, default=600.0, help="seconds for the engines (600)"
    )
    p.add_argument("--workers", type=int, default=2, help="HTTP worker processes (2)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (8000)")
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="TOKENIZER_JSON",
        help="a tokenizer.json (needs the 'tokenizers' package); default: byte tokenizer "
        "(token = UTF-8 byte + 3)",
    )
    args = p.parse_args(argv)
    if not 1 <= args.workers <= 256:
        p.error("--workers must be between 1 and 256")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tokenizer is not None:
        from textproc import load_tokenizer

        try:
            load_tokenizer(args.tokenizer)  # fail here, once, rather than in every worker
        except Exception as exc:
            _log(f"error: {exc}")
            return 1

    from tsfront import ClientConfig, Error, IOProcess

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: stop.set())
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    procs: list = []
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
            )
            io = IOProcess.start(config)
            address = io.address
            _say(f"handshake: {io.handshake_address}")
            _log(f"I/O process {io.pid}; waiting for {args.num_engines} engine(s)")
        else:
            address = args.attach
            _log(f"attaching {args.workers} workers to the I/O process at {address}")
        # Hold the port (bound, not listening: the kernel routes nothing to it) so that port 0
        # resolves once and every worker joins the same SO_REUSEPORT group.
        reserved = listening_socket(args.host, args.port, listen=False)
        port = reserved.getsockname()[1]
        for index in range(args.workers):
            proc = ctx.Process(
                target=worker_main,
                args=(index, args, address, port, events),
                name=f"http-worker-{index}",
            )
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + args.handshake_timeout + READY_MARGIN_S
        ready: dict[int, int] = {}
        while len(ready) < args.workers:
            if stop.is_set():
                return 0
            if time.monotonic() > deadline:
                raise Error("workers did not become ready in time")
            try:
                kind, index, payload = events.get(timeout=0.2)
            except queue.Empty:
                if io is not None and not io.alive():
                    raise Error("the I/O process exited") from None
                dead = [p.name for p in procs if p.exitcode is not None]
                if dead:
                    raise Error(f"{dead[0]} exited before serving") from None
                continue
            if kind == "failed":
                raise Error(f"worker {index} failed: {payload}")
            ready[index] = payload
        reserved.close()
        reserved = None
        host = f"[{args.host}]" if ":" in args.host else args.host
        _say(f"listening: http://{host}:{port} workers={args.workers}")
        while not stop.wait(0.2):
            if io is not None and not io.alive():
                raise Error("the I/O process exited; stopping")
            dead = [p for p in procs if p.exitcode is not None]
            if dead:
                raise Error(f"{dead[0].name} exited with status {dead[0].exitcode}; stopping")
        _log("stopping")
        return 0
    except Error as exc:
        _log(f"error: {exc}")
        return 1
    finally:
        if reserved is not None:
            reserved.close()
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        limit = time.monotonic() + 5.0
        for proc in procs:
            proc.join(max(0.0, limit - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        if io is not None:
            io.stop()
        events.close()
        events.join_thread()


if __name__ == "__main__":
    sys.exit(main())
