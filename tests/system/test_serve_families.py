"""Every model family through ``tsfront serve`` with the official ``openai`` client: the table.

For each family TokenSpeed serves (issue 37's table, and the families added since), a real
server (master, I/O process, one worker) with the family's ``--tool-call-parser`` (and its
``--reasoning-parser``) runs against a simulated rank whose script answers with the exact text
that model writes: one call, two parallel calls, text (after a thought) then a call; the
arguments hold nested objects, non-ASCII text and characters JSON escapes (quotes,
backslashes, tabs). The model folder's tokenizer has the family's tags as the tokens they are
in its real tokenizer (special tokens where the model's are; the server detokenizes with
``skip_special_tokens`` on). Each output is asked for three ways: not streamed, streamed one
token per engine step, and streamed in steps of 1 to 4 tokens (speculative decoding, a
``--stream-interval``). A check passes when the answer is the intended one (the content, the
calls: names, arguments as JSON equal to the intended objects, ``finish_reason``
``tool_calls``, no markup in the content) and a stream equals the whole answer (content, the
arguments text itself, the reasoning), in OpenAI's delta shapes. 3 outputs x 3 ways = 9 checks
per family.

The table is printed (``family | parser | passed/total``)::

    .venv/bin/python -m pytest -q tests/system/test_serve_families.py

And the same servers show that arguments stream while the model writes them: a 295-token
``write_file`` call, one token per step, arrives in many argument deltas, the first before half
of the arguments were written (a JSON family and an XML-parameter family).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from support.serve_fixtures import Served, start_scripted, start_together
from support.tool_outputs import (
    DS,
    K3,
    NS,
    Call,
    deepseek_v3,
    deepseek_v31,
    dsml,
    glm,
    hermes,
    inkling,
    kimi_k2,
    kimi_k3,
    llama3_json,
    longcat,
    minimax_m2,
    minimax_m3,
    mistral,
    nemotron,
    pythonic,
    qwen3_coder,
)

from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model

TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content or "" }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "filters": {"type": "object"},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
WRITE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    },
}
TOOLS = [WEATHER, TIME, WRITE]

# Nested objects, non-ASCII text, characters JSON escapes.
ARGS = {
    "city": 'Zürich "Old Town" \\ 日本 ☃ 😀 a<b',
    "days": 3,
    "metric": True,
    "filters": {"a": [1, {"b": None}], "note": 'tab\there "q"'},
}
TZ = {"tz": "Europe/Paris"}
THOUGHT = "The user wants the weather; a tool answers that."
TEXT = 'Let me check that: 1 < 2 & "quotes".\n'
# A long file: its write_file call is about 295 tokens of the test tokenizer (270 to 320 in
# the two formats below, checked there), as the call issue 37 measured.
FILE = {
    "path": "src/app/main.py",
    "content": "".join(f"def f{i}(x):\n    return x * {i}  # é\n" for i in range(10)),
}

INKLING = ["<|message_model|>", "<|content_text|>", "<|content_thinking|>",
           "<|content_invoke_tool_json|>", "<|content_invoke_tool_text|>", "<|end_message|>",
           "<|content_model_end_sampling|>"]  # fmt: skip


@dataclass
class Family:
    """One row of the table: how its model writes calls, and how its tokenizer holds tags."""

    label: str
    parser: str
    write: Callable[[list[Call]], str]
    reasoning: str | None = None
    think: tuple[str, str] = ("<think>", "</think>")
    special: list[str] = field(default_factory=list)  # single special tokens
    added: list[str] = field(default_factory=list)  # single non-special tokens
    # How text before a call looks (the formats that take none at the start, "text then a
    # call" through their tag).
    text_then: Callable[[list[Call]], str] | None = None

    def output(self, case: str) -> tuple[str, str, list[Call], str]:
        """(the model's text, the content, the calls, the reasoning) of ``case``."""
        one: list[Call] = [("get_weather", ARGS)]
        if case == "one":
            return self.write(one), "", one, ""
        if case == "two":
            two: list[Call] = [("get_weather", ARGS), ("get_time", TZ)]
            return self.write(two), "", two, ""
        thought = ""
        if self.reasoning is not None:
            start, end = self.think
            thought = f"{start}{THOUGHT}{end}"
        if self.parser == "kimi_k3":  # the answer inside its channel
            return thought + kimi_k3(one, TEXT), TEXT, one, THOUGHT
        if self.parser == "inkling":
            text = f"<|message_model|><|content_text|>{TEXT}<|end_message|>"
            return thought + text + inkling(one), TEXT, one, THOUGHT
        call = (self.text_then or self.write)(one)
        return thought + TEXT + call, TEXT, one, THOUGHT if self.reasoning else ""


DS_TAGS = list(DS.values())
QWEN_XML = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
            "</parameter>"]  # fmt: skip
GLM_TAGS = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
            "</arg_value>", "<think>", "</think>"]  # fmt: skip
KIMI_TAGS = [
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
]

FAMILIES = [
    Family("DeepSeek-V3 / R1-0528", "deepseek_v3", deepseek_v3, "deepseek_r1",
           special=DS_TAGS, added=["<think>", "</think>"]),
    Family("DeepSeek-V3.1", "deepseek_v31", deepseek_v31, "deepseek_r1", special=DS_TAGS,
           added=["<think>", "</think>"]),
    Family("DeepSeek-V3.2 (DSML)", "deepseek_v32", dsml("function_calls"), "deepseek_r1",
           added=["<think>", "</think>"]),
    Family("DeepSeek-V4", "deepseek_v4", dsml("tool_calls"), "deepseek_v4",
           added=["<think>", "</think>"]),
    Family("Kimi-K2", "kimi_k2", kimi_k2, "kimi_k2", special=KIMI_TAGS,
           added=["<think>", "</think>"]),
    Family("GLM-4.5", "glm45", glm("\n"), "glm45", special=GLM_TAGS),
    Family("GLM-4.7 / GLM-5", "glm47", glm(""), "glm47", special=GLM_TAGS),
    Family("MiniMax-M2", "minimax_m2", minimax_m2, "minimax_m2",
           special=["<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>"]),
    Family("Qwen3-Coder XML", "qwen3_coder", qwen3_coder, "qwen3", added=QWEN_XML),
    Family("Qwen (hermes)", "hermes", hermes, "qwen3",
           added=["<tool_call>", "</tool_call>", "<think>", "</think>"]),
    Family("Llama 3 JSON", "llama3_json", llama3_json, special=["<|python_tag|>"],
           text_then=lambda calls: llama3_json(calls, tagged=True)),
    Family("Mistral", "mistral", lambda calls: mistral(calls, v11=len(calls) > 1),
           special=["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]),
    Family("pythonic", "pythonic", pythonic, special=["<|python_start|>", "<|python_end|>"],
           text_then=lambda calls: pythonic(calls, tagged=True)),
    Family("Nemotron", "nemotron", nemotron, "nemotron_v3",
           special=["<TOOLCALL>", "</TOOLCALL>", "<think>", "</think>"]),
    Family("Kimi-K3", "kimi_k3", kimi_k3, "kimi_k3", think=("<|open|>think<|sep|>",
           "<|close|>think<|sep|>"), special=[*K3, "<|end_of_msg|>"]),
    Family("MiniMax-M3", "minimax_m3", minimax_m3, "minimax_m3",
           think=("<mm:think>", "</mm:think>"), special=[NS, "<mm:think>", "</mm:think>"]),
    Family("Inkling", "inkling", inkling, "inkling",
           think=("<|content_thinking|>", "<|end_message|>"), special=INKLING),
    Family("LongCat-Flash", "longcat", longcat, "longcat",
           think=("<longcat_think>", "</longcat_think>"),
           special=["<longcat_tool_call>", "</longcat_tool_call>", "<longcat_think>",
                    "</longcat_think>"]),
]  # fmt: skip
CASES = ("one", "two", "text")
WAYS = ("whole", "stream 1", "stream 1-4")


# -- the servers ----------------------------------------------------------------------------------


def rules(family: Family) -> list[tuple[str, str]]:
    out = [(f"CASE_{case.upper()}<", family.output(case)[0]) for case in CASES]
    out.append(("CASE_FILE<", family.write([("write_file", FILE)])))
    return out


@contextmanager
def served(family: Family, base: Path, step_ms: float = 0.2) -> Iterator[dict[str, Served]]:
    """Two servers of ``family``: its rank streams one token per step, and 1 to 4, a step every
    ``step_ms``."""
    folder = make_test_model(
        base / family.parser,
        "bytelevel",
        special_tokens=family.special,
        added_tokens=family.added,
        chat_template=TEMPLATE,
    )
    model = TextModel.load(folder)
    args = ["--tool-call-parser", family.parser]
    if family.reasoning is not None:
        args += ["--reasoning-parser", family.reasoning]
    starts = {
        way: lambda chunk=chunk: start_scripted(
            folder,
            model,
            Script(rules(family), folder),
            args=args,
            sim_options={"chunk_tokens": chunk, "step_ms": step_ms},
        )
        for way, chunk in (("stream 1", 1), ("stream 1-4", 4))
    }
    with start_together(starts, Served.close) as started:
        yield started


def _name(s: Served) -> str:
    return Path(s.model).name  # the folder's name: the model the server serves


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=30)


def ask(s: Served, case: str, stream: bool) -> dict[str, Any]:
    """The answer to ``case``: ``content``, ``reasoning``, ``calls`` [(id, name, arguments)],
    ``finish``, and for a stream its content deltas."""
    messages = [{"role": "user", "content": f"CASE_{case.upper()}<"}]
    c = client(s)
    if not stream:
        out = c.chat.completions.create(model=_name(s), messages=messages, tools=TOOLS)
        (choice,) = out.choices
        message = choice.message
        return {
            "content": message.content or "",
            "reasoning": getattr(message, "reasoning_content", None) or "",
            "calls": [
                (t.id, t.function.name, t.function.arguments) for t in message.tool_calls or []
            ],
            "finish": choice.finish_reason,
            "deltas": [],
        }
    events = c.chat.completions.create(model=_name(s), messages=messages, tools=TOOLS, stream=True)
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[Any]] = {}
    finish = None
    for chunk in events:
        if not chunk.choices:
            continue
        (choice,) = chunk.choices
        delta = choice.delta
        if delta.content:
            content.append(delta.content)
        extra = getattr(delta, "reasoning_content", None)
        if extra:
            reasoning.append(extra)
        for call in delta.tool_calls or []:
            if call.index not in calls:
                # OpenAI's first delta of a call: index, id, type, name, arguments "".
                assert call.id and call.type == "function" and call.function.name
                assert call.function.arguments == ""
                calls[call.index] = [call.id, call.function.name, []]
            else:
                assert not call.id and not call.function.name
                calls[call.index][2].append(call.function.arguments)
        if choice.finish_reason is not None:
            assert finish is None
            finish = choice.finish_reason
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning),
        "calls": [(i, n, "".join(a)) for i, n, a in (calls[k] for k in sorted(calls))],
        "finish": finish,
        "deltas": content,
        "arg_deltas": [a for k in sorted(calls) for a in calls[k][2]],
    }


MARKUP = ("<tool_call", "</tool_call", "<function", "<parameter", "[TOOL_CALLS", "[ARGS",
          "<|python", "\uff5c", "<|tool", "<arg_", "<minimax", "<invoke", "<TOOLCALL",
          "<longcat", "<think", "</think", "<|open|>", "<|close|>", "<|sep|>", NS, "<mm:",
          "<|message_model", "<|content_", "<|end_message")  # fmt: skip


def check(family: Family, case: str, got: dict[str, Any], whole: dict[str, Any] | None) -> None:
    """The answer is the intended one (and, streamed, equals the whole one)."""
    _, content, calls, reasoning = family.output(case)
    assert got["finish"] == "tool_calls", got["finish"]
    assert got["content"] == content, got["content"]
    assert [(n, json.loads(a)) for _, n, a in got["calls"]] == calls, got["calls"]
    assert got["reasoning"] == reasoning, got["reasoning"]
    for piece in [got["content"], *got["deltas"]]:
        assert not any(m in piece for m in MARKUP), piece
    if family.parser == "kimi_k2":
        assert [i for i, _, _ in got["calls"]] == [f"functions.{n}:{k}" for k, (n, _) in
                                                   enumerate(calls)]  # fmt: skip
    if whole is not None:
        # The stream is the whole answer: content, reasoning, the arguments' very text.
        assert [(n, a) for _, n, a in got["calls"]] == [(n, a) for _, n, a in whole["calls"]]
        assert (got["content"], got["reasoning"]) == (whole["content"], whole["reasoning"])


@dataclass
class Row:
    family: Family
    passed: int = 0
    failures: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Row]:
    base = tmp_path_factory.mktemp("families")
    rows: dict[str, Row] = {}
    for family in FAMILIES:
        row = rows[family.parser] = Row(family)
        try:
            with served(family, base) as servers:
                for case in CASES:
                    whole = None
                    for way in WAYS:
                        s = servers["stream 1" if way == "whole" else way]
                        try:
                            got = ask(s, case, stream=way != "whole")
                            check(family, case, got, whole)
                            if way == "whole":
                                whole = got
                            row.passed += 1
                        except Exception as exc:  # a failed check is counted, then reported
                            failure = f"{case}, {way}: {type(exc).__name__}: {exc}"
                            row.failures.append(failure[:400])
        except RuntimeError as exc:  # the server refused the flags (no such parser)
            row.failures.append(f"refused: {exc}"[:400])
    return rows


# The fixture starts two servers per family, one family after the other (~4 s each).
@pytest.mark.timeout(600)
def test_the_table_of_families(table: dict[str, Row], capsys: pytest.CaptureFixture) -> None:
    total = len(CASES) * len(WAYS)
    lines = ["| family | parser | passed/total |", "|---|---|---|"]
    lines += [
        f"| {r.family.label} | {p} | "
        + (
            "refused"
            if r.failures and r.failures[0].startswith("refused")
            else f"{r.passed}/{total}"
        )
        + " |"
        for p, r in table.items()
    ]
    passed = sum(r.passed for r in table.values())
    lines.append(f"| **all** | | **{passed}/{total * len(table)}** |")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    failures = [f"{p}: {f}" for p, r in table.items() for f in r.failures]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("parser", ["hermes", "glm47"])
def test_a_long_call_streams_its_arguments_as_they_are_written(
    tmp_path: Path, parser: str, capsys: pytest.CaptureFixture
) -> None:
    # A write_file call of 295 argument tokens, one token per engine step: the arguments come
    # in many deltas, the first one short (written before half of them were generated), not
    # one delta at the call's end.
    family = next(f for f in FAMILIES if f.parser == parser)
    # Steps of 3 ms (about a second for the call): a worker on a loaded machine keeps up with
    # them, so each delta holds what one step wrote, as on a real engine's pace (at 0.2 ms a
    # step a busy worker reads several steps at once and the count of deltas says nothing).
    with served(family, tmp_path, step_ms=3.0) as servers:
        s = servers["stream 1"]
        model = TextModel.load(tmp_path / parser)
        text = family.write([("write_file", FILE)])
        ids = model.encode(text, add_special_tokens=False)
        got = ask(s, "file", stream=True)
    ((_, name, arguments),) = got["calls"]
    assert name == "write_file" and json.loads(arguments) == FILE
    deltas = got["arg_deltas"]
    first = deltas[0]
    tokens = len(ids)
    assert 260 <= tokens <= 330, tokens  # the call as the issue measured it (~295 tokens)
    # Streamed as written: as many deltas as a good part of its tokens, the first one tiny.
    with capsys.disabled():
        print(
            f"\n{parser}: a write_file call of {tokens} tokens, one a step: "
            f"{len(deltas)} argument deltas, the first {first!r} ({len(first)} of "
            f"{len(arguments)} characters)"
        )
    # A worker's drain sends what it read of several steps as one event (a loaded machine's
    # worker reads two or three at once: 153 deltas for 322 tokens was seen beside the full
    # suite), so "many" is a quarter of the tokens; one delta at the end would be 1.
    assert len(deltas) > tokens // 4, (len(deltas), tokens)
    assert len(first) < len(arguments) // 20, first
