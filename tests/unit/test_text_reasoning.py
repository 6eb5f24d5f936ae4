"""Reasoning parsers: ``<think>…</think>`` split from content, whatever the split of the text.

Outputs as DeepSeek-R1 and Qwen3 write them (the model opens the section, or the template
opened it in the prompt), split at random points by Hypothesis and one character at a time:
the joined reasoning and content must equal the non-streamed split and the intended one, and
no tag text may be in either field.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsfront.text.reasoning import (
    REASONING_PARSERS,
    ReasoningParser,
    make_reasoning_parser,
    starts_in_reasoning,
)

THOUGHT = "\nThe user wants 2+2. <b>Bold</b> < not a tag; 日本 😀\n"
ANSWER = "\n\nThe answer is 4."

# (parser, starts_in_reasoning, enabled, output, reasoning, content)
CASES = [
    ("deepseek_r1", False, True, f"<think>{THOUGHT}</think>{ANSWER}", THOUGHT, ANSWER),
    ("deepseek_r1", True, True, f"{THOUGHT}</think>{ANSWER}", THOUGHT, ANSWER),
    ("deepseek_r1", False, True, f"\n\n<think>{THOUGHT}</think>{ANSWER}", THOUGHT, ANSWER),
    ("deepseek_r1", False, True, "No reasoning here <think> at all", "", "No reasoning here "
     "<think> at all"),
    ("deepseek_r1", True, True, f"{THOUGHT} cut off", f"{THOUGHT} cut off", ""),
    ("qwen3", False, True, f"<think>{THOUGHT}</think>{ANSWER}<think>x</think>", THOUGHT,
     f"{ANSWER}<think>x</think>"),
    ("qwen3", False, False, f"{ANSWER} <think>", "", f"{ANSWER} <think>"),
    ("qwen3", False, True, "<think>\n\n</think>\n\nHi", "\n\n", "\n\nHi"),
    # The other families: their own tags, the same rules.
    ("glm47", True, True, f"{THOUGHT}</think>{ANSWER}", THOUGHT, ANSWER),
    ("longcat", True, True, f"{THOUGHT}</longcat_think>{ANSWER}", THOUGHT, ANSWER),
    ("longcat", False, True, f"<longcat_think>{THOUGHT}</longcat_think>{ANSWER}", THOUGHT,
     ANSWER),
    ("minimax_m3", False, True, f"<mm:think>{THOUGHT}</mm:think>{ANSWER}", THOUGHT, ANSWER),
    ("mistral", False, True, f"[THINK]{THOUGHT}[/THINK]{ANSWER}", THOUGHT, ANSWER),
    # A bare close tag first: a turn without reasoning.
    ("minimax_m3", False, True, f"</mm:think>{ANSWER}", "", ANSWER),
    ("deepseek_r1", False, True, f"\n</think>{ANSWER}", "", ANSWER),
    # Kimi-K3's channels: think is the reasoning, the answer's channel tags are dropped.
    ("kimi_k3", True, True, f"{THOUGHT}<|close|>think<|sep|><|open|>response<|sep|>{ANSWER}"
     "<|close|>response<|sep|><|close|>message<|sep|>", THOUGHT, ANSWER),
    ("kimi_k3", False, True, f"{ANSWER}<|close|>response<|sep|><|open|>tools<|sep|>",
     "", f"{ANSWER}<|open|>tools<|sep|>"),
    # Inkling: every thinking block is reasoning; the framing stays for the tool parser.
    ("inkling", False, True, f"<|content_thinking|>{THOUGHT}<|end_message|><|message_model|>"
     f"<|content_text|>{ANSWER}<|end_message|>", THOUGHT,
     f"<|message_model|><|content_text|>{ANSWER}<|end_message|>"),
    ("inkling", False, True, "<|content_thinking|>a<|end_message|>X<|content_thinking|>b"
     "<|end_message|>Y", "ab", "XY"),
]  # fmt: skip


def run(case: tuple[Any, ...], pieces: list[str]) -> tuple[str, str]:
    name, sir, enabled = case[:3]
    parser = make_reasoning_parser(name, starts_in_reasoning=sir, enabled=enabled)
    reasoning, content = [], []
    for piece in pieces:
        r, c = parser.feed(piece)
        reasoning.append(r)
        content.append(c)
    r, c = parser.finish()
    return "".join(reasoning) + r, "".join(content) + c


@pytest.mark.parametrize("case", CASES)
def test_non_streamed_split(case: tuple[Any, ...]) -> None:
    name, sir, enabled, text, reasoning, content = case
    parser = make_reasoning_parser(name, starts_in_reasoning=sir, enabled=enabled)
    assert parser.parse(text) == (reasoning, content)
    assert run(case, list(text)) == (reasoning, content)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("case", CASES)
def test_every_split_gives_the_same_fields(case: tuple[Any, ...], data: Any) -> None:
    text, reasoning, content = case[3:]
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=30))))
    bounds = [0, *cuts, len(text)]
    got = run(case, [text[a:b] for a, b in pairwise(bounds)])
    assert got == (reasoning, content)
    if case[2]:
        cls = REASONING_PARSERS[case[0]]
        assert cls.end not in got[0] and cls.start not in got[0]


def test_tag_prefix_is_held_back_then_released() -> None:
    parser = make_reasoning_parser("deepseek_r1", starts_in_reasoning=True)
    assert parser.feed("thinking </th") == ("thinking ", "")
    assert parser.in_reasoning
    assert parser.feed("ink>done") == ("", "done")
    assert not parser.in_reasoning
    assert parser.feed("more") == ("", "more")


def test_starts_in_reasoning_from_the_prompt_tail() -> None:
    assert REASONING_PARSERS["longcat"].prompt_opens("<longcat_assistant><longcat_think>\n")
    assert not REASONING_PARSERS["longcat"].prompt_opens("<longcat_assistant>")
    assert starts_in_reasoning("<｜User｜>Hi<｜Assistant｜><think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n")


def test_registry_and_unknown_name() -> None:
    assert set(REASONING_PARSERS) == {
        "deepseek_r1", "qwen3", "deepseek_v4", "glm45", "glm47", "kimi_k2", "minimax_m2",
        "nemotron_v3", "longcat", "minimax_m3", "kimi_k3", "inkling", "mistral",
    }  # fmt: skip
    assert isinstance(make_reasoning_parser("qwen3"), ReasoningParser)
    with pytest.raises(ValueError, match="deepseek_r1"):
        make_reasoning_parser("nope")
