"""Tool-call parsers: streamed deltas equal the non-streamed parse for every split.

Every format has realistic outputs (several calls, text then a call, a parameterless call,
nested JSON with braces, quotes, escapes and non-ASCII text in strings, a call after a
reasoning section). Hypothesis splits each one at random points; the joined deltas must be
the non-streamed result, which must be the intended content and calls (arguments parsed as
JSON equal to the intended objects), with no markup in the content. Arguments stream: each
call's start goes out before its end is read, and its fragments are the canonical JSON text
in pieces. Cutting an output at a random point (a stream that ends mid-call at ``max_tokens``)
must give a prefix of the full result: the calls emitted are the full output's first calls,
whole, but for a call the cut broke, whose arguments are a prefix of its full arguments (and
never valid JSON); then the parser is ``incomplete``. Then the same through a real tokenizer,
with the tags as single added tokens and split over several tokens, streamed by the
detokenizer in random chunks.
"""

from __future__ import annotations

import json
import random
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tool_outputs import (
    K3_TYPES,
    deepseek_v3,
    deepseek_v31,
    dsml,
    hermes,
    json_text,
    k3_tag,
    kimi_k2,
    longcat,
    minimax_m2,
    minimax_m3,
    nemotron,
    param_text,
    qwen3_coder,
)

from tsfront.text import TextModel
from tsfront.text.reasoning import make_reasoning_parser
from tsfront.text.testing import make_test_model
from tsfront.text.tools import (
    TOOL_PARSERS,
    CallArgs,
    CallStart,
    Content,
    Delta,
    Parsed,
    ToolCallError,
    assemble,
    make_tool_parser,
    named_schema,
    parse_named,
    parse_required,
    required_schema,
)
from tsfront.text.tools.constrained import NamedToolParser, RequiredToolParser
from tsfront.text.tools.jsontext import close_object

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array"},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
]

NESTED = {
    "path": "src/a {b}.py",
    "content": 'def f():\n    return {"k": [1, 2]}  # "quoted" \\ back\tslash é 日本 😀',
}
WEATHER = {"city": "Paris", "days": 3}


_j = json_text


DS3_CALL = (
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"
)
DS31_CALL = "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
DS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_END = "<｜tool▁calls▁end｜>"


def _hermes(name: str, args: Any) -> str:
    return hermes([(name, args)])


def _coder(name: str, args: dict[str, Any]) -> str:
    return qwen3_coder([(name, args)])


def _ds3(*calls: tuple[str, Any]) -> str:
    return deepseek_v3(list(calls))


def _ds31(*calls: tuple[str, Any]) -> str:
    return deepseek_v31(list(calls))


def _py(value: Any) -> str:
    return repr(value)


DSML = "｜DSML｜"
KIMI_BEGIN, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL = "<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}" + (
    "<|tool_call_end|>"
)


_raw = param_text


def _dsml(block: str, *calls: tuple[str, dict[str, Any]]) -> str:
    return dsml(block)(list(calls))


def _kimi(*calls: tuple[str, Any]) -> str:
    return kimi_k2(list(calls))


def _glm(name: str, args: dict[str, Any], nl: str = "\n", prefix: str = "") -> str:
    pairs = "".join(
        f"<{prefix}arg_key>{k}</{prefix}arg_key>{nl}<{prefix}arg_value>{_raw(v)}"
        f"</{prefix}arg_value>{nl}"
        for k, v in args.items()
    )
    return f"<{prefix}tool_call>{name}{nl}{pairs}</{prefix}tool_call>"


def _minimax(*calls: tuple[str, dict[str, Any]]) -> str:
    return minimax_m2(list(calls))


def _longcat(name: str, args: Any) -> str:
    return longcat([(name, args)])


def _toolcall(*calls: tuple[str, Any]) -> str:
    return nemotron(list(calls))


FILTERS = {"city": "日本", "filters": {"a": [1, {"b": None}]}, "ratio": 0.5, "metric": False}
NS = "]<]minimax[>["
K3_OPEN, K3_CLOSE, K3_SEP = "<|open|>", "<|close|>", "<|sep|>"


def _m3(*calls: tuple[str, dict[str, Any]]) -> str:
    return minimax_m3(list(calls))


_k3_tag = k3_tag


def _k3(*calls: tuple[str, dict[str, Any]], as_json: bool = False) -> str:
    out = []
    for i, (n, a) in enumerate(calls):
        if as_json:
            body = _k3_tag("json", type="object") + _j(a) + f"{K3_CLOSE}json{K3_SEP}"
        else:
            body = "".join(
                _k3_tag("argument", key=k, type=K3_TYPES[type(v)]) + _raw(v)
                + f"{K3_CLOSE}argument{K3_SEP}"
                for k, v in a.items()
            )  # fmt: skip
        out.append(_k3_tag("call", tool=n, index=i + 1) + body + f"{K3_CLOSE}call{K3_SEP}")
    return _k3_tag("tools") + "".join(out) + f"{K3_CLOSE}tools{K3_SEP}"


def _inkling(*calls: tuple[str, Any]) -> str:
    return "".join(
        f"<|message_model|>{n}<|content_invoke_tool_json|>"
        + _j({"name": n, "args": a})
        + "<|end_message|>"
        for n, a in calls
    )


# parser -> [(output text, intended content, intended calls)]
CASES: dict[str, list[tuple[str, str, list[tuple[str, Any]]]]] = {
    "hermes": [
        (_hermes("get_weather", WEATHER), "", [("get_weather", WEATHER)]),
        (
            "Let me check both.\n"
            + _hermes("get_weather", WEATHER)
            + "\n"
            + _hermes("write_file", NESTED),
            "Let me check both.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            "",
            [("get_time", {})],
        ),
        ('<tool_call>\n{"name": "get_time"}\n</tool_call>', "", [("get_time", {})]),
        ("No tools needed: 2 < 3 and <b>bold</b>.", "No tools needed: 2 < 3 and <b>bold</b>.", []),
    ],
    "qwen3_coder": [
        (
            "I'll look.\n" + _coder("get_weather", {"city": "Paris", "days": 3, "metric": True}),
            "I'll look.\n",
            [("get_weather", {"city": "Paris", "days": 3, "metric": True})],
        ),
        (
            _coder("write_file", NESTED)
            + "\n"
            + _coder("get_weather", {"city": "日本", "filters": {"a": [1]}, "ratio": 0.5}),
            "",
            [
                ("write_file", NESTED),
                ("get_weather", {"city": "日本", "filters": {"a": [1]}, "ratio": 0.5}),
            ],
        ),
        ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "", [("get_time", {})]),
        ("plain <function words", "plain <function words", []),
    ],
    "llama3_json": [
        (
            '<|python_tag|>{"name": "get_weather", "parameters": ' + _j(WEATHER) + "}",
            "",
            [("get_weather", WEATHER)],
        ),
        (
            '{"name": "write_file", "parameters": '
            + _j(NESTED)
            + '}; {"name": "get_time", "parameters": {}}',
            "",
            [("write_file", NESTED), ("get_time", {})],
        ),
        ('{"answer": "not a call {}"}', '{"answer": "not a call {}"}', []),
        ("The answer is {x}.", "The answer is {x}.", []),
    ],
    "mistral": [
        (
            "Sure. [TOOL_CALLS] ["
            + _j({"name": "get_weather", "arguments": WEATHER})
            + ", "
            + _j({"name": "get_time", "arguments": {}})
            + "]",
            "Sure. ",
            [("get_weather", WEATHER), ("get_time", {})],
        ),
        (
            "[TOOL_CALLS]write_file[ARGS]" + _j(NESTED) + "[TOOL_CALLS]get_time[ARGS]{}",
            "",
            [("write_file", NESTED), ("get_time", {})],
        ),
        ("[TOOL_CALLS]get_weather" + _j(WEATHER), "", [("get_weather", WEATHER)]),
        ("An array [1, 2] and [TOOL] text.", "An array [1, 2] and [TOOL] text.", []),
    ],
    "deepseek_v3": [
        (
            "Checking.\n" + _ds3(("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_ds3(("get_time", {})), "", [("get_time", {})]),
    ],
    "deepseek_v31": [
        (
            "Checking.\n" + _ds31(("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_ds31(("get_time", {})), "", [("get_time", {})]),
    ],
    "deepseek_v32": [
        (
            "Checking.\n\n"
            + _dsml("function_calls", ("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_dsml("function_calls", ("get_weather", FILTERS)), "", [("get_weather", FILTERS)]),
        (_dsml("function_calls", ("get_time", {})), "", [("get_time", {})]),
        ("<｜DSML｜tool_calls> is V4's", "<｜DSML｜tool_calls> is V4's", []),
    ],
    "deepseek_v4": [
        (
            "Checking.\n\n" + _dsml("tool_calls", ("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_dsml("tool_calls", ("get_weather", FILTERS)), "", [("get_weather", FILTERS)]),
    ],
    "kimi_k2": [
        (
            "Let me check. " + _kimi(("get_weather", WEATHER), ("write_file", NESTED)),
            "Let me check. ",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_kimi(("get_time", {})), "", [("get_time", {})]),
    ],
    "glm45": [
        (
            "Checking.\n" + _glm("get_weather", WEATHER) + "\n" + _glm("write_file", NESTED),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_glm("get_weather", FILTERS), "", [("get_weather", FILTERS)]),
        (_glm("get_time", {}), "", [("get_time", {})]),
        ("<tool_call>\n</tool_call> no name", "<tool_call>\n</tool_call> no name", []),
    ],
    "glm47": [
        (
            "Checking." + _glm("get_weather", WEATHER, "") + _glm("write_file", NESTED, ""),
            "Checking.",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_glm("get_weather", FILTERS, ""), "", [("get_weather", FILTERS)]),
    ],
    "minimax_m2": [
        (
            "Checking.\n" + _minimax(("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_minimax(("get_weather", FILTERS)), "", [("get_weather", FILTERS)]),
        (_minimax(("get_time", {})), "", [("get_time", {})]),
    ],
    "kimi_k3": [
        (
            f"{K3_OPEN}response{K3_SEP}Checking.{K3_CLOSE}response{K3_SEP}"
            + _k3(("get_weather", WEATHER), ("write_file", NESTED))
            + f"{K3_CLOSE}message{K3_SEP}",
            "Checking.",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_k3(("get_weather", FILTERS), as_json=True), "", [("get_weather", FILTERS)]),
        (_k3(("get_weather", FILTERS)), "", [("get_weather", FILTERS)]),
        (_k3(("get_time", {})), "", [("get_time", {})]),
    ],
    "minimax_m3": [
        (
            "Checking.\n" + _m3(("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_m3(("get_weather", FILTERS)), "", [("get_weather", FILTERS)]),
        (_m3(("get_time", {})), "", [("get_time", {})]),
    ],
    "inkling": [
        (
            "<|message_model|><|content_text|>Checking.<|end_message|>"
            + _inkling(("get_weather", WEATHER), ("write_file", NESTED))
            + "<|content_model_end_sampling|>",
            "Checking.",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_inkling(("get_weather", FILTERS)), "", [("get_weather", FILTERS)]),
    ],
    "longcat": [
        (
            "Checking.\n"
            + _longcat("get_weather", WEATHER)
            + "\n"
            + _longcat("write_file", NESTED),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (
            _glm("write_file", NESTED, prefix="longcat_")
            + _glm("get_weather", FILTERS, prefix="longcat_"),
            "",
            [("write_file", NESTED), ("get_weather", FILTERS)],
        ),
    ],
    "nemotron": [
        (
            "Checking.\n" + _toolcall(("get_weather", WEATHER), ("write_file", NESTED)),
            "Checking.\n",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        (_coder("get_weather", FILTERS), "", [("get_weather", FILTERS)]),
    ],
    "pythonic": [
        (
            f'[get_weather(city="Paris", days=3), write_file(path={_py(NESTED["path"])}, '
            f"content={_py(NESTED['content'])})]",
            "",
            [("get_weather", WEATHER), ("write_file", NESTED)],
        ),
        ("[get_time()]", "", [("get_time", {})]),
        ("[1, 2] is a list, not a call.", "[1, 2] is a list, not a call.", []),
        ("Text first [get_time()]", "Text first [get_time()]", []),
    ],
}

MARKUP = {
    "deepseek_v32": [DSML],
    "deepseek_v4": [DSML],
    "kimi_k2": ["<|tool_call", "functions."],
    "glm45": ["<tool_call>", "<arg_"],
    "glm47": ["<tool_call>", "<arg_"],
    "minimax_m2": ["<minimax:", "<invoke", "<parameter"],
    "longcat": ["<longcat_"],
    "kimi_k3": [K3_OPEN, K3_CLOSE, K3_SEP],
    "minimax_m3": [NS, "<invoke", "<tool_call>"],
    "inkling": ["<|message_model|>", "<|content_", "<|end_message|>"],
    "nemotron": ["<TOOLCALL>", "<tool_call>", "<function="],
    "hermes": ["<tool_call>", "</tool_call>"],
    "qwen3_coder": ["<tool_call>", "<function=", "<parameter="],
    "llama3_json": ["<|python_tag|>", '"parameters"'],
    "mistral": ["[TOOL_CALLS]", "[ARGS]"],
    "deepseek_v3": ["<｜tool"],
    "deepseek_v31": ["<｜tool"],
    "pythonic": ["get_weather(", "get_time("],
}

ALL = [(name, i) for name, cases in CASES.items() for i in range(len(cases))]


def stream(parser_name: str, pieces: list[str], length: bool = False) -> tuple[list[Delta], Any]:
    parser = make_tool_parser(parser_name, TOOLS)
    deltas: list[Delta] = []
    for piece in pieces:
        deltas += parser.feed(piece)
    deltas += parser.finish(length)
    return deltas, parser


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in pairwise(bounds)]


def shape(parsed: Parsed) -> tuple[str, list[tuple[int, str, str]]]:
    return parsed.content, [(c.index, c.name, c.arguments) for c in parsed.calls]


def check_order(deltas: list[Delta]) -> None:
    """A call's start comes before its arguments, which begin with the object's ``{`` (a
    call never goes out without them); no content after the first call."""
    started: set[int] = set()
    first: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, CallStart):
            assert d.index == len(started)
            started.add(d.index)
        elif isinstance(d, CallArgs):
            assert d.index in started
            first.setdefault(d.index, d.text)
        else:
            assert not started, "content after a call"
    for index in started:
        assert first.get(index, "").startswith("{"), (index, first.get(index))


def test_every_parser_has_cases() -> None:
    assert set(CASES) == set(TOOL_PARSERS)


@pytest.mark.parametrize(("name", "case"), ALL)
def test_non_streamed_is_the_intended_result(name: str, case: int) -> None:
    text, content, calls = CASES[name][case]
    parsed = make_tool_parser(name, TOOLS).parse(text)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert not parsed.incomplete
    for c in parsed.calls:
        # Canonical JSON text: compact, non-ASCII kept.
        assert c.arguments == json.dumps(
            json.loads(c.arguments), ensure_ascii=False, separators=(",", ":")
        )
        if name == "mistral":
            assert len(c.id) == 9 and c.id.isalnum()
        elif name == "kimi_k2":
            # The model's own ids (its template writes them back; it counts them).
            assert c.id == f"functions.{c.name}:{c.index}"
        else:
            assert c.id.startswith("call_") and len(c.id) == 29
    if calls:
        for tag in MARKUP[name]:
            assert tag not in parsed.content


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize(("name", "case"), ALL)
def test_streamed_equals_non_streamed_for_every_split(name: str, case: int, data: Any) -> None:
    text = CASES[name][case][0]
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=40))
    deltas, parser = stream(name, split(text, cuts))
    check_order(deltas)
    assert shape(assemble(deltas, parser.incomplete)) == shape(
        make_tool_parser(name, TOOLS).parse(text)
    )
    assert parser.called == bool(CASES[name][case][2])


@pytest.mark.parametrize(("name", "case"), ALL)
def test_one_character_at_a_time(name: str, case: int) -> None:
    text = CASES[name][case][0]
    deltas, _ = stream(name, list(text))
    check_order(deltas)
    assert shape(assemble(deltas)) == shape(make_tool_parser(name, TOOLS).parse(text))


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_arguments_stream_as_the_model_writes_them(name: str) -> None:
    # The write_file call's start goes out before its content argument is read, then its
    # arguments in many fragments (one character per delta here): not one at the call's end.
    text = next(t for t, _, calls in CASES[name] if any(n == "write_file" for n, _ in calls))
    parser = make_tool_parser(name, TOOLS)
    started = -1
    index = -1
    fragments = 0
    for i, ch in enumerate(text):
        for d in parser.feed(ch):
            if isinstance(d, CallStart) and d.name == "write_file":
                started, index = i, d.index
            elif isinstance(d, CallArgs) and d.index == index:
                fragments += 1
    assert 0 <= started < text.index("return")
    # Values stream as they come (pythonic: each argument when it ends).
    assert fragments >= (2 if name == "pythonic" else 40), fragments


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize(("name", "case"), ALL)
def test_truncated_stream_is_a_consistent_prefix(name: str, case: int, data: Any) -> None:
    text, content, calls = CASES[name][case]
    cut = data.draw(st.integers(0, len(text)))
    cuts = data.draw(st.lists(st.integers(0, cut), max_size=10))
    deltas, parser = stream(name, split(text[:cut], cuts), length=True)
    got = assemble(deltas, parser.incomplete)
    whole = make_tool_parser(name, TOOLS)
    assert shape(got) == shape(whole.parse(text[:cut], length=True))
    if calls:
        full = make_tool_parser(name, TOOLS).parse(text)
        # What was emitted stays true: the first calls, and part of the content.
        assert content.startswith(got.content)
        for call in got.calls:
            ref = full.calls[call.index]
            assert call.name == ref.name
            if call.index in parser.broken:
                # Cut while its arguments were written: a prefix of them, never JSON.
                assert ref.arguments.startswith(call.arguments) and got.incomplete
                assert call.arguments != ref.arguments
                with pytest.raises(ValueError):
                    json.loads(call.arguments)
            else:
                assert call.arguments == ref.arguments
        for tag in MARKUP[name]:
            assert tag not in got.content
        assert len(got.calls) <= len(calls)
    if cut == len(text):
        assert not got.incomplete and not parser.broken


# (parser, an output the end cuts inside a call, its content, the cut call's arguments or
# None if it had not started)
TRUNCATED = [
    ("hermes", 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "Hi ",
     '{"city":"Par'),
    ("hermes", 'Hi <tool_call>\n{"name": "get_weather", "argu', "Hi ", None),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
     '{"city":"Par'),
    ("qwen3_coder", "<tool_call>\n<function=get_wea", "", None),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"ci', "", '{"ci'),
    ("mistral", "[TOOL_CALLS]get_weather[ARGS]{", "", "{"),
    ("mistral", "[TOOL_CALLS]get_weather[AR", "", None),
    ("deepseek_v3", "x" + DS_BEGIN + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_", "x", None),
    ("deepseek_v31", DS_BEGIN + "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{", "", "{"),
    ("pythonic", '[get_weather(city="Pa', "", None),
    ("pythonic", '[get_weather(days=3, city="Pa', "", '{"days":3'),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "content", "args"), TRUNCATED)
def test_a_call_cut_by_the_end_is_incomplete_and_as_far_as_it_went(
    name: str, text: str, content: str, args: str | None
) -> None:
    parser = make_tool_parser(name, TOOLS)
    deltas = parser.feed(text) + parser.finish(length=True)
    parsed = assemble(deltas, parser.incomplete)
    assert parsed.incomplete and parsed.content == content
    if args is None:
        assert parsed.calls == [] and parser.broken == []
    else:
        assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", args)]
        assert parser.broken == [0]


def test_a_start_tag_cut_by_max_tokens_is_not_content() -> None:
    parser = make_tool_parser("hermes")
    assert parser.parse("Let me check.\n<tool_", length=True) == Parsed("Let me check.\n", [], True)
    # Ended by the model itself (stop), the same text is just text.
    assert parser.parse("Let me check.\n<tool_").content == "Let me check.\n<tool_"


def test_hermes_block_without_close_tag_is_a_call_when_its_json_is_complete() -> None:
    parsed = make_tool_parser("hermes").parse('<tool_call>\n{"name": "get_time", "arguments": {}}')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_time", "{}")]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "Look: <tool_call>\n{not json}\n</tool_call>"),
        ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": NaN}\n</tool_call>'),
        ("qwen3_coder", "<tool_call>\nno function here\n</tool_call>"),
        ("mistral", "[TOOL_CALLS] [{bad}]"),
        ("mistral", "[TOOL_CALLS]f[ARGS][1]"),
        ("pythonic", '[f(a=__import__("os").system("true"))]'),
        ("pythonic", "[f(1, 2)]"),
        ("pythonic", "[f(**{'a': 1})]"),
        ("llama3_json", '{"name": 3, "parameters": {}}'),
    ],
)
def test_unparseable_call_falls_back_to_content(name: str, text: str) -> None:
    # Nothing of a call went out (its arguments had not begun): the text is content.
    parsed = make_tool_parser(name).parse(text)
    assert parsed.calls == [] and parsed.content == text and not parsed.incomplete


# (parser, a call the model breaks after its arguments began, the arguments it keeps)
BROKEN = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>', '{"x":'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": "a\nb"}}</tool_call>', '{"x":"a'),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1,}}; {"name": "g"}', '{"a":1,'),
    ("mistral", "[TOOL_CALLS]f[ARGS]{'a': 1}[TOOL_CALLS]g[ARGS]{}", "{"),
    ("deepseek_v31", DS_BEGIN + DS31_CALL.format(name="f", args='{"a": 1e999}') + DS_END, '{"a":'),
    ("qwen3_coder", "<tool_call><function=f><parameter=a>1</parameter><parameter=b\n2"
     "</parameter></function></tool_call>", '{"a":"1"'),
    ("pythonic", "[f(a=1, b=x), g()]", '{"a":1'),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "args"), BROKEN)
def test_a_call_broken_after_its_start_keeps_what_went_out(name: str, text: str, args: str) -> None:
    # The rule of docs/TEXT.md: the call stays a call with the arguments written so far, an
    # unclosed object no JSON parser accepts; streamed as whole.
    for pieces in ([text], list(text)):
        parser = make_tool_parser(name, TOOLS)
        deltas: list[Delta] = []
        for piece in pieces:
            deltas += parser.feed(piece)
        deltas += parser.finish()
        parsed = assemble(deltas, parser.incomplete)
        assert (parsed.calls[0].name, parsed.calls[0].arguments) == ("f", args)
        assert parser.broken == [0] and not parsed.incomplete
        with pytest.raises(ValueError):
            json.loads(parsed.calls[0].arguments)
        assert parsed.content == ""
        # Sent back in a conversation's history, it reads as the object cut where it broke.
        assert isinstance(close_object(parsed.calls[0].arguments), dict)


def test_deepseek_bad_call_inside_the_section_is_dropped_the_others_kept() -> None:
    # Arguments that are no object: no call went out, it is dropped; one broken after its
    # start stays as it went out.
    bad = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>"
    broken = "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{bad<｜tool▁call▁end｜>"
    good = DS31_CALL.format(name="get_time", args="{}")
    parser = make_tool_parser("deepseek_v31")
    parsed = parser.parse("Hi" + DS_BEGIN + bad + broken + good + DS_END)
    assert parsed.content == "Hi"
    assert [(c.name, c.arguments) for c in parsed.calls] == [("g", "{"), ("get_time", "{}")]
    assert not parsed.incomplete


def test_text_after_a_call_is_dropped_and_a_bad_block_after_a_call_too() -> None:
    text = _hermes("get_time", {}) + " trailing words " + "<tool_call>{bad}</tool_call>"
    parsed = make_tool_parser("hermes").parse(text)
    assert parsed.content == "" and [c.name for c in parsed.calls] == ["get_time"]


def test_qwen3_coder_converts_by_schema_as_vllm_does() -> None:
    text = _coder(
        "get_weather",
        {
            "city": "123",
            "days": "x",
            "metric": "TRUE",
            "ratio": "2.0",
            "filters": "{'a': (1, 2)}",
            "tags": '["a", "b"]',
            "unknown": "7",
        },
    )
    (call,) = make_tool_parser("qwen3_coder", TOOLS).parse(text).calls
    assert json.loads(call.arguments) == {
        "city": "123",
        "days": "x",
        "metric": True,
        "ratio": 2,
        "filters": {"a": [1, 2]},
        "tags": ["a", "b"],
        "unknown": "7",
    }
    # Without tools, every value stays text; "null" is null for any type.
    text = _coder("get_weather", {"days": "3", "city": "null"})
    (call,) = make_tool_parser("qwen3_coder").parse(text).calls
    assert json.loads(call.arguments) == {"days": "3", "city": None}


def test_mistral_call_id_from_the_model() -> None:
    text = "[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{}"
    (call,) = make_tool_parser("mistral").parse(text).calls
    assert (call.id, call.name, call.arguments) == ("a1B2c3D4e", "get_time", "{}")


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ToolCallError, match="hermes"):
        make_tool_parser("nope")


def test_plain_text_fast_path_emits_each_delta_as_is() -> None:
    parser = make_tool_parser("hermes")
    assert parser.feed("plain words") == [Content("plain words")]
    assert parser.feed("") == []
    assert parser.feed("more <") == [Content("more ")]
    assert parser.feed("b>") == [Content("<b>")]


# -- constrained decoding ---------------------------------------------------------------------


def test_required_schema_is_vllms_array_form() -> None:
    schema = required_schema(TOOLS)
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    branches = schema["items"]["anyOf"]
    assert [b["properties"]["name"]["enum"] for b in branches] == [
        ["get_weather"],
        ["get_time"],
        ["write_file"],
    ]
    assert branches[0]["properties"]["parameters"] == TOOLS[0]["function"]["parameters"]
    assert branches[1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert all(b["required"] == ["name", "parameters"] for b in branches)
    assert required_schema(TOOLS, parallel_tool_calls=False)["maxItems"] == 1
    with pytest.raises(ToolCallError):
        required_schema([])


def test_named_schema_is_the_functions_parameters() -> None:
    assert named_schema(TOOLS, "get_weather") == TOOLS[0]["function"]["parameters"]
    assert named_schema(TOOLS, "get_time") == {"type": "object", "properties": {}}
    with pytest.raises(ToolCallError, match="nope"):
        named_schema(TOOLS, "nope")


REQUIRED_OUT = ' [{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, ' + (
    '{"name": "get_time", "parameters": {}}]'
)


def test_constrained_outputs_parse_back_into_calls() -> None:
    parsed = parse_required(REQUIRED_OUT)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", WEATHER),
        ("get_time", {}),
    ]
    assert parsed.content == ""
    named = parse_named("get_weather", '{"city": "Paris", "days": 3}')
    assert [(c.name, c.arguments) for c in named.calls] == [
        ("get_weather", '{"city":"Paris","days":3}')
    ]
    assert parse_required("[]").calls == [] and parse_required("[]").content == "[]"
    assert parse_required('[{"name": "f", "parameters": {}').incomplete


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, len(REQUIRED_OUT)), max_size=30))
def test_constrained_streaming_equals_non_streamed(cuts: list[int]) -> None:
    for parser, text in (
        (RequiredToolParser(TOOLS), REQUIRED_OUT),
        (NamedToolParser(TOOLS, "write_file"), _j(NESTED)),
    ):
        deltas: list[Delta] = []
        for piece in split(text, cuts):
            deltas += parser.feed(piece)
        deltas += parser.finish()
        assert shape(assemble(deltas)) == shape(parser.parse(text))
        assert assemble(deltas).calls


# -- a call after reasoning ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 400), max_size=40))
def test_a_call_after_reasoning_composes(cuts: list[int]) -> None:
    call = _hermes("get_weather", WEATHER)
    text = "<think>\nShould I call <tool_call>? Yes.\n</think>\n\nChecking.\n" + call
    reasoning = make_reasoning_parser("qwen3")
    tools = make_tool_parser("hermes", TOOLS)
    thought: list[str] = []
    deltas: list[Delta] = []
    for piece in split(text, cuts):
        r, c = reasoning.feed(piece)
        thought.append(r)
        deltas += tools.feed(c)
    r, c = reasoning.finish()
    thought.append(r)
    deltas += tools.feed(c) + tools.finish()
    assert "".join(thought) == "\nShould I call <tool_call>? Yes.\n"
    parsed = assemble(deltas)
    assert parsed.content == "\n\nChecking.\n"
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", WEATHER)]


# -- through a real tokenizer and the detokenizer -----------------------------------------------

# Each format's tags: single tokens of the "added" and "special" tokenizers (in the second,
# special tokens, as most models' tool-call tags are: the detokenizer keeps the parser's own
# with skip_special_tokens), several tokens of the "split" one.
TAGS = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter="],
    "deepseek_v3": [DS_BEGIN, DS_END, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>"],
    "deepseek_v31": [DS_BEGIN, DS_END, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>"],
    "deepseek_v32": [f"<{DSML}", f"</{DSML}"],
    "deepseek_v4": [f"<{DSML}", f"</{DSML}"],
    "kimi_k2": [KIMI_BEGIN, KIMI_END, "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                "<|tool_call_end|>"],
    "glm45": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
              "</arg_value>"],
    "glm47": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
              "</arg_value>"],
    "minimax_m2": ["<minimax:tool_call>", "</minimax:tool_call>"],
    "longcat": ["<longcat_tool_call>", "</longcat_tool_call>", "<longcat_arg_key>",
                "</longcat_arg_key>", "<longcat_arg_value>", "</longcat_arg_value>"],
    "nemotron": ["<TOOLCALL>", "</TOOLCALL>", "<tool_call>", "</tool_call>", "<function=",
                 "</function>", "<parameter="],
    "kimi_k3": [K3_OPEN, K3_CLOSE, K3_SEP],
    "minimax_m3": [NS],
    "inkling": ["<|message_model|>", "<|content_text|>", "<|content_invoke_tool_json|>",
                "<|end_message|>", "<|content_model_end_sampling|>"],
    "llama3_json": ["<|python_tag|>"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]"],
    "pythonic": ["<|python_start|>", "<|python_end|>"],
}  # fmt: skip


def test_every_parser_names_its_tags_as_possible_special_tokens() -> None:
    assert set(TAGS) == set(TOOL_PARSERS)
    for name, tags in TAGS.items():
        assert set(tags) <= set(TOOL_PARSERS[name].special), name


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TextModel]:
    base: Path = tmp_path_factory.mktemp("tool-models")
    tags = sorted({t for ts in TAGS.values() for t in ts})
    return {
        "split": TextModel.load(make_test_model(base / "split", "bytelevel")),
        "added": TextModel.load(make_test_model(base / "added", "bytelevel", added_tokens=tags)),
        "special": TextModel.load(
            make_test_model(base / "special", "bytelevel", special_tokens=tags)
        ),
    }


@pytest.mark.parametrize("tags", ["split", "added", "special"])
@pytest.mark.parametrize("name", sorted(TAGS))
def test_engine_chunks_through_the_detokenizer(
    models: dict[str, TextModel], tags: str, name: str
) -> None:
    model = models[tags]
    rng = random.Random(f"{name}-{tags}")
    keep = model.special_ids(TOOL_PARSERS[name].special)
    for text, content, calls in CASES[name]:
        ids = model.encode(text, add_special_tokens=False)
        if tags != "split":
            for tag in TAGS[name]:
                if tag in text:
                    assert model.encode(tag, add_special_tokens=False).__len__() == 1
        else:
            assert len(ids) > len(text) // 8
        for _ in range(20):
            detok = model.detokenizer(None, skip_special_tokens=True, keep=keep)
            parser = make_tool_parser(name, TOOLS)
            deltas: list[Delta] = []
            i = 0
            while i < len(ids):
                n = rng.randint(1, 6)
                deltas += parser.feed(detok.step(ids[i : i + n]))
                i += n
            deltas += parser.feed(detok.flush()) + parser.finish()
            parsed = assemble(deltas)
            assert parsed.content == content
            assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls


# Fragments of every format's markup, JSON and Python punctuation, and text: arbitrary mixes
# are what a confused model (or a hostile prompt echoed back) can produce.
PIECES = [
    "<tool_call>", "</tool_call>", "<tool_", "<function=f>", "</function>", "<parameter=city>",
    "</parameter>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", DS_BEGIN, DS_END,
    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<|python_start|>",
    "<|python_end|>", "```json\n", "```", '{"name": "f", "arguments": ', '{"a": "}"}', "{", "}",
    "[", "]", "(", ")", '"', "'", "\\", ",", ";", " ", "\n", "f(a=1)", "text", "é日😀", "NaN",
    f"<{DSML}function_calls>", f"<{DSML}tool_calls>", f'<{DSML}invoke name="f">',
    f'<{DSML}parameter name="a" string="true">', f'<{DSML}parameter name="a" string="false">',
    f"</{DSML}parameter>", f"</{DSML}invoke>", f"</{DSML}function_calls>", KIMI_BEGIN, KIMI_END,
    "<|tool_call_begin|>functions.f:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "<arg_key>a</arg_key>", "<arg_value>", "</arg_value>", "<minimax:tool_call>",
    "</minimax:tool_call>", '<invoke name="f">', '<parameter name="a">', "</invoke>",
    "<longcat_tool_call>", "</longcat_tool_call>", "<TOOLCALL>", "</TOOLCALL>",
    _k3_tag("tools"), _k3_tag("call", tool="f"), _k3_tag("argument", key="a", type="string"),
    _k3_tag("json", type="object"), f"{K3_CLOSE}argument{K3_SEP}", f"{K3_CLOSE}call{K3_SEP}",
    f"{K3_CLOSE}tools{K3_SEP}", f"{K3_OPEN}response{K3_SEP}", f"{NS}<tool_call>",
    f'{NS}<invoke name="f">', f"{NS}<a>", f"{NS}</a>", f"{NS}<item>", f"{NS}</item>",
    f"{NS}</invoke>", f"{NS}</tool_call>", "<|message_model|>", "<|content_invoke_tool_json|>",
    "<|content_text|>", "<|end_message|>", "<|content_invoke_tool_text|>",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(TOOL_PARSERS)),
    parts=st.lists(st.sampled_from(PIECES), max_size=25),
    cuts=st.lists(st.integers(0, 400), max_size=20),
    length=st.booleans(),
)
def test_arbitrary_markup_never_raises_and_is_split_invariant(
    name: str, parts: list[str], cuts: list[int], length: bool
) -> None:
    text = "".join(parts)
    deltas, parser = stream(name, split(text, cuts), length)
    check_order(deltas)
    got = assemble(deltas, parser.incomplete)
    assert shape(got) == shape(make_tool_parser(name, TOOLS).parse(text, length))
    assert got.incomplete == make_tool_parser(name, TOOLS).parse(text, length).incomplete
    for call in got.calls:
        if call.index in parser.broken:
            with pytest.raises(ValueError):
                json.loads(call.arguments)
        else:
            assert isinstance(json.loads(call.arguments), dict)
