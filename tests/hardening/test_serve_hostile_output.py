"""Hostile model output through ``tsfront serve``: whatever the engine emits, the client gets
content or a call, or a clean error and the end of the stream (issue 36, item 6).

Two real servers (master, I/O process, responses store, one worker), ``hermes`` tool calls
with ``qwen3`` reasoning and ``pythonic`` tool calls, each against a simulated rank whose
script answers a marker in the prompt with a model's text, streamed in chunks of 1 to 4
tokens. The outputs are the ones that broke the parse step: a call whose JSON holds the
escape ``"\\ud800"`` (a lone surrogate once decoded, which UTF-8 cannot hold) and a pythonic
call behind a 2,000-part dotted name (deeper than Python's recursion limit). Requests go over
real HTTP: the ``openai`` client for whole responses, httpx for streams, whose exact ending
(``[DONE]``, ``response.completed``) is checked on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.serve_fixtures import Served, start_scripted, start_together

from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model

DEADLINE = 60.0
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]
# The model's text holds the six characters backslash, u, d, 8, 0, 0 inside a JSON string.
SURROGATE_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "\\ud800"}}\n</tool_call>'
)
SURROGATE_NAME = '<tool_call>\n{"name": "\\udfff", "arguments": {}}\n</tool_call>'
DEEP_NAME = "a." * 2000 + "f"
DEEP_ATTRIBUTE = f"[{DEEP_NAME}(x=1)]"
RULES = [
    ("SURROGATE_CALL", SURROGATE_CALL),
    ("SURROGATE_NAME", SURROGATE_NAME),
    ("DEEP_ATTRIBUTE", DEEP_ATTRIBUTE),
]
SERVERS = {
    "hermes": ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"],
    "pythonic": ["--tool-call-parser", "pythonic"],
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    base = tmp_path_factory.mktemp("hostile-output")
    model_dir = make_test_model(base / "model", "bytelevel")
    model = TextModel.load(model_dir)
    starts = {
        name: lambda name=name: start_scripted(
            model_dir,
            model,
            Script(RULES, model_dir),
            args=SERVERS[name],
            stderr=base / f"stderr-{name}.txt",
        )
        for name in SERVERS
    }
    with start_together(starts, closed_clean) as started:
        yield started


def closed_clean(s: Served) -> None:
    code, left = s.close()
    assert code == 0 and not left


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)


def chat_body(marker: str, **kw: Any) -> dict[str, Any]:
    return {
        "model": "model",
        "messages": [{"role": "user", "content": marker}],
        "tools": TOOLS,
        **kw,
    }


def sse(s: Served, path: str, body: dict[str, Any]) -> list[tuple[str | None, str]]:
    """A streamed response's events as ``(event type line, data)``, read to the end of the
    body; the status must be 200."""
    events: list[tuple[str | None, str]] = []
    kind: str | None = None
    with httpx.stream("POST", f"{s.url}{path}", json=body, timeout=DEADLINE) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, line.removeprefix("data: ")))
                kind = None
    return events


def chat_stream(s: Served, marker: str) -> dict[str, Any]:
    """A streamed chat response put together; it must end with ``[DONE]`` after no error."""
    events = sse(s, "/v1/chat/completions", chat_body(marker, stream=True))
    assert events[-1][1] == "[DONE]", events[-3:]
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    finish = None
    for _, data in events[:-1]:
        chunk = json.loads(data)
        assert "error" not in chunk, chunk
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        content.append(delta.get("content") or "")
        for call in delta.get("tool_calls") or []:
            if call["index"] not in calls:
                calls[call["index"]] = [call["function"]["name"]]
            calls[call["index"]].append(call["function"]["arguments"])
        finish = choice["finish_reason"] or finish
    return {
        "content": "".join(content),
        "calls": [(parts[0], "".join(parts[1:])) for _, parts in sorted(calls.items())],
        "finish": finish,
    }


def no_traceback(s: Served) -> None:
    assert "Traceback" not in s.server.stderr()


def test_a_lone_surrogate_escape_in_call_arguments_is_a_call_whole_and_streamed(
    servers: dict[str, Served],
) -> None:
    s = servers["hermes"]
    out = client(s).chat.completions.create(**chat_body("SURROGATE_CALL"))
    (choice,) = out.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    # The arguments stay the model's JSON: the surrogate travels as its escape (ASCII).
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city":"\\ud800"}'
    assert json.loads(call.function.arguments) == {"city": "\ud800"}
    got = chat_stream(s, "SURROGATE_CALL")
    assert got == {
        "content": "",
        "calls": [("get_weather", '{"city":"\\ud800"}')],
        "finish": "tool_calls",
    }
    no_traceback(s)


def test_a_lone_surrogate_escape_in_a_call_name_is_content(servers: dict[str, Served]) -> None:
    s = servers["hermes"]
    out = client(s).chat.completions.create(**chat_body("SURROGATE_NAME"))
    (choice,) = out.choices
    assert choice.finish_reason == "stop"
    assert choice.message.content == SURROGATE_NAME and not choice.message.tool_calls
    got = chat_stream(s, "SURROGATE_NAME")
    assert got == {"content": SURROGATE_NAME, "calls": [], "finish": "stop"}
    no_traceback(s)


def test_a_lone_surrogate_escape_through_the_responses_api(servers: dict[str, Served]) -> None:
    s = servers["hermes"]
    body = {"model": "model", "input": "SURROGATE_CALL", "tools": RESPONSES_TOOLS}
    whole = client(s).responses.create(**body)
    assert whole.status == "completed"
    (item,) = whole.output
    assert item.type == "function_call" and item.arguments == '{"city":"\\ud800"}'
    # Stored: the store encoded it too.
    again = httpx.get(f"{s.url}/v1/responses/{whole.id}", timeout=DEADLINE)
    assert again.status_code == 200 and again.json()["output"][0]["arguments"] == item.arguments
    events = sse(s, "/v1/responses", {**body, "stream": True})
    assert events[-1][0] == "response.completed", events[-3:]
    done = json.loads(events[-1][1])["response"]
    assert [(i["type"], i["arguments"]) for i in done["output"]] == [
        ("function_call", '{"city":"\\ud800"}')
    ]
    no_traceback(s)


def test_a_pythonic_call_behind_a_2000_part_dotted_name_is_a_call_whole_and_streamed(
    servers: dict[str, Served],
) -> None:
    s = servers["pythonic"]
    out = client(s).chat.completions.create(**chat_body("DEEP_ATTRIBUTE"))
    (choice,) = out.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (DEEP_NAME, '{"x":1}')
    got = chat_stream(s, "DEEP_ATTRIBUTE")
    assert got == {"content": "", "calls": [(DEEP_NAME, '{"x":1}')], "finish": "tool_calls"}
    no_traceback(s)
