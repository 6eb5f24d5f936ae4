"""One long agent request, phase by phase: where a worker's CPU goes before the engine sees it.

``python -m tsfront.bench.agentic_phases [--system-tokens 4000] [--turn 6] [--rounds 200]``
builds the agent workload's conversation (`tsfront.bench.agentic`, DeepSeek-V3's real
tokenizer) up to turn ``--turn``, then times each step a worker takes for its chat request, in
this process on its thread CPU clock (median of ``--rounds``): the body's decode, the plan's
checks, the template, the encode (warm: the conversation's previous turns are in the encode
cache; cold: no cache, the whole prompt), the prefix-affinity block hashes, the client's
checks of the ids, the ADD's encoding and the detokenizer's setup; then, per streamed token,
what the worker does with an answer's text (the detokenizer's step, the Hermes tool parser and
the reasoning-free `OutputParser`, OpenAI's chunk events: `Format.pieces`) for the workload's
scripted tool call and text answer, one token at a time. What is not here (the HTTP exchange,
the hop to the encode thread and back, the wake-ups of the drain, each event's write) is the
rest of ``tsfront bench serve --preset agentic``'s whole (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["main", "phases"]


def _conversation(work: Any, turns: int) -> list[dict[str, Any]]:
    from tsfront.bench.agentic import call_text

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": work.system_prompt(None)},
        {"role": "user", "content": f"{work.user_text(0, 0)} [[turn 0:call]]"},
    ]
    for t in range(turns):
        call = msgspec.json.decode(call_text(t).split("\n")[1])
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{t}",
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": msgspec.json.encode(call["arguments"]).decode(),
                        },
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{t}", "content": work.tool_result(0, t + 1)}
        )
    return messages


def _median_us(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / 1e3


def phases(system_tokens: int, turn: int, rounds: int) -> tuple[dict[str, float], int]:
    """``{phase: median µs}`` and the prompt's tokens."""
    from tsfront.bench.agentic import Workload, call_text, make_agentic_model, tools
    from tsfront.bench.realtok import deepseek_tokenizer
    from tsfront.ipc.hashes import packed_hashes
    from tsfront.serve.core.schema import ChatRequest
    from tsfront.serve.core.tooling import history_message, tool_plan
    from tsfront.text import TextModel
    from tsfront.text.encode_cache import private_cache
    from tsfront.wire import SamplingParams, TokenizedGenerateReqInput, encode_add, validate_request

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_agentic_model(Path(tmp) / "m", deepseek_tokenizer())
        text = TextModel.load(folder)
        work = Workload.from_tokenizer(folder / "tokenizer.json", system_tokens)
    decoder = msgspec.json.Decoder(ChatRequest)
    messages = _conversation(work, turn)
    body = msgspec.json.encode(
        {"model": "m", "messages": messages, "tools": tools(), "stream": True, "max_tokens": 256}
    )
    req = decoder.decode(body)
    out: dict[str, float] = {}
    out["body decode (msgspec, typed)"] = _median_us(lambda: decoder.decode(body), rounds)

    def plan_checks() -> Any:
        tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls, "hermes")
        return [history_message(i, m) for i, m in enumerate(req.messages)]

    out["plan checks (messages, tools)"] = _median_us(plan_checks, rounds)
    msgs = plan_checks()
    tool_list = [t for t in (req.tools or [])]
    tool_list = msgspec.to_builtins(tool_list)

    def render() -> str:
        return text.apply_chat_template(msgs, tools=tool_list)

    out["chat template (jinja)"] = _median_us(render, rounds)
    prompt = render()
    ids = text.encode(prompt, add_special_tokens=False)
    out["encode, whole prompt (tokenizers encode)"] = _median_us(
        lambda: text.encode(prompt, add_special_tokens=False), max(5, rounds // 10)
    )
    out["encode, whole prompt (encode_batch_fast)"] = _median_us(
        lambda: text.encode_prompt(prompt), max(5, rounds // 10)
    )
    text.use_encode_cache(private_cache())
    previous = text.apply_chat_template(msgs[:-2], tools=tool_list)
    text.encode_prompt(previous)  # the previous turn, as the server saw it
    text.encode_prompt(prompt)
    assert text.encode_prompt(prompt) == ids
    fresh = [previous]

    def warm() -> Any:
        # The previous turn is cached, this turn's new text is not: a new cache each round.
        text.use_encode_cache(private_cache(1))
        text.encode_prompt(fresh[0])
        t0 = time.thread_time_ns()
        text.encode_prompt(prompt)
        return time.thread_time_ns() - t0

    warm_times = [warm() for _ in range(max(5, rounds // 10))]
    out["encode, through the cache (this turn's new text)"] = statistics.median(warm_times) / 1e3
    text.use_encode_cache(private_cache(1))
    text.encode_prompt(prompt)
    out["encode, through the cache (all of it cached)"] = _median_us(
        lambda: text.encode_prompt(prompt), rounds
    )
    out["prefix-affinity block hashes"] = _median_us(lambda: packed_hashes(ids, 256), rounds)
    request = TokenizedGenerateReqInput(
        rid="r" * 32, input_ids=ids, stream=True, sampling_params=SamplingParams(max_new_tokens=256)
    )
    out["the client's checks (validate_request)"] = _median_us(
        lambda: validate_request(request, max_model_len=131072), rounds
    )
    out["ADD encoding (msgpack)"] = _median_us(lambda: encode_add(request), rounds)
    out["detokenizer setup (prompt tail)"] = _median_us(
        lambda: text.detokenizer(prompt_ids=ids), rounds
    )
    for kind, answer in (("a tool call", call_text(turn)), ("a text answer", _TEXT_ANSWER)):
        out[f"per output token, {kind}: detokenizer, parser, event"] = _per_token_us(
            text, ids, answer, rounds
        )
    return out, len(ids)


#: The workload's scripted text answer (`tsfront.bench.agentic.script_rules`).
_TEXT_ANSWER = "Done with step 6: the change is made."


def _per_token_us(text: Any, prompt_ids: list[int], answer: str, rounds: int) -> float:
    """The worker's CPU per token of ``answer`` streamed one token a chunk: the choice's
    detokenizer step, its `OutputParser` (Hermes tools) and `ChatFormat.pieces` (median over
    ``rounds // 10`` answers, at least 5)."""
    from tsfront.serve.core.parsing import OutputParser
    from tsfront.serve.openai.formats import ChatFormat
    from tsfront.text.tools import make_tool_parser

    tokens = text.encode(answer, add_special_tokens=False)
    times = []
    for _ in range(max(5, rounds // 10)):
        detok = text.detokenizer(prompt_ids=prompt_ids)
        parser = OutputParser(None, make_tool_parser("hermes", None), True)
        fmt = ChatFormat("m", text, 1, False)
        t0 = time.thread_time_ns()
        for token in tokens:
            fmt.pieces(0, parser.feed(detok.step([token]), 1, [token]))
        fmt.pieces(0, parser.finish())
        times.append((time.thread_time_ns() - t0) / len(tokens))
    return statistics.median(times) / 1e3


def main(argv: list[str] | None = None) -> int:
    """Print the phases as a Markdown table."""
    p = argparse.ArgumentParser(prog="python -m tsfront.bench.agentic_phases")
    p.add_argument("--system-tokens", type=int, default=4000)
    p.add_argument("--turn", type=int, default=6)
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args(argv)
    out, tokens = phases(args.system_tokens, args.turn, args.rounds)
    print(f"| phase (one request, {tokens} prompt tokens) | worker CPU µs (median) |")
    print("|---|---:|")
    for name, us in out.items():
        print(f"| {name} | {us:,.1f} |" if us < 10 else f"| {name} | {us:,.0f} |")
    return 0


if __name__ == "__main__":
    asyncio.run(asyncio.sleep(0))
    raise SystemExit(main())
