"""Shared helpers of the core suite (``tests/system/test_core_*.py``).

A `Rig` is one real I/O process (``IOProcess.start``) with a group of simulated ranks dialing
its handshake socket over loopback TCP and one attached `EngineClient`; `rig()` starts it and
stops everything it started, in reverse order, whatever the test did. Both are the library's
(`tsfront.testing.engine_rig`, which the pytest plugin's ``tsfront_engines`` fixture uses).
Waits are events with deadlines: the sim's ``wait_*`` hooks (run in a thread so the event
loop keeps serving the client), stream iteration under ``asyncio.wait_for``, or `wait_until`
polling a condition.
Tokens are predicted with the sim's deterministic `default_token` rule.

The module-level ``*_main`` functions are the bodies of spawned worker processes: each
attaches its own `EngineClient` to the I/O process and reports back over a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from tsfront import EngineClient, OutputChunk, RequestStream
from tsfront.sim import SimGroup, default_token
from tsfront.testing import EngineRig, engine_rig
from tsfront.testing import private_addresses as private_addresses
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

#: Seconds any single wait may take before the test fails (never reached when things work).
DEADLINE = 10.0

#: A request that outlives any test (one token per 2 ms step: 40 s) unless it is aborted.
FOREVER = 20_000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expected_tokens(rid: str, n: int) -> list[int]:
    """The tokens a simulated rank generates for ``rid``: positions 0..n-1."""
    return [default_token(rid, i) for i in range(n)]


def request(
    rid: str,
    max_new_tokens: int = 5,
    *,
    pin: int | None = None,
    prompt: Sequence[int] = (1, 2, 3),
    stream: bool = True,
    **fields: Any,
) -> TokenizedGenerateReqInput:
    """A small tokenized request; ``fields`` go to `TokenizedGenerateReqInput` (or, for a
    ``sampling_params`` dict, to `SamplingParams`)."""
    sp = dict(fields.pop("sampling_params", {}))
    sp.setdefault("max_new_tokens", max_new_tokens)
    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=list(prompt),
        stream=stream,
        sampling_params=SamplingParams(**sp),
        data_parallel_rank=pin,
        **fields,
    )


async def wait_until(
    predicate: Callable[[], Any], what: str, timeout: float = DEADLINE, interval: float = 0.005
) -> Any:
    """Poll ``predicate`` (letting the loop run between polls) until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until_blocking(
    predicate: Callable[[], Any], what: str, timeout: float = DEADLINE, interval: float = 0.002
) -> Any:
    """`wait_until` without an event loop: blocks the calling thread (and its loop)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking sim hook (``wait_request``, ``wait_abort``...) off the event loop."""
    return await asyncio.to_thread(fn, *args)


async def collect(
    stream: RequestStream, timeout: float = DEADLINE
) -> tuple[list[int], list[OutputChunk]]:
    """Read ``stream`` to its end; (every token in order, every chunk)."""
    tokens: list[int] = []
    chunks: list[OutputChunk] = []

    async def read() -> None:
        async for chunk in stream:
            chunks.append(chunk)
            tokens.extend(chunk.output_ids)

    await asyncio.wait_for(read(), timeout)
    return tokens, chunks


async def next_chunk(stream: RequestStream, timeout: float = DEADLINE) -> OutputChunk:
    """The stream's next chunk, within a deadline."""
    return await asyncio.wait_for(anext(stream), timeout)


def engine_rids(sim: SimGroup, index: int) -> list[str]:
    """The rids of every ADD engine ``index`` of the sim received, in order."""
    return [r.rid for r in sim.engine(index).requests()]


#: The rig of the core suite is the library's (tsfront.testing, the pytest plugin's too).
Rig = EngineRig


def rig(num_engines: int = 2, **options: Any) -> contextlib.AbstractAsyncContextManager[Rig]:
    """Start an I/O process for ``num_engines`` ranks, the sim ranks and one client
    (`tsfront.testing.engine_rig`, with this suite's `DEADLINE`)."""
    options.setdefault("deadline", DEADLINE)
    return engine_rig(num_engines, **options)


# ---------------------------------------------------------------------------------- workers


def spawn(target: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    """Start ``target(*args, conn)`` in a spawned process; (process, parent end of the pipe)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def reap(proc: Any, timeout: float = 5.0) -> None:
    """Stop a spawned worker process (kill it if it does not exit) and wait for it."""
    proc.join(timeout if not proc.is_alive() else 0)
    if proc.is_alive():
        proc.kill()
    proc.join(timeout)


def streams_main(address: str, jobs: list[tuple[str, int]], conn: Any) -> None:
    """Worker body: attach, run every ``(rid, max_new_tokens)`` stream concurrently, and send
    back ``{rid: (tokens, finish_reason, completion_tokens, chunk count)}`` (or an error)."""

    async def run() -> dict:
        client = await EngineClient.attach(address, timeout=DEADLINE)
        try:

            async def one(rid: str, n: int) -> tuple:
                stream = await client.generate(request(rid, n, prompt=[7, 8, 9, len(rid)]))
                tokens, chunks = await collect(stream)
                last = chunks[-1]
                return rid, (tokens, last.finish_reason, last.completion_tokens, len(chunks))

            done = await asyncio.gather(*(one(rid, n) for rid, n in jobs))
            return dict(done)
        finally:
            await client.close()

    try:
        conn.send(("ok", asyncio.run(run())))
    except BaseException as exc:  # report, do not hang the parent
        conn.send(("error", repr(exc)))
    finally:
        conn.close()


def hold_main(address: str, rids: list[str], conn: Any) -> None:
    """Worker body: attach, open never-ending streams for ``rids``, report ``"streaming"`` once
    each has delivered a chunk, then keep reading until killed."""

    async def run() -> None:
        client = await EngineClient.attach(address, timeout=DEADLINE)
        streams = [await client.generate(request(rid, FOREVER)) for rid in rids]
        for s in streams:
            await next_chunk(s)
        conn.send("streaming")
        await asyncio.gather(*(collect(s, timeout=3600) for s in streams))

    try:
        asyncio.run(run())
    except BaseException as exc:
        conn.send(("error", repr(exc)))
