"""Tool calls, reasoning and structured outputs through ``tsfront serve``, with ``openai``.

One real server per tool-call parser (master, I/O process, one worker), all started at once,
each against an in-process simulated rank whose script (`tsfront.sim.script.Script`) answers
a marker in the prompt with a model's text: a tool call in the parser's format, a reasoning
block, JSON. The rank streams in chunks of 1 to 4 tokens drawn per request
(``chunk_tokens``), so every streamed request splits the output differently; the tags are
several tokens of the byte-level test tokenizer (``[TOOL_CALLS]`` and ``<|python_tag|>`` are
each one special token, as Mistral's and Llama-3's are: the parser reads them though
``skip_special_tokens`` is on). The server's ``--chat-template`` is the file below, so the
prompts it renders (tools, tool calls, tool results, reasoning) are known, and a script rule
that matches only a correctly rendered prompt proves the rendering. What reached the engine
(the grammar field) is read from the rank's log.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.serve_fixtures import (
    CHAT_TEMPLATE_TURNS,
    ONE_CALL,
    THOUGHT,
    ScriptedServe,
    start_together,
)

from tsfront.sim.scheduler import SCRIPT_ABORT
from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model
from tsfront.text.tools import make_tool_parser, named_schema, required_schema

DEADLINE = 60.0

TEMPLATE = (
    CHAT_TEMPLATE_TURNS
    + """\
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% elif open_think %}<think>
{% endif %}{% endif %}"""
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time."}}
TOOLS = [WEATHER, TIME]
ARGS = '{"city":"Paris","unit":"C"}'


def _ds(words: str) -> str:
    """A DeepSeek tag: full-width bars, words joined by U+2581."""
    return "<\uff5c" + "\u2581".join(words.split()) + "\uff5c>"


DS_BEGIN, DS_CALL, DS_SEP = _ds("tool calls begin"), _ds("tool call begin"), _ds("tool sep")
DS_END, DS_CALLS_END = _ds("tool call end"), _ds("tool calls end")
#: Each parser's answer to "PAIR": text, then get_weather(city, unit), then get_time().
PAIR = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    '"Paris", "unit": "C"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}'
    "\n</tool_call>",
    "qwen3_coder": "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"
    "\n</parameter>\n<parameter=unit>\nC\n</parameter>\n</function>\n</tool_call>\n<tool_call>"
    "\n<function=get_time>\n</function>\n</tool_call>",
    "llama3_json": 'Let me check.<|python_tag|>{"name": "get_weather", "parameters": {"city": '
    '"Paris", "unit": "C"}}; {"name": "get_time", "parameters": {}}',
    "mistral": 'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": '
    '"Paris", "unit": "C"}}, {"name": "get_time", "arguments": {}}]',
    # DeepSeek-R1-0528: the prompt opens <think> (open_think), the output closes it.
    "deepseek_v3": f"Weather needs a tool.</think>Let me check.{DS_BEGIN}{DS_CALL}function"
    f'{DS_SEP}get_weather\n```json\n{{"city": "Paris", "unit": "C"}}\n```{DS_END}{DS_CALL}'
    f"function{DS_SEP}get_time\n```json\n{{}}\n```{DS_END}{DS_CALLS_END}",
    "deepseek_v31": f'Let me check.{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris", '
    f'"unit": "C"}}{DS_END}{DS_CALL}get_time{DS_SEP}{{}}{DS_END}{DS_CALLS_END}',
    "pythonic": '[get_weather(city="Paris", unit="C"), get_time()]',
}
#: What of each format may never show in content.
MARKUP = (
    "<tool_call",
    "</tool_call",
    "<function",
    "[TOOL_CALLS",
    "<|python_tag",
    "<\uff5c",
    "[get_",
)
SERVERS = {
    "plain": [],
    "hermes": ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"],
    "qwen3_coder": ["--tool-call-parser", "qwen3_coder"],
    "llama3_json": ["--tool-call-parser", "llama3_json"],
    "mistral": ["--tool-call-parser", "mistral"],
    "deepseek_v3": [
        "--tool-call-parser",
        "deepseek_v3",
        "--reasoning-parser",
        "deepseek_r1",
        "--default-chat-template-kwargs",
        '{"open_think": true}',
    ],
    "deepseek_v31": ["--tool-call-parser", "deepseek_v31"],
    "pythonic": ["--tool-call-parser", "pythonic"],
}
PARSERS = [name for name in SERVERS if name != "plain"]


def rules() -> list[tuple[str, str]]:
    """The script: markers in the last user message → outputs (first match wins)."""
    out = [
        # Turn two of the round trip: matches only if the call's arguments were rendered as
        # an object and the tool result with its call id.
        (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
            "<|im_end|>\n<|im_start|>tool\n22 C (result of call_1)",
            "It is 22 C in Paris.",
        ),
        ("<think>Earlier thought.</think>\nSure.<|im_end|>", "History seen."),
        # After the tools' system message (so: the tools were rendered).
        ("<|im_end|>\n<|im_start|>user\nNONE_MODE", ONE_CALL),
    ]
    for name, text in PAIR.items():
        out.append((f"PAIR {name}<", text))
    out += [
        ("ONE_CALL", ONE_CALL),
        ("BUILTIN", '<|python_tag|>brave_search.call(query="weather")'),
        ("THINK_CALL", '<think>\nA tool.\n</think>\n\n<tool_call>\n{"name": "get_time", '
         '"arguments": {}}\n</tool_call>'),
        ("THINK", THOUGHT),
        ("REQUIRED", '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'),
        ("NAMED", '{"city": "Paris"}'),
        ("JSON", '{"answer": 4}'),
        ("CHOICE", "yes"),
        ("PLAIN", "Just text."),
    ]  # fmt: skip
    return out


class AbortingScript(Script):
    """The script, and "ABORT_MID" answered with a few tokens and then an engine abort."""

    def __call__(self, prompt_ids: Any) -> list[int] | None:
        prompt = self._load().decode(list(prompt_ids), skip_special_tokens=False)
        if "ABORT_MID" in prompt:
            return [*self._load().encode("Partial", add_special_tokens=False).ids, SCRIPT_ABORT]
        return super().__call__(prompt_ids)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer

    base = tmp_path_factory.mktemp("tools")
    model = make_test_model(base / "tool-model", "bytelevel")
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    # Special tokens, as in the real tokenizers: Mistral's [TOOL_CALLS], Llama-3's
    # <|python_tag|> (skip_special_tokens drops their text; the parser reads them).
    tok.add_special_tokens(["[TOOL_CALLS]", "<|python_tag|>"])
    tok.save(str(model / "tokenizer.json"))
    (base / "template.jinja").write_text(TEMPLATE)
    return model


class Served(ScriptedServe):
    def __init__(self, served: Any, model: TextModel) -> None:
        super().__init__(served, model)
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def servers(model_dir: Path) -> Iterator[dict[str, Served]]:
    starts = {
        name: lambda flags=flags: Served.start(
            model_dir,
            AbortingScript(rules(), model_dir),
            args=["--chat-template", str(model_dir.parent / "template.jinja"), *flags],
        )
        for name, flags in SERVERS.items()
    }
    with start_together(starts, Served.close) as started:
        yield started


@pytest.fixture(scope="module")
def model(model_dir: Path) -> TextModel:
    return TextModel.load(model_dir)


_ids = iter(range(1_000_000))


def rid() -> str:
    return f"t{next(_ids)}"


def chat(s: Served, content: str, request_id: str | None = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("messages", [{"role": "user", "content": content}])
    out = s.client.chat.completions.create(
        model="tool-model", extra_headers={"x-request-id": request_id or rid()}, **kw
    )
    return out.to_dict()


def stream(s: Served, content: str, request_id: str | None = None, **kw: Any) -> list[dict]:
    """The streamed chunks, as dicts (the usage chunk dropped)."""
    kw.setdefault("messages", [{"role": "user", "content": content}])
    events = s.client.chat.completions.create(
        model="tool-model",
        stream=True,
        extra_headers={"x-request-id": request_id or rid()},
        **kw,
    )
    return [c.to_dict() for c in events if c.choices]


def assemble(chunks: list[dict]) -> dict[str, Any]:
    """A streamed response put together as a client does, checking OpenAI's delta shapes."""
    content, reasoning = [], []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for c in chunks:
        (choice,) = c["choices"]
        delta = choice["delta"]
        if delta.get("content"):
            content.append(delta["content"])
        if delta.get("reasoning_content"):
            reasoning.append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or []:
            i = call["index"]
            if i not in calls:
                # The first delta of a call: index, id, type, name, arguments "".
                assert call["id"] and call["type"] == "function", call
                assert call["function"]["name"] and call["function"]["arguments"] == "", call
                calls[i] = {"id": call["id"], "name": call["function"]["name"], "args": []}
            else:
                assert "id" not in call or call["id"] is None, call
                calls[i]["args"].append(call["function"]["arguments"])
        if choice["finish_reason"] is not None:
            assert finish is None
            finish = choice["finish_reason"]
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning),
        "calls": [(calls[i]["name"], "".join(calls[i]["args"])) for i in sorted(calls)],
        "ids": [calls[i]["id"] for i in sorted(calls)],
        "content_deltas": content,
        "finish": finish,
    }


def calls_of(message: dict[str, Any]) -> list[tuple[str, str]]:
    for call in message.get("tool_calls") or []:
        assert call["type"] == "function" and call["id"]
    return [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]


# ---------------------------------------------------------------------- every parser


@pytest.mark.parametrize("parser", PARSERS)
def test_parser_whole_and_streamed_in_random_chunks(
    servers: dict[str, Served], parser: str
) -> None:
    s = servers[parser]
    text = PAIR[parser]
    reasoning = None
    if parser == "deepseek_v3":
        reasoning, text = text.split("</think>")
    expected = make_tool_parser(parser).parse(text)
    content = expected.content or None
    out = chat(s, f"PAIR {parser}<", tools=TOOLS)
    (choice,) = out["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert calls_of(message) == [("get_weather", ARGS), ("get_time", "{}")]
    assert message["content"] == content
    assert message.get("reasoning_content") == reasoning
    ids = [c["id"] for c in message["tool_calls"]]
    if parser == "mistral":
        assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids), ids
    else:
        assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids), ids
    assert len(set(ids)) == 2
    # Streamed: each request is split into different chunks by the rank (and coalesced by
    # the worker when it falls behind); the result is the same every time.
    for _ in range(3):
        got = assemble(stream(s, f"PAIR {parser}<", tools=TOOLS))
        assert got["calls"] == calls_of(message)
        assert got["content"] == (content or "")
        assert got["reasoning"] == (reasoning or "")
        assert got["finish"] == "tool_calls"
        for piece in got["content_deltas"]:
            assert not any(m in piece for m in MARKUP), piece


def test_a_marker_left_as_text_obeys_skip_special_tokens(servers: dict[str, Served]) -> None:
    # <|python_tag|> (a special token) reaches the parser either way; when it opens no call
    # (a Llama built-in tool), skip_special_tokens decides whether its text is content.
    s = servers["llama3_json"]
    text = 'brave_search.call(query="weather")'
    for skip, want in ((None, text), (True, text), (False, "<|python_tag|>" + text)):
        extra = {} if skip is None else {"skip_special_tokens": skip}
        (choice,) = chat(s, "BUILTIN", tools=TOOLS, extra_body=extra)["choices"]
        # (Kept, the special tokens show: the end-of-text token after the text too.)
        content = choice["message"]["content"].removesuffix("<|end_of_text|>")
        assert content == want and choice["finish_reason"] == "stop"
        got = assemble(stream(s, "BUILTIN", tools=TOOLS, extra_body=extra))
        assert got["content"].removesuffix("<|end_of_text|>") == want and not got["calls"]


def test_text_only_answers_are_content_on_a_parsing_server(servers: dict[str, Served]) -> None:
    for name in ("hermes", "llama3_json", "pythonic"):
        out = chat(servers[name], "PLAIN", tools=TOOLS)
        (choice,) = out["choices"]
        assert choice["message"]["content"] == "Just text."
        assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "stop"


# ---------------------------------------------------------------------- tool_choice modes


def test_tool_choice_auto_sends_no_grammar(servers: dict[str, Served]) -> None:
    s = servers["hermes"]
    request_id = rid()
    out = chat(s, "ONE_CALL", request_id, tools=TOOLS, tool_choice="auto")
    assert calls_of(out["choices"][0]["message"]) == [("get_weather", '{"city":"Paris"}')]
    sp = s.engine_request(request_id).sampling_params
    assert (sp.json_schema, sp.regex, sp.ebnf, sp.structural_tag) == (None, None, None, None)


def test_tool_choice_none_renders_the_tools_and_parses_nothing(
    servers: dict[str, Served], model: TextModel
) -> None:
    s = servers["hermes"]
    request_id = rid()
    out = chat(s, "NONE_MODE", request_id, tools=TOOLS, tool_choice="none")
    (choice,) = out["choices"]
    # The template got the tools (the rule for a prompt with them matched); the call in the
    # output is not parsed: it is the content.
    assert choice["message"]["content"] == ONE_CALL
    assert '"name": "get_weather"' in s.prompt_of(request_id)
    assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
    assert s.engine_request(request_id).sampling_params.json_schema is None


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("server", ["plain", "hermes"])
def test_tool_choice_required_is_constrained_and_parsed_back(
    servers: dict[str, Served], server: str, parallel: bool
) -> None:
    # Works on a server without --tool-call-parser too: the output is the schema's.
    s = servers[server]
    request_id = rid()
    out = chat(
        s, "REQUIRED", request_id, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel
    )
    (choice,) = out["choices"]
    assert calls_of(choice["message"]) == [("get_weather", '{"city":"Paris"}')]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    sp = s.engine_request(request_id).sampling_params
    assert json.loads(sp.json_schema) == required_schema(TOOLS, parallel)
    assert ("maxItems" in json.loads(sp.json_schema)) == (not parallel)
    got = assemble(stream(s, "REQUIRED", tools=TOOLS, tool_choice="required"))
    assert got["calls"] == [("get_weather", '{"city":"Paris"}')] and got["content"] == ""
    assert got["finish"] == "tool_calls"


def test_named_tool_choice_is_constrained_to_its_parameters(servers: dict[str, Served]) -> None:
    s = servers["plain"]
    named = {"type": "function", "function": {"name": "get_weather"}}
    request_id = rid()
    out = chat(s, "NAMED", request_id, tools=TOOLS, tool_choice=named)
    (choice,) = out["choices"]
    assert calls_of(choice["message"]) == [("get_weather", '{"city":"Paris"}')]
    assert choice["finish_reason"] == "tool_calls"
    sp = s.engine_request(request_id).sampling_params
    assert json.loads(sp.json_schema) == named_schema(TOOLS, "get_weather")
    got = assemble(stream(s, "NAMED", tools=TOOLS, tool_choice=named))
    assert got["calls"] == [("get_weather", '{"city":"Paris"}')] and got["finish"] == "tool_calls"


def test_parallel_tool_calls_false_keeps_the_first_call(servers: dict[str, Served]) -> None:
    s = servers["hermes"]
    out = chat(s, "PAIR hermes<", tools=TOOLS, parallel_tool_calls=False)
    assert calls_of(out["choices"][0]["message"]) == [("get_weather", ARGS)]
    got = assemble(stream(s, "PAIR hermes<", tools=TOOLS, parallel_tool_calls=False))
    assert got["calls"] == [("get_weather", ARGS)]


def test_a_call_cut_by_max_tokens_keeps_length(
    servers: dict[str, Served], model: TextModel
) -> None:
    s = servers["hermes"]
    # Cut inside the second call: the first stays, the finish reason says length.
    text = PAIR["hermes"]
    cut = len(model.encode(text[: text.rindex("get_time")], add_special_tokens=False))
    out = chat(s, "PAIR hermes<", tools=TOOLS, max_tokens=cut)
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "length"
    assert calls_of(choice["message"]) == [("get_weather", ARGS)]
    got = assemble(stream(s, "PAIR hermes<", tools=TOOLS, max_tokens=cut))
    assert got["finish"] == "length" and got["calls"] == [("get_weather", ARGS)]
    # Cut inside the only call: no call at all, and no markup as content.
    out = chat(s, "ONE_CALL", tools=TOOLS, max_tokens=6)
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "length" and not choice["message"].get("tool_calls")
    assert not any(m in (choice["message"]["content"] or "") for m in MARKUP)


def test_two_turn_round_trip(servers: dict[str, Served], model: TextModel) -> None:
    s = servers["hermes"]
    first = chat(s, "ONE_CALL", tools=TOOLS)["choices"][0]["message"]
    (call,) = first["tool_calls"]
    messages = [
        {"role": "user", "content": "ONE_CALL"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "id": "call_1"}],  # a fixed id: the script matches it
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    ]
    request_id = rid()
    out = chat(s, "", request_id, messages=messages, tools=TOOLS)
    (choice,) = out["choices"]
    assert choice["message"]["content"] == "It is 22 C in Paris."
    assert choice["finish_reason"] == "stop"
    prompt = s.prompt_of(request_id)
    assert '"arguments": {"city": "Paris"}' in prompt and "22 C (result of call_1)" in prompt
    # Arguments that are not JSON text: 400 naming the message.
    bad = [messages[0], {**messages[1], "tool_calls": [{**call, "function": {
        "name": "get_weather", "arguments": "{city: Paris"}}]}, messages[2]]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as err:
        chat(s, "", messages=bad, tools=TOOLS)
    assert err.value.status_code == 400
    assert "messages[1].tool_calls[0].function.arguments is not JSON" in str(err.value)


# ---------------------------------------------------------------------- reasoning


def test_reasoning_split_whole_and_streamed(servers: dict[str, Served]) -> None:
    s = servers["hermes"]  # --reasoning-parser qwen3
    out = chat(s, "THINK")
    message = out["choices"][0]["message"]
    assert message["reasoning_content"] == "\nThe user wants 2 + 2.\n"
    assert message["content"] == "\n\nFour."
    for _ in range(3):
        got = assemble(stream(s, "THINK"))
        assert got["reasoning"] == message["reasoning_content"]
        assert got["content"] == message["content"]
        for piece in got["content_deltas"]:
            assert "think>" not in piece and "<" not in piece, piece
    # A call after </think> is parsed; the blank content before it is null.
    out = chat(s, "THINK_CALL", tools=TOOLS)
    (choice,) = out["choices"]
    assert choice["message"]["reasoning_content"] == "\nA tool.\n"
    assert calls_of(choice["message"]) == [("get_time", "{}")]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    got = assemble(stream(s, "THINK_CALL", tools=TOOLS))
    assert got["calls"] == [("get_time", "{}")] and got["content"] == ""
    assert got["reasoning"] == "\nA tool.\n"


def test_enable_thinking_false_means_no_reasoning_section(
    servers: dict[str, Served], model: TextModel
) -> None:
    s = servers["hermes"]
    request_id = rid()
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    out = chat(s, "PLAIN", request_id, extra_body=off)
    message = out["choices"][0]["message"]
    assert message["content"] == "Just text." and message["reasoning_content"] is None
    assert s.prompt_of(request_id).endswith("<think>\n\n</think>\n\n")
    # Thinking disabled: even tags in the output are content.
    out = chat(s, "THINK", extra_body=off)
    assert out["choices"][0]["message"]["content"] == THOUGHT


def test_reasoning_content_in_history_reaches_the_template(servers: dict[str, Served]) -> None:
    s = servers["hermes"]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "Earlier thought."},
        {"role": "user", "content": "again"},
    ]
    out = chat(s, "", messages=messages)
    assert out["choices"][0]["message"]["content"] == "History seen."


def test_a_prompt_that_opens_think_starts_the_output_in_reasoning(
    servers: dict[str, Served], model: TextModel
) -> None:
    # deepseek_r1 with --default-chat-template-kwargs {"open_think": true}: the prompt ends
    # with <think>, the output has only </think>.
    s = servers["deepseek_v3"]
    request_id = rid()
    out = chat(s, "PLAIN", request_id)
    assert s.prompt_of(request_id).endswith("<think>\n")
    # No </think> at all: everything is reasoning (a thought cut off), content null.
    message = out["choices"][0]["message"]
    assert message["reasoning_content"] == "Just text." and message["content"] is None


# ---------------------------------------------------------------------- structured outputs


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_schema", {"type": "object"}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "a", "schema": SCHEMA, "strict": True}}},
            "json_schema",
            SCHEMA,
        ),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", SCHEMA),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+"),
        ({"structured_outputs": {"choice": ["yes", "no (maybe)"]}}, "regex", r"(yes|no \(maybe\))"),
        ({"structured_outputs": {"grammar": 'root ::= "yes"'}}, "ebnf", 'root ::= "yes"'),
        # vLLM's older names mean the same.
        ({"guided_json": SCHEMA}, "json_schema", SCHEMA),
        ({"guided_json": json.dumps(SCHEMA)}, "json_schema", SCHEMA),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_choice": ["yes", "no (maybe)"]}, "regex", r"(yes|no \(maybe\))"),
        ({"guided_grammar": 'root ::= "yes"'}, "ebnf", 'root ::= "yes"'),
        # A response_format of text constrains nothing: the guided field applies.
        ({"guided_regex": "[0-9]+", "response_format": {"type": "text"}}, "regex", "[0-9]+"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_structured_outputs_reach_the_engine_as_its_grammar(
    servers: dict[str, Served], body: dict, field: str, value: Any, route: str
) -> None:
    s = servers["plain"]
    request_id = rid()
    headers = {"x-request-id": request_id}
    if route == "chat":
        out = s.client.chat.completions.create(
            model="tool-model",
            messages=[{"role": "user", "content": "JSON"}],
            extra_headers=headers,
            extra_body=body,
        )
        assert out.choices[0].message.content == '{"answer": 4}'
    else:
        out = s.client.completions.create(
            model="tool-model", prompt="JSON", max_tokens=20, extra_headers=headers, extra_body=body
        )
        assert out.choices[0].text == '{"answer": 4}'
    sp = s.engine_request(request_id).sampling_params
    got = getattr(sp, field)
    assert (json.loads(got) if field == "json_schema" else got) == value
    others = {"json_schema", "regex", "ebnf", "structural_tag"} - {field}
    assert all(getattr(sp, name) is None for name in others)


def test_response_format_wins_over_a_tool_constraint(servers: dict[str, Served]) -> None:
    s = servers["plain"]
    request_id = rid()
    out = chat(
        s, "JSON", request_id, tools=TOOLS, tool_choice="required",
        response_format={"type": "json_object"},
    )  # fmt: skip
    sp = s.engine_request(request_id).sampling_params
    assert json.loads(sp.json_schema) == {"type": "object"}
    assert out["choices"][0]["message"]["content"] == '{"answer": 4}'


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
     ({"guided_regex": "(unclosed"}, "guided_regex")],
)  # fmt: skip
def test_a_grammar_the_engine_cannot_compile_is_a_400(
    servers: dict[str, Served], extra: dict, param: str
) -> None:
    s = servers["plain"]
    for kw in ({}, {"stream": True}):
        with pytest.raises(openai.BadRequestError) as err:
            s.client.chat.completions.create(
                model="tool-model",
                messages=[{"role": "user", "content": "JSON"}],
                extra_body=extra,
                **kw,
            )
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == param, body
        assert f"regex grammar made from {param} does not compile" in body["message"]


def test_guided_fields_the_wire_cannot_carry_are_refused_on_completions_too(
    servers: dict[str, Served],
) -> None:
    s = servers["plain"]
    for extra, param in (
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        ({"guided_regex": "a", "structured_outputs": {"choice": ["b"]}}, "guided_regex"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            s.client.completions.create(
                model="tool-model", prompt="JSON", max_tokens=5, extra_body=extra
            )
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == param, body


# ---------------------------------------------------------------------- finish reasons


def test_an_engine_abort_mid_stream_is_an_error_never_finish_abort(
    servers: dict[str, Served],
) -> None:
    s = servers["plain"]
    response = httpx.post(
        f"{s.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "ABORT_MID"}], "stream": True},
        timeout=DEADLINE,
    )
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and error["code"] == 502
    assert "engine aborted the request" in error["message"]
    assert '"abort"' not in response.text
    texts = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-2])
    assert texts == "Partial"
    # Not streamed: a 502 saying so.
    response = httpx.post(
        f"{s.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "ABORT_MID"}]},
        timeout=DEADLINE,
    )
    assert response.status_code == 502, response.text
    assert "engine aborted the request" in response.json()["error"]["message"]
    # The parsed path ends the same way.
    response = httpx.post(
        f"{servers['hermes'].url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "ABORT_MID"}], "stream": True},
        timeout=DEADLINE,
    )
    assert '"code":502' in response.text and '"abort"' not in response.text


# ---------------------------------------------------------------------- refusals


WEATHER_ONLY = [WEATHER]


@pytest.mark.parametrize(
    ("server", "body", "param", "words"),
    [
        ("plain", {"tools": TOOLS}, "tools", "start tsfront serve with --tool-call-parser NAME"),
        ("plain", {"tools": TOOLS, "tool_choice": "auto"}, "tools", "--tool-call-parser"),
        ("hermes", {"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            "hermes",
            {"tools": WEATHER_ONLY, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "names function 'x', which tools does not define",
        ),
        ("hermes", {"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be"),
        ("hermes", {"tools": [{"type": "retrieval"}]}, "tools", "only function tools"),
        ("plain", {"response_format": {"type": "yaml"}}, "response_format", "use text, json_"),
        (
            "plain",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            '"schema": JSON_SCHEMA',
        ),
        (
            "plain",
            {"structured_outputs": {"regex": "a", "grammar": "b"}},
            "structured_outputs",
            "one constraint per request",
        ),
        (
            "plain",
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
            "send one",
        ),
        ("hermes", {"stream": True, "logprobs": True}, "logprobs", "stream: false"),
        # vLLM's guided_* fields: honoured alone, refused where they would be ignored.
        (
            "plain",
            {"guided_json": SCHEMA, "guided_decoding_backend": "xgrammar"},
            "guided_decoding_backend",
            "chosen when it starts",
        ),
        (
            "plain",
            {"guided_json": SCHEMA, "guided_whitespace_pattern": " *"},
            "guided_whitespace_pattern",
            "no whitespace pattern",
        ),
        (
            "plain",
            {"guided_regex": "a", "guided_choice": ["b"]},
            "guided_choice",
            "one constraint per request",
        ),
        (
            "plain",
            {"guided_regex": "a", "structured_outputs": {"regex": "b"}},
            "guided_regex",
            "older name of structured_outputs.regex",
        ),
        (
            "plain",
            {"guided_json": SCHEMA, "response_format": {"type": "json_object"}},
            "guided_json",
            "guided_json and response_format both constrain the output: send one",
        ),
        ("plain", {"guided_choice": []}, "guided_choice", "a non-empty list of strings"),
        ("plain", {"guided_json": 5}, "guided_json", "must be a JSON schema"),
        ("plain", {"guided_regex": ""}, "guided_regex", "must be a non-empty string"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(
    servers: dict[str, Served], server: str, body: dict, param: str, words: str
) -> None:
    s = servers[server]
    payload = {"messages": [{"role": "user", "content": "PLAIN"}], **body}
    response = httpx.post(f"{s.url}/v1/chat/completions", json=payload, timeout=DEADLINE)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_unknown_parser_names_exit_2_listing_the_valid_ones(model_dir: Path) -> None:
    for flag, valid in (("--tool-call-parser", "hermes"), ("--reasoning-parser", "deepseek_r1")):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tsfront",
                "serve",
                "--model",
                str(model_dir),
                "--handshake",
                "tcp://127.0.0.1:0",
                flag,
                "nope",
            ],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert proc.returncode == 2, proc.stderr
        assert f"{flag} 'nope': unknown; use one of" in proc.stderr and valid in proc.stderr


# ---------------------------------------------------------------------- tokenize


def test_tokenize_and_detokenize(servers: dict[str, Served], model: TextModel) -> None:
    s = servers["hermes"]
    limit = httpx.get(f"{s.url}/v1/models", timeout=DEADLINE).json()["data"][0]["max_model_len"]
    out = httpx.post(f"{s.url}/v1/tokenize", json={"prompt": "Hello there"}, timeout=DEADLINE)
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["tokens"] == model.encode("Hello there", add_special_tokens=True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == limit
    # Messages (and tools): the tokens of the prompt a chat request renders.
    messages = [{"role": "user", "content": "PLAIN"}]
    out = httpx.post(
        f"{s.url}/tokenize", json={"messages": messages, "tools": TOOLS}, timeout=DEADLINE
    ).json()
    usage = chat(s, "PLAIN", tools=TOOLS)["usage"]
    assert out["count"] == usage["prompt_tokens"]
    back = httpx.post(f"{s.url}/v1/detokenize", json={"tokens": out["tokens"]}, timeout=DEADLINE)
    assert back.status_code == 200
    assert back.json()["prompt"] == model.decode(out["tokens"], skip_special_tokens=False)
    assert '"name": "get_weather"' in back.json()["prompt"]
    bad = httpx.post(f"{s.url}/v1/detokenize", json={"tokens": [10**9]}, timeout=DEADLINE)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = httpx.post(
        f"{s.url}/v1/tokenize", json={"prompt": "a", "messages": messages}, timeout=DEADLINE
    )
    assert both.status_code == 400 and "either" in both.json()["error"]["message"]
