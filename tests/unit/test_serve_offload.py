"""The rules under issue 36's fixes, without a server: large work sized by the work
(`tsfront.serve.core.offload`), the nesting and surrogate checks
(`tsfront.serve.core.limits.check_json`) and the reasoning tokens counted from the engine's tokens
(`OutputParser.reasoning_tokens`). The HTTP attacks themselves are in
tests/hardening/test_serve_hostile_loop.py."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from tsfront.serve.core.limits import MAX_NESTING, Refused, check_json
from tsfront.serve.core.offload import OFFLOAD_CHARS, Offload, text_chars
from tsfront.serve.core.parsing import OutputParser
from tsfront.text.reasoning import make_reasoning_parser


def nested(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


# ---------------------------------------------------------------------- offload


def test_text_chars_counts_strings_and_stops_past_the_limit() -> None:
    history = [{"role": "user", "content": "x" * 100}, {"role": "assistant", "content": None}]
    # the list and each dict 1, keys and strings their length, None 1
    assert text_chars(history) == 1 + (1 + 4 + 4 + 7 + 100) + (1 + 4 + 9 + 7 + 1)
    assert OFFLOAD_CHARS < text_chars([{"content": "x" * 10**7}]) <= 10**7 + 20
    # A value of any size costs at most ~limit steps.
    assert text_chars(list(range(10**6))) == OFFLOAD_CHARS + 1
    assert text_chars(nested(5000), limit=100) == 101


async def test_small_work_runs_on_the_loop_and_large_work_on_a_thread() -> None:
    offload = Offload()
    main = threading.get_ident()
    assert await offload.run(OFFLOAD_CHARS, threading.get_ident) == main
    assert await offload.run(OFFLOAD_CHARS + 1, threading.get_ident) != main

    def fail() -> None:
        raise ValueError("the work's own error")

    with pytest.raises(ValueError, match="the work's own error"):
        await offload.run(10**6, fail)


async def test_large_work_runs_one_at_a_time() -> None:
    offload = Offload()
    running = []
    peak = []
    gate = threading.Event()

    def work() -> None:
        running.append(1)
        peak.append(len(running))
        gate.wait(5)
        running.pop()

    tasks = [asyncio.ensure_future(offload.run(10**6, work)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert max(peak) == 1


# ---------------------------------------------------------------------- check_json


def test_nesting_is_checked_iteratively_at_any_depth() -> None:
    check_json(nested(MAX_NESTING), "tools")
    for levels in (MAX_NESTING + 1, 50_000):  # 50,000: far past any recursion limit
        with pytest.raises(Refused, match=f"at most {MAX_NESTING} levels") as caught:
            check_json({"a": nested(levels)}, "response_format")
        assert caught.value.param == "response_format"


def test_lone_surrogates_are_found_in_parsed_text_only() -> None:
    value = json.loads('{"city": ["\\ud800"]}')
    check_json(value, "messages")  # body-decoded values cannot hold one: not looked for
    with pytest.raises(Refused, match="lone UTF-16 surrogate") as caught:
        check_json(value, "messages", "messages[1].tool_calls[0].function.arguments", text=True)
    assert "messages[1].tool_calls[0]" in str(caught.value)
    with pytest.raises(Refused, match="surrogate"):
        check_json(json.loads('{"\\udc00": 1}'), "messages", text=True)
    check_json(json.loads('{"ok": "\\ud83d\\ude00 é"}'), "messages", text=True)


# ---------------------------------------------------------------------- reasoning tokens


def parser(starts_inside: bool = False) -> OutputParser:
    return OutputParser(make_reasoning_parser("qwen3", starts_in_reasoning=starts_inside), None)


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        # one token a delta: every token up to the close tag's
        ([("<think>", 1), ("a", 1), ("b", 1), ("</think>", 1), ("\n\nok", 1)], 4),
        # the tag split over tokens: the token finishing it counts
        ([("<think>a", 1), ("</th", 1), ("ink>", 1), ("ok", 1)], 3),
        # a coalesced delta closing the section: its share by characters
        ([("<think>", 1), ("abcdefgh</think>", 4), ("x" * 24, 4)], 1 + 4),
        ([("<think>", 1), ("ab</think>" + "x" * 10, 4)], 1 + 2),
        # no section: nothing counts
        ([("plain", 3), (" text", 2)], 0),
        # an unclosed thought: all of it
        ([("<think>", 1), ("a" * 50, 7)], 8),
    ],
)
def test_reasoning_tokens_are_the_engine_tokens_of_the_section(
    deltas: list[tuple[str, int]], expected: int
) -> None:
    p = parser()
    for text, tokens in deltas:
        p.feed(text, tokens)
    p.finish()
    assert p.reasoning_tokens == expected
    thought = p.message()["reasoning_content"]
    whole = parser()
    whole.whole("".join(t for t, _ in deltas))
    assert whole.message()["reasoning_content"] == thought  # counting changes no text


def test_a_prompt_that_opens_the_section_counts_from_the_first_token() -> None:
    p = parser(starts_inside=True)
    for text in ("Hm", "m.", "</think>", "Four."):
        p.feed(text, 1)
    assert p.reasoning_tokens == 3
