"""Tool-call parsers over hostile model output: they never raise, and streamed equals whole.

A model (or a prompt it echoes) can write anything inside a call: JSON escapes of lone
surrogates (``"\\ud800"``, which no UTF-8 text holds once decoded), nesting thousands of
levels deep, numbers too large for ``int``/``float``, a 2,000-part dotted name, calls that
never end. Every format wraps such payloads as its calls' arguments (or names); Hypothesis
splits each output into deltas at random points and may cut it short (``max_tokens``). For
every split: no exception, the joined deltas equal the non-streamed parse, and everything a
parser returns is text a response can carry (UTF-8-encodable; arguments JSON objects).
"""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront.text.reasoning import make_reasoning_parser
from tsfront.text.tools import TOOL_PARSERS, Delta, ToolParser, assemble, make_tool_parser
from tsfront.text.tools.constrained import NamedToolParser, RequiredToolParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "obj": {"type": "object"},
                    "num": {"type": "number"},
                    "int": {"type": "integer"},
                    "text": {"type": "string"},
                },
            },
        },
    }
]
DEPTH = 3000
# JSON values a hostile model writes as an argument (JSON text; Python reads them too, but for
# true/false/null, which the pythonic cases write as Python).
VALUES = [
    '"\\ud800"',
    '"\\udfff"',
    '"a\\ud83db"',
    '"\\ud83d\\ude00"',
    '"\\udc00\\ud800"',
    '{"\\ud800": 1}',
    "[" * DEPTH + "]" * DEPTH,
    '{"a":' * DEPTH + "1" + "}" * DEPTH,
    "[" * DEPTH,
    "9" * 5000,
    "-" + "9" * 5000,
    "1e999",
    "-1e999",
    "1e-999",
    "0." + "0" * 5000 + "1",
    '"unterminated',
    "{",
    "NaN",
    "Infinity",
]
NAMES = ['"f"', '"\\ud800"', '"f\\udfff"', '"' + "a." * 2000 + 'f"']
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DSML = "｜DSML｜"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = (
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)


def outputs(parser: str, name: str, value: str) -> list[str]:
    """Outputs of format ``parser`` with a call named ``name`` (JSON text) whose argument is
    ``value``; and the value as the whole arguments."""
    args = f'{{"obj": {value}}}'
    bare = json.loads(name) if "\\u" not in name else "f"
    if parser == "hermes":
        return [
            f'<tool_call>\n{{"name": {name}, "arguments": {args}}}\n</tool_call>',
            f'<tool_call>{{"name": {name}, "arguments": {value}}}</tool_call>',
            f'Hi <tool_call>[{{"name": {name}, "arguments": {args}}}]',
        ]
    if parser == "llama3_json":
        return [
            f'<|python_tag|>{{"name": {name}, "parameters": {args}}}',
            f' {{"name": {name}, "parameters": {value}}}; {{"name": "g"}}',
        ]
    if parser == "mistral":
        return [
            f'[TOOL_CALLS][{{"name": {name}, "arguments": {args}}}]',
            f"[TOOL_CALLS]{bare}[ARGS]{args}",
            f"[TOOL_CALLS]{bare}[CALL_ID]abcdefghi[ARGS]{value}",
        ]
    if parser == "deepseek_v3":
        return [
            f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}{bare}\n```json\n{args}\n```"
            f"{DS_CALL_END}{DS_CALLS_END}",
        ]
    if parser == "deepseek_v31":
        return [f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}{bare}{DS_SEP}{value}{DS_CALL_END}{DS_CALLS_END}"]
    if parser == "qwen3_coder":
        return [
            f"<tool_call>\n<function={bare}>\n<parameter={key}>\n{value}\n</parameter>\n"
            "</function>\n</tool_call>"
            for key in ("obj", "num", "int", "text", "other")
        ]
    if parser == "pythonic":
        return [
            f"[{bare}(obj={value})]",
            f"<|python_start|>{bare}(obj={value}, more=[{value}])<|python_end|>",
            f"[{'a.' * 2000}f(x={value})]",
        ]
    if parser in ("deepseek_v32", "deepseek_v4"):
        block = "function_calls" if parser == "deepseek_v32" else "tool_calls"
        return [
            f'<{DSML}{block}><{DSML}invoke name="{bare}"><{DSML}parameter name="obj" '
            f'string="{kind}">{value}</{DSML}parameter></{DSML}invoke></{DSML}{block}>'
            for kind in ("true", "false")
        ]
    if parser == "kimi_k2":
        return [
            f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{bare}:0"
            f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>",
            f"<|tool_call_begin|>{bare}:1<|tool_call_argument_begin|>{value}<|tool_call_end|>",
        ]
    if parser in ("glm45", "glm47", "longcat"):
        p = "longcat_" if parser == "longcat" else ""
        return [
            f"<{p}tool_call>{bare}\n<{p}arg_key>{key}</{p}arg_key>\n<{p}arg_value>{value}"
            f"</{p}arg_value>\n</{p}tool_call>"
            for key in ("obj", "num", "text", "other")
        ] + ([f'<longcat_tool_call>{{"name": {name}, "arguments": {args}}}</longcat_tool_call>']
             if parser == "longcat" else [])  # fmt: skip
    if parser == "minimax_m2":
        return [
            f'<minimax:tool_call><invoke name="{bare}"><parameter name="{key}">{value}'
            "</parameter></invoke></minimax:tool_call>"
            for key in ("obj", "int", "text", "other")
        ]
    if parser == "kimi_k3":
        return [
            f'<|open|>tools<|sep|><|open|>call tool="{bare}" index="1"<|sep|><|open|>argument '
            f'key="obj" type="{kind}"<|sep|>{value}<|close|>argument<|sep|><|close|>call<|sep|>'
            "<|close|>tools<|sep|>"
            for kind in ("string", "object")
        ] + [
            f'<|open|>tools<|sep|><|open|>call tool="{bare}" index="1"<|sep|><|open|>json '
            f'type="object"<|sep|>{args}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools'
            "<|sep|>"
        ]
    if parser == "minimax_m3":
        ns = "]<]minimax[>["
        return [
            f'{ns}<tool_call>{ns}<invoke name="{bare}">{ns}<{key}>{value}{ns}</{key}>'
            f"{ns}</invoke>{ns}</tool_call>"
            for key in ("obj", "num", "text", "other")
        ]
    if parser == "inkling":
        return [
            f'<|message_model|>{bare}<|content_invoke_tool_json|>{{"name": {name}, "args": '
            f"{args}}}<|end_message|>",
            f'<|content_invoke_tool_json|>{{"name": {name}, "args": {value}}}<|end_message|>',
        ]
    if parser == "nemotron":
        return [
            f'<TOOLCALL>[{{"name": {name}, "arguments": {args}}}]</TOOLCALL>',
            f"<tool_call><function={bare}><parameter=obj>{value}</parameter></function>"
            "</tool_call>",
        ]
    if parser == "required":
        return [f'[{{"name": {name}, "parameters": {args}}}]']
    if parser == "named":
        return [args, value]
    raise AssertionError(parser)


PARSERS = [*sorted(TOOL_PARSERS), "required", "named"]


def fresh(parser: str) -> ToolParser:
    if parser == "required":
        return RequiredToolParser(TOOLS)
    if parser == "named":
        return NamedToolParser(TOOLS, "f")
    return make_tool_parser(parser, TOOLS)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in pairwise([0, *points, len(text)])]


def check_carriable(content: str, calls: list[Any], broken: list[int]) -> None:
    """What a parser returns can go into a response: UTF-8 text, arguments a JSON object or,
    for a call the model broke after its start went out (docs/TEXT.md), the unclosed object
    written so far, which no JSON parser accepts (a client never runs it as it stands)."""
    content.encode("utf-8")
    for call in calls:
        call.name.encode("utf-8")
        call.arguments.encode("utf-8")
        if call.index in broken:
            assert call.arguments.startswith("{")
            with pytest.raises(ValueError):
                json.loads(call.arguments)
        else:
            assert isinstance(json.loads(call.arguments), dict)
        msgspec.json.encode({"name": call.name, "arguments": call.arguments})


CASES = [
    (parser, text)
    for parser in PARSERS
    for name in NAMES
    for value in VALUES
    for text in outputs(parser, name, value)
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_output_never_raises_and_streamed_equals_whole(data: Any) -> None:
    parser, text = data.draw(st.sampled_from(CASES))
    cut = data.draw(st.sampled_from([len(text), data.draw(st.integers(0, len(text)))]))
    length = cut < len(text)
    text = text[:cut]
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=30))
    whole = fresh(parser).parse(text, length)
    p = fresh(parser)
    deltas: list[Delta] = []
    for piece in split(text, cuts):
        deltas += p.feed(piece)
    deltas += p.finish(length)
    got = assemble(deltas, p.incomplete, p.broken)
    assert (got.content, [(c.name, c.arguments) for c in got.calls], got.incomplete) == (
        whole.content,
        [(c.name, c.arguments) for c in whole.calls],
        whole.incomplete,
    )
    assert got.broken == whole.broken
    check_carriable(whole.content, whole.calls, whole.broken)


@pytest.mark.parametrize("parser", PARSERS)
def test_every_hostile_case_parses_whole_one_character_at_a_time_too(parser: str) -> None:
    for text in (t for p, t in CASES if p == parser and len(t) < 400):
        whole = fresh(parser).parse(text)
        check_carriable(whole.content, whole.calls, whole.broken)
        p = fresh(parser)
        deltas: list[Delta] = []
        for c in text:
            deltas += p.feed(c)
        deltas += p.finish()
        got = assemble(deltas, p.incomplete)
        assert [(c.name, c.arguments) for c in got.calls] == [
            (c.name, c.arguments) for c in whole.calls
        ]
        assert got.content == whole.content


LONE = {
    "hermes": '<tool_call>{"name": "f", "arguments": {"k": "\\ud800"}}</tool_call>',
    "llama3_json": '{"name": "f", "parameters": {"k": "\\ud800"}}',
    "mistral": '[TOOL_CALLS]f[ARGS]{"k": "\\ud800"}',
    "deepseek_v3": f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}f\n```json\n"
    f'{{"k": "\\ud800"}}\n```{DS_CALL_END}{DS_CALLS_END}',
    "deepseek_v31": f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}f{DS_SEP}{{"k": "\\ud800"}}{DS_CALL_END}'
    f"{DS_CALLS_END}",
    "qwen3_coder": '<tool_call><function=f><parameter=k>"\\ud800"</parameter></function>'
    "</tool_call>",
    "pythonic": '[f(k="\\ud800")]',
    "deepseek_v32": f'<{DSML}function_calls><{DSML}invoke name="f"><{DSML}parameter name="k" '
    f'string="false">"\\ud800"</{DSML}parameter></{DSML}invoke></{DSML}function_calls>',
    "deepseek_v4": f'<{DSML}tool_calls><{DSML}invoke name="f"><{DSML}parameter name="k" '
    f'string="false">"\\ud800"</{DSML}parameter></{DSML}invoke></{DSML}tool_calls>',
    "kimi_k2": '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"k": "\\ud800"}'
    "<|tool_call_end|>",
    "glm45": '<tool_call>f<arg_key>k</arg_key><arg_value>"\\ud800"</arg_value></tool_call>',
    "glm47": '<tool_call>f<arg_key>k</arg_key><arg_value>"\\ud800"</arg_value></tool_call>',
    "minimax_m2": '<minimax:tool_call><invoke name="f"><parameter name="k">"\\ud800"</parameter>'
    "</invoke></minimax:tool_call>",
    "longcat": '<longcat_tool_call>{"name": "f", "arguments": {"k": "\\ud800"}}'
    "</longcat_tool_call>",
    "nemotron": '<TOOLCALL>[{"name": "f", "arguments": {"k": "\\ud800"}}]</TOOLCALL>',
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument '
    'key="k" type="object"<|sep|>"\\ud800"<|close|>argument<|sep|><|close|>call<|sep|>'
    "<|close|>tools<|sep|>",
    "minimax_m3": ']<]minimax[>[<tool_call>]<]minimax[>[<invoke name="f">]<]minimax[>[<k>'
    '"\\ud800"]<]minimax[>[</k>]<]minimax[>[</invoke>]<]minimax[>[</tool_call>',
    "inkling": '<|content_invoke_tool_json|>{"name": "f", "args": {"k": "\\ud800"}}<|end_message|>',
    "required": '[{"name": "f", "parameters": {"k": "\\ud800"}}]',
    "named": '{"k": "\\ud800"}',
}


@pytest.mark.parametrize("parser", PARSERS)
def test_a_lone_surrogate_is_kept_as_its_json_escape(parser: str) -> None:
    # The rule of docs/TEXT.md: the call stays a call, and its arguments are the model's JSON
    # with the surrogate written as its escape (ASCII), never as a raw code point.
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"properties": {"k": {"type": "object"}}}},
        }
    ]
    p = (
        RequiredToolParser(tools)
        if parser == "required"
        else NamedToolParser(tools, "f")
        if parser == "named"
        else make_tool_parser(parser, tools)
    )
    parsed = p.parse(LONE[parser])
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", '{"k":"\\ud800"}')]
    assert json.loads(parsed.calls[0].arguments) == {"k": "\ud800"}


def test_a_surrogate_pair_written_as_two_escapes_is_one_character() -> None:
    parsed = make_tool_parser("hermes").parse(
        '<tool_call>{"name": "f", "arguments": {"k": "\\ud83d\\ude00"}}</tool_call>'
    )
    assert parsed.calls[0].arguments == '{"k":"\U0001f600"}'
    # Python source escapes are two code points: written as the escapes, JSON joins them.
    py = make_tool_parser("pythonic").parse('[f(k="\\ud83d\\ude00")]')
    assert py.calls[0].arguments == '{"k":"\\ud83d\\ude00"}'
    assert json.loads(py.calls[0].arguments) == {"k": "\U0001f600"}


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", "required"])
def test_a_name_that_decodes_to_a_lone_surrogate_is_no_call(parser: str) -> None:
    text = {
        "hermes": '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
        "llama3_json": '{"name": "\\ud800", "parameters": {}}',
        "mistral": '[TOOL_CALLS][{"name": "\\ud800", "arguments": {}}]',
        "required": '[{"name": "\\ud800", "parameters": {}}]',
    }[parser]
    parsed = fresh(parser).parse(text)
    assert not parsed.calls and parsed.content == text


def test_a_pythonic_call_behind_a_deep_dotted_name() -> None:
    name = "a." * 2000 + "f"
    parsed = make_tool_parser("pythonic").parse(f"[{name}(x=1)]")
    assert [(c.name, c.arguments) for c in parsed.calls] == [(name, '{"x":1}')]
    # Deeper than the parser can build: no call, the text is content.
    deeper = f"[{'a.' * 100_000}f(x=1)]"
    assert make_tool_parser("pythonic").parse(deeper).content == deeper


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(["<think>", "</think>", "<", "<th", "</thi", " ", "\n\n", "\t", "a", "é"]),
        max_size=40,
    ),
    cuts=st.lists(st.integers(0, 400), max_size=20),
    inside=st.booleans(),
)
def test_reasoning_split_is_split_invariant_on_blank_runs_and_tag_pieces(
    parts: list[str], cuts: list[int], inside: bool
) -> None:
    text = "".join(parts)
    whole = make_reasoning_parser("deepseek_r1", starts_in_reasoning=inside).parse(text)
    p = make_reasoning_parser("deepseek_r1", starts_in_reasoning=inside)
    reasoning, content = [], []
    for piece in split(text, cuts):
        r, c = p.feed(piece)
        reasoning.append(r)
        content.append(c)
    r, c = p.finish()
    assert ("".join(reasoning) + r, "".join(content) + c) == whole
