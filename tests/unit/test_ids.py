"""Every id a client is shown comes from `secrets`, whatever state `random` is in.

`random` is patched so that every Mersenne Twister in the process (the module's own and any
`random.Random` instance) answers constants: an id drawn from one of them would repeat. The ids
of completions, chat completions, Responses items and tool calls (each parser's own and
Mistral's 9-character ones) must still all differ.
"""

from __future__ import annotations

import random
import re

import pytest

from tsfront import ids
from tsfront.serve.openai.formats import ChatFormat, CompletionFormat
from tsfront.text.tools import make_tool_parser


@pytest.fixture
def constant_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random.Random, "random", lambda self: 0.5)
    monkeypatch.setattr(random.Random, "getrandbits", lambda self, k: 0)
    monkeypatch.setattr(random, "random", lambda: 0.5)
    monkeypatch.setattr(random, "getrandbits", lambda k: 0)
    assert random.Random(1).random() == random.random() == 0.5  # the patch holds


def _call_ids(parser: str, text: str) -> list[str]:
    return [call.id for _ in range(20) for call in make_tool_parser(parser, None).parse(text).calls]


@pytest.mark.usefixtures("constant_random")
def test_ids_do_not_come_from_random() -> None:
    for shape in (ChatFormat, CompletionFormat):
        made = {shape("m", None, 1, False).id for _ in range(20)}
        assert len(made) == 20, made
    assert len({ids.item_id("msg") for _ in range(20)}) == 20
    calls = _call_ids("hermes", '<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert len(set(calls)) == 20 and all(re.fullmatch(r"call_[A-Za-z0-9]{24}", c) for c in calls)
    calls = _call_ids("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert len(set(calls)) == 20 and all(re.fullmatch(r"[A-Za-z0-9]{9}", c) for c in calls)


def test_the_shapes_of_the_ids() -> None:
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", ids.response_id("chatcmpl-"))
    assert re.fullmatch(r"resp_[0-9a-f]{24}", ids.response_id("resp_"))
    assert re.fullmatch(r"fc_[0-9a-f]{32}", ids.item_id("fc"))
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", ids.call_id())


def test_call_ids_use_every_letter_and_digit() -> None:
    # The base-62 digits of one uniform draw: each character is one of the 62, evenly.
    seen = "".join(ids.call_id(24, "") for _ in range(2000))
    counts = {c: seen.count(c) for c in set(seen)}
    assert len(counts) == 62
    expected = len(seen) / 62
    assert all(0.7 * expected < n < 1.3 * expected for n in counts.values()), counts
