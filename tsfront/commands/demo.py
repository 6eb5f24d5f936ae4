"""``tsfront demo``: the multi-worker setup of the README, end to end, with simulated engines.

What runs:

* simulated engine ranks (:class:`tsfront.sim.SimGroup`; threads of this process, or one OS
  process each with ``--sim-processes``) dialing the handshake;
* one I/O process (`IOProcess.start`) that terminates every engine socket;
* ``--workers`` worker processes (spawned OS processes), each calling
  ``EngineClient.attach(io.address)`` and streaming its share of the requests, printing a
  line per chunk prefixed with its worker number and the rid;
* this process attaches too (a monitor) and prints the summary from ``client.load()``.

Everything is stopped on the way out, whatever happened: workers, I/O process, engines.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import secrets
import signal
import sys
import time
from typing import Any, cast

from tsfront.client.engine_client import EngineClient
from tsfront.commands.base import Command, UsageError, progress
from tsfront.config import ClientConfig
from tsfront.errors import Error
from tsfront.process.ioproc import IOProcess
from tsfront.process.sigint import hold_sigint, ignore_sigint

__all__ = ["COMMAND", "arguments", "run"]

_READY_TIMEOUT = 30.0
_RUN_TIMEOUT = 60.0


def _note(message: str) -> None:
    progress("demo", message)


# ---------------------------------------------------------------------- worker process


def _line(text: str) -> None:
    # One write per line: lines of concurrent workers never interleave (pipe writes up to
    # PIPE_BUF bytes are atomic).
    os.write(1, (text + "\n").encode())


async def _worker_main(
    worker: int,
    address: str,
    jobs: list[tuple[str, list[int]]],
    max_new: int,
    quiet: bool,
    results: Any,
    go: Any,
) -> dict[str, Any]:
    from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

    client = await EngineClient.attach(address, timeout=_READY_TIMEOUT)
    try:
        results.put(("ready", worker, os.getpid()))
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, go.wait, _READY_TIMEOUT):
            raise Error("the demo never said go")
        stats: dict[str, Any] = {
            "worker": worker,
            "pid": os.getpid(),
            "requests": 0,
            "tokens": 0,
            "per_engine": {},
            "errors": [],
            "start": time.monotonic(),
        }

        async def one(rid: str, prompt: list[int]) -> None:
            request = TokenizedGenerateReqInput(
                rid=rid,
                input_ids=prompt,
                stream=True,
                sampling_params=SamplingParams(max_new_tokens=max_new),
            )
            try:
                stream = await client.generate(request)
                async with stream:
                    async for chunk in stream:
                        stats["tokens"] += len(chunk.output_ids)
                        if chunk.finished:
                            per = stats["per_engine"]
                            per[chunk.engine_index] = per.get(chunk.engine_index, 0) + 1
                        if quiet:
                            continue
                        ids = " ".join(map(str, chunk.output_ids))
                        end = f"  <- {chunk.finish_reason}" if chunk.finished else ""
                        _line(
                            f"[worker {worker} {rid}] engine {chunk.engine_index} "
                            f"({chunk.completion_tokens:>2}/{max_new}): {ids}{end}"
                        )
                stats["requests"] += 1
            except Error as exc:
                stats["errors"].append(f"{rid}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(rid, prompt) for rid, prompt in jobs))
        stats["end"] = time.monotonic()
        return stats
    finally:
        await client.close()


def _worker_entry(
    worker: int, address: str, jobs: list, max_new: int, quiet: bool, results: Any, go: Any
) -> None:
    """Main function of a spawned demo worker."""
    from tsfront import _native

    ignore_sigint()  # the demo's main process stops us
    _native.set_parent_death_signal(signal.SIGTERM)
    import uvloop

    try:
        stats = uvloop.run(_worker_main(worker, address, jobs, max_new, quiet, results, go))
    except BaseException as exc:
        results.put(("failed", worker, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    results.put(("done", worker, stats))


# ---------------------------------------------------------------------- main process


def _check(args: argparse.Namespace) -> None:
    for name, low, high in (
        ("requests", 1, 10_000),
        ("max_new_tokens", 1, 100_000),
        ("workers", 1, 16),
        ("engines", 1, 64),
    ):
        value = getattr(args, name)
        if not low <= value <= high:
            flag = "--" + name.replace("_", "-")
            raise UsageError("tsfront demo", f"{flag}={value}: must be between {low} and {high}")
    if not args.step_ms > 0:
        raise UsageError("tsfront demo", f"--step-ms={args.step_ms}: must be positive")


def _collect(
    results: multiprocessing.queues.Queue[Any], procs: list, want: str, count: int, timeout: float
) -> dict[int, Any]:
    """Wait for ``count`` messages of kind ``want``; raise on a failure or a dead worker."""
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(got) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Error(f"workers did not report {want!r} within {timeout:g}s")
        try:
            kind, worker, payload = results.get(timeout=min(remaining, 0.2))
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise Error(
                    f"demo worker {dead[0]} exited with status {procs[dead[0]].exitcode}"
                ) from None
            continue
        if kind == "failed":
            raise Error(f"demo worker {worker} failed: {payload}")
        if kind == want:
            got[worker] = payload
    return got


def _summary(results: dict[int, dict], client: EngineClient, args: argparse.Namespace) -> list[str]:
    start = min(r["start"] for r in results.values())
    end = max(r["end"] for r in results.values())
    elapsed = max(end - start, 1e-9)
    tokens = sum(r["tokens"] for r in results.values())
    done = sum(r["requests"] for r in results.values())
    per_engine: dict[int, int] = {}
    for r in results.values():
        for index, n in r["per_engine"].items():
            per_engine[index] = per_engine.get(index, 0) + n
    lines = [
        f"summary: {done}/{args.requests} requests finished by {len(results)} worker processes "
        f"on {args.engines} ranks: {tokens} tokens in {elapsed:.2f}s = "
        f"{tokens / elapsed:.0f} tokens/s"
    ]
    for load in client.load():
        # in_flight and requests_total are tsfront's own exact counts; running, waiting and kv
        # pages are what the engine said with its last output, so label them and their age.
        if load.age is None:
            report = "engine's last load report: none yet"
        else:
            report = (
                f"engine's last load report ({load.age:.2f}s old): running {load.num_running}, "
                f"waiting {load.num_waiting}, kv pages {load.kv_active_pages}/"
                f"{load.kv_total_pages}"
            )
        lines.append(
            f"  rank {load.rank} (engine {load.index}): {per_engine.get(load.index, 0)} "
            f"requests | now: {load.state}, in_flight {load.in_flight}, requests_total "
            f"{load.requests_total} | {report}"
        )
    for worker in sorted(results):
        r = results[worker]
        lines.append(
            f"  worker {worker} (pid {r['pid']}): {r['requests']} requests, {r['tokens']} tokens"
        )
        lines.extend(f"    error: {e}" for e in r["errors"])
    return lines


def _stop_workers(procs: list) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 3.0
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


async def _attach_monitor(address: str) -> EngineClient:
    return await EngineClient.attach(address, timeout=_READY_TIMEOUT)


def run(args: argparse.Namespace) -> int:
    """Run ``tsfront demo``; returns the exit status."""
    _check(args)
    import uvloop

    from tsfront.sim import SimGroup

    os.environ.setdefault("TSFRONT_LOG", "ERROR")
    began = time.monotonic()
    prefix = f"demo-{secrets.token_hex(2)}"
    jobs = [
        (f"{prefix}-{i}", [1 + (7 * i + k) % 97 for k in range(3 + i % 5)])
        for i in range(args.requests)
    ]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    io = sim = loop = client = None
    procs: list = []
    try:
        config = ClientConfig(
            handshake_address="tcp://127.0.0.1:0",
            num_engines=args.engines,
            handshake_timeout=_READY_TIMEOUT,
            max_workers=args.workers + 1,
            slots_per_worker=max(64, args.requests),
        )
        io = IOProcess.start(config)
        _note(
            f"I/O process {io.pid}: engines dial {io.handshake_address}, workers attach at "
            f"{io.address}"
        )
        sim = SimGroup(
            io.handshake_address, args.engines, processes=args.sim_processes, step_ms=args.step_ms
        ).start()
        kind = "processes" if args.sim_processes else "threads"
        _note(f"{args.engines} simulated ranks started ({kind}, {args.step_ms:g} ms per step)")
        for w in range(args.workers):
            share = jobs[w :: args.workers]
            proc = ctx.Process(
                target=_worker_entry,
                args=(w, io.address, share, args.max_new_tokens, args.quiet, results, go),
                name=f"tsfront-demo-worker-{w}",
                daemon=True,
            )
            hold = hold_sigint()  # the worker ignores Ctrl-C from its first instruction on
            try:
                proc.start()
            finally:
                if proc.pid is not None:
                    procs.append(proc)  # started: stopped on the way out, whatever happens
                hold.release()
        loop = uvloop.new_event_loop()
        client = loop.run_until_complete(_attach_monitor(io.address))
        engines = ", ".join(f"rank {e.rank} = engine {e.index}" for e in client.engines())
        _note(f"every engine registered ({engines})")
        ready = _collect(results, procs, "ready", args.workers, _READY_TIMEOUT)
        pids = ", ".join(f"worker {w} = pid {ready[w]}" for w in sorted(ready))
        _note(
            f"{args.workers} worker processes attached ({pids}); streaming {args.requests} "
            f"requests of {args.max_new_tokens} tokens"
        )
        go.set()
        stats = _collect(results, procs, "done", args.workers, _RUN_TIMEOUT)
        for line in _summary(stats, client, args):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        failed = sum(len(r["errors"]) for r in stats.values())
    finally:
        _stop_workers(procs)
        if client is not None:  # attached on this loop
            cast(asyncio.AbstractEventLoop, loop).run_until_complete(client.close())
        if loop is not None:
            loop.close()
        if io is not None:
            io.stop()
        if sim is not None:
            sim.stop()
        results.close()
        results.join_thread()
    _note(f"everything stopped; {time.monotonic() - began:.1f}s in all")
    return 1 if failed else 0


def arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tsfront demo`` options to ``parser``."""
    parser.add_argument("--requests", type=int, default=4, metavar="N", help="requests to run (4)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=10, metavar="M", help="tokens per request (10)"
    )
    parser.add_argument("--workers", type=int, default=2, metavar="W", help="worker processes (2)")
    parser.add_argument(
        "--num-engines",
        "--engines",
        dest="engines",
        type=int,
        default=2,
        metavar="N",
        help="simulated ranks (2); the name of every other command's option (--engines too)",
    )
    parser.add_argument(
        "--step-ms", type=float, default=20.0, metavar="MS", help="simulated decode step (20)"
    )
    parser.add_argument(
        "--sim-processes",
        action="store_true",
        help="run each simulated rank as its own OS process (default: threads of this process)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the summary, not every token line"
    )


COMMAND = Command(
    name="demo",
    help="run the demo against simulated engines (no GPU)",
    description="Start two simulated engine ranks, an I/O process and two worker "
    "processes attached to it; stream a handful of requests (each line prefixed with "
    "its worker and rid) and print a per-rank summary. Finishes in a few seconds.",
    arguments=arguments,
    run=run,
)
