"""The streamed load of ``tsfront bench serve``: a separate process, so its CPU is not counted.

``python -m tsfront.bench.serveload --url URL --model NAME --concurrency C --requests R
--max-tokens T`` keeps C streamed ``/v1/completions`` requests in flight until R are done
(``ignore_eos``, so each runs to T tokens) and prints one JSON object: requests, errors,
tokens (counted from the streamed text: the bench's word-level model spells token ``i`` as
``w<i>``, so a token is one ``w``), events, elapsed seconds and every request's time to first
token. aiohttp's client (C parser) keeps the load's own CPU low on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    import aiohttp

__all__ = ["main", "print_result", "sse_events"]

_DECODE = msgspec.json.Decoder()


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The decoded ``data:`` events of a streamed OpenAI response, up to ``[DONE]``."""
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        payload = line[6:].strip()
        if payload == b"[DONE]":
            return
        yield _DECODE.decode(payload)


def print_result(run: Callable[[], Coroutine[Any, Any, dict]]) -> int:
    """Run a load's coroutine (on uvloop when it is installed) and print its JSON result."""
    try:
        import uvloop

        result = uvloop.run(run())
    except ImportError:
        result = asyncio.run(run())
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, out: dict) -> None:
    start = time.perf_counter()
    first = None
    tokens = events = 0
    async with session.post(
        url, data=body, headers={"content-type": "application/json"}
    ) as response:
        if response.status != 200:
            out["errors"] += 1
            out.setdefault("error", (await response.text())[:300])
            return
        async for event in sse_events(response):
            choices = event.get("choices") or ()
            if not choices:
                continue
            text = choices[0].get("text") or ""
            n = text.count("w")
            if n and first is None:
                first = time.perf_counter() - start
            tokens += n
            events += 1
    out["tokens"] += tokens
    out["events"] += events
    out["requests"] += 1
    if first is not None:
        out["ttft"].append(first)


async def run(args: argparse.Namespace) -> dict:
    """Run the load; returns the counts."""
    import aiohttp

    body = json.dumps(
        {
            "model": args.model,
            "prompt": args.prompt,
            "max_tokens": args.max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    out = {"requests": 0, "errors": 0, "tokens": 0, "events": 0, "ttft": []}
    url = args.url.rstrip("/") + "/v1/completions"
    remaining = args.requests
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def lane() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await _one(session, url, body, out)

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(args.concurrency)))
        out["elapsed"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (prints the JSON result on stdout)."""
    p = argparse.ArgumentParser(prog="python -m tsfront.bench.serveload")
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="w5 w6 w7 w8")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    return print_result(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
