"""The agent load of ``tsfront bench serve --preset agentic``: a separate, uncounted process.

``python -m tsfront.bench.agentload --url URL --model NAME --tokenizer TOKENIZER_JSON
--concurrency C --requests R --turns T --system-tokens S [--cold]`` keeps C conversations
going until R requests are done. A conversation is a system prompt (the workload's shared one,
or with ``--cold`` its own), 8 tools on every request, and its whole history re-sent every
turn (`tsfront.bench.agentic`): the server's streamed answer becomes the next turn's
assistant message (a tool call, then a tool result message; or text, then a user message).
After T requests (1 with ``--cold``) it starts over as a new conversation. Prints one JSON
object: requests, errors, prompt_tokens and completion_tokens (the servers' usage), tool_calls,
elapsed seconds, and the time to the first token of each request by kind (``ttft`` for text
answers, ``ttft_call`` for tool calls).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.bench.agentic import Workload, tools
from tsfront.bench.serveload import print_result, sse_events

if TYPE_CHECKING:
    import aiohttp

__all__ = ["main"]


async def _turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], out: dict
) -> dict[str, Any] | None:
    """One streamed request; the assistant message it answered, or None (an error)."""
    start = time.perf_counter()
    first = None
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    data = msgspec.json.encode(body)
    async with session.post(url, data=data, headers={"content-type": "application/json"}) as r:
        if r.status != 200:
            out["errors"] += 1
            out.setdefault("error", (await r.text())[:300])
            return None
        async for event in sse_events(r):
            usage = event.get("usage")
            if usage:
                out["prompt_tokens"] += usage.get("prompt_tokens") or 0
                out["completion_tokens"] += usage.get("completion_tokens") or 0
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text.append(delta["content"])
                for call in delta.get("tool_calls") or ():
                    got = calls.setdefault(call.get("index", 0), {"arguments": ""})
                    fn = call.get("function") or {}
                    if call.get("id"):
                        got["id"] = call["id"]
                    if fn.get("name"):
                        got["name"] = fn["name"]
                    got["arguments"] += fn.get("arguments") or ""
                if first is None and (delta.get("content") or delta.get("tool_calls")):
                    first = time.perf_counter() - start
    out["requests"] += 1
    if first is not None:
        out["ttft_call" if calls else "ttft"].append(first)
    if calls:
        out["tool_calls"] += 1
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.get("id", f"call_{i}"),
                    "type": "function",
                    "function": {"name": c.get("name", ""), "arguments": c["arguments"]},
                }
                for i, c in sorted(calls.items())
            ],
        }
    return {"role": "assistant", "content": "".join(text)}


async def run(args: argparse.Namespace) -> dict:
    """Run the load; returns the counts."""
    import aiohttp

    work = Workload.from_tokenizer(Path(args.tokenizer), args.system_tokens, args.seed)
    shared = None if args.cold else work.system_prompt(None)
    tool_list = tools()
    turns = 1 if args.cold else args.turns
    out: dict[str, Any] = {
        "requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
        "tool_calls": 0, "ttft": [], "ttft_call": [],
    }  # fmt: skip
    url = args.url.rstrip("/") + "/v1/chat/completions"
    remaining = args.requests
    conversation = args.first_conversation
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def lane() -> None:
            nonlocal remaining, conversation
            while remaining > 0:
                c = conversation
                conversation += 1
                system = shared if shared is not None else work.system_prompt(c)
                kind = "call"
                messages: list[dict[str, Any]] = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"{work.user_text(c, 0)} [[turn 0:{kind}]]"},
                ]
                for t in range(turns):
                    if remaining <= 0:
                        return
                    remaining -= 1
                    body = {
                        "model": args.model,
                        "messages": messages,
                        "tools": tool_list,
                        "max_tokens": args.max_tokens,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                    answer = await _turn(session, url, body, out)
                    if answer is None:
                        break
                    messages.append(answer)
                    kind = "text" if (t + 1) % 3 == 2 else "call"  # a call on two turns in three
                    marker = f"[[turn {t + 1}:{kind}]]"
                    if answer.get("tool_calls"):
                        messages.append(
                            {
                                "role": "tool",
                                "tool_call_id": answer["tool_calls"][0]["id"],
                                "content": f"{work.tool_result(c, t + 1)} {marker}",
                            }
                        )
                    else:
                        messages.append(
                            {"role": "user", "content": f"{work.user_text(c, t + 1)} {marker}"}
                        )

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(args.concurrency)))
        out["elapsed"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (prints the JSON result on stdout)."""
    p = argparse.ArgumentParser(prog="python -m tsfront.bench.agentload")
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True, help="the tokenizer.json the texts come from")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--system-tokens", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--cold", action="store_true", help="every conversation its own, one turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-conversation", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    return print_result(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
