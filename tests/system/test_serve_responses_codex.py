"""``/v1/responses`` as Codex-style agents use it, through ``tsfront serve`` and the official
``openai`` client: ``store: false`` with ``include: ["reasoning.encrypted_content"]`` and the
reasoning sent back, ``GET /v1/responses/{id}/input_items`` paged as OpenAI pages it, ``POST
/v1/responses/{id}/cancel``, and every streamed event checked against the ``openai`` SDK's own
event types.

One server (two workers; ``hermes`` tool calls, ``qwen3`` reasoning; two API keys) against an
in-process simulated rank whose script answers a marker in the prompt; the chat template below
renders the reasoning an assistant turn carries, so a rule that matches only such a prompt
proves the reasoning sent back reached the model.
"""

from __future__ import annotations

import ast
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent
from support.serve_fixtures import (
    CHAT_TEMPLATE,
    LONG_ARGS,
    LONG_CALL,
    ONE_CALL,
    ScriptedServe,
    sse_events,
)

import tsfront.serve.responses.endpoints as endpoints_module
from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model

DEADLINE = 60.0
A, B = "key-a", "key-b"
TEMPLATE = CHAT_TEMPLATE
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
RULES = [
    # The agent's second turn: its reasoning (sent back sealed) before its call, the result.
    (
        "<think>\nLet me call the tool.\n</think>\n<tool_call>"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        "<|im_end|>\n<|im_start|>tool\n22 C (result of call_",
        "It is 22 C in Paris.",
    ),
    ("<think>\nThe user wants 2 + 2.\n</think>\n", "History seen."),
    ("CODEX", "<think>\nLet me call the tool.\n</think>\n\n" + ONE_CALL),
    ("LONGCALL", LONG_CALL),
    ("THINK", "<think>\nThe user wants 2 + 2.\n</think>\n\nFour."),
    ("PLAIN", "Just text."),
]


class Served(ScriptedServe):
    def __init__(self, served: Any, model: TextModel) -> None:
        super().__init__(served, model)
        self.a = openai.OpenAI(base_url=f"{self.url}/v1", api_key=A, max_retries=0)
        self.b = openai.OpenAI(base_url=f"{self.url}/v1", api_key=B, max_retries=0)
        self._ids = iter(range(1_000_000))

    def rid(self) -> str:
        return f"c{next(self._ids)}"

    def raw_events(self, body: dict[str, Any], key: str = A) -> list[dict[str, Any]]:
        pairs = sse_events(
            f"{self.url}/v1/responses",
            {"stream": True, **body},
            {"authorization": f"Bearer {key}"},
            DEADLINE,
        )
        for event, payload in pairs:
            assert event == payload["type"]
        return [payload for _, payload in pairs]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("codex")
    (base / "template.jinja").write_text(TEMPLATE)
    model_dir: Path = make_test_model(base / "codex-model", "bytelevel")
    s = Served.start(
        model_dir,
        Script(RULES, model_dir),
        workers=2,
        args=["--chat-template", str(base / "template.jinja"), "--api-key", A, "--api-key", B,
              "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"],
        stderr=base / "stderr.txt",
    )  # fmt: skip
    try:
        yield s
    finally:
        s.close()


INCLUDE = ["reasoning.encrypted_content"]


def _items(out: Any) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in out.output]


# ---------------------------------------------------------------------- encrypted reasoning


def test_a_codex_style_loop_sends_its_reasoning_back_sealed(served: Served) -> None:
    # store: false and the whole context sent each turn, reasoning items as they came.
    context: list[dict[str, Any]] = [{"role": "user", "content": "CODEX: the weather?"}]
    first = served.a.responses.create(
        model="codex-model", input=context, tools=[WEATHER], store=False, include=INCLUDE
    )
    assert first.store is False
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"]
    reasoning, call = first.output
    assert reasoning.encrypted_content and reasoning.encrypted_content.startswith("ts1.")
    assert "Let me call the tool." not in reasoning.encrypted_content  # base64url, not the text
    # Not stored: nothing to fetch.
    with pytest.raises(openai.NotFoundError):
        served.a.responses.retrieve(first.id)
    context += _items(first)
    context.append({"type": "function_call_output", "call_id": call.call_id, "output": "22 C"})
    request_id = served.rid()
    second = served.a.responses.create(
        model="codex-model", input=context, tools=[WEATHER], store=False, include=INCLUDE,
        extra_headers={"x-request-id": request_id},
    )  # fmt: skip
    assert second.output_text == "It is 22 C in Paris."
    assert "<think>\nLet me call the tool.\n</think>\n<tool_call>" in served.prompt_of(request_id)


def test_without_include_no_encrypted_content(served: Served) -> None:
    out = served.a.responses.create(model="codex-model", input="THINK", store=False)
    assert out.output[0].type == "reasoning" and out.output[0].encrypted_content is None


def test_sealed_reasoning_of_another_key_or_altered_is_refused(served: Served) -> None:
    first = served.a.responses.create(
        model="codex-model", input="THINK", store=False, include=INCLUDE
    )
    reasoning = first.output[0].model_dump(exclude_none=True)
    context = [{"role": "user", "content": "THINK"}, reasoning,
               {"role": "user", "content": "and?"}]  # fmt: skip
    # The owner's key: taken (and its text, sealed, is what reaches the template).
    request_id = served.rid()
    out = served.a.responses.create(model="codex-model", input=context, store=False,
                                    extra_headers={"x-request-id": request_id})  # fmt: skip
    assert out.output_text == "History seen."
    # Another key, or a changed seal, or the text changed beside it: refused, naming the item.
    altered = {**reasoning, "encrypted_content": reasoning["encrypted_content"][:-2] + "AA"}
    forged = {**reasoning, "encrypted_content": "ts1." + "A" * 80}
    for client, item in ((served.b, reasoning), (served.a, altered), (served.a, forged)):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="codex-model", store=False,
                                    input=[context[0], item, context[2]])  # fmt: skip
        error = err.value.body
        assert error["param"] == "input" and "input[1].encrypted_content" in error["message"]


def test_streamed_reasoning_items_carry_their_seal(served: Served) -> None:
    events = served.raw_events({"input": "THINK", "store": False, "include": INCLUDE})
    (done,) = [
        e for e in events if e["type"] == "response.output_item.done"
        and e["item"]["type"] == "reasoning"
    ]  # fmt: skip
    sealed = done["item"]["encrypted_content"]
    assert sealed.startswith("ts1.")
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert completed["response"]["output"][0]["encrypted_content"] == sealed


def test_include_values_other_than_encrypted_reasoning_are_refused(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        served.a.responses.create(model="codex-model", input="PLAIN",
                                  include=["message.output_text.logprobs"])  # fmt: skip
    assert err.value.body["param"] == "include"


# ---------------------------------------------------------------------- input items, cancel


def test_input_items_are_the_contexts_items_paged_as_openai_pages(served: Served) -> None:
    given = [
        {"role": "user", "content": "PLAIN one"},
        {"type": "message", "role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "input_text", "text": "PLAIN two"}]},
    ]
    first = served.a.responses.create(model="codex-model", input=given)
    second = served.a.responses.create(
        model="codex-model", input="PLAIN three", previous_response_id=first.id
    )
    # Every item of the context, oldest first: first's input, first's output, second's input.
    listed = list(served.a.responses.input_items.list(second.id, order="asc", limit=2))
    texts = [(item.type, getattr(item, "role", None), item.content[0].text) for item in listed]
    assert texts == [
        ("message", "user", "PLAIN one"),
        ("message", "assistant", "ok"),
        ("message", "user", "PLAIN two"),
        ("message", "assistant", "Just text."),
        ("message", "user", "PLAIN three"),
    ]
    ids = [item.id for item in listed]
    assert len(set(ids)) == 5 and all(ids)
    assert ids[3] == first.output[0].id  # the output item, by its own id
    # The default order is newest first; pages by after, and by before.
    newest = served.a.responses.input_items.list(second.id)
    assert [item.id for item in newest.data] == ids[::-1] and newest.has_more is False
    http = httpx.Client(base_url=served.url, headers={"authorization": f"Bearer {A}"})
    path = f"/v1/responses/{second.id}/input_items"
    page = http.get(path, params={"limit": 2, "order": "asc", "after": ids[0]}).json()
    assert [i["id"] for i in page["data"]] == ids[1:3] and page["has_more"] is True
    assert (page["first_id"], page["last_id"], page["object"]) == (ids[1], ids[2], "list")
    before = http.get(path, params={"limit": 2, "order": "asc", "before": ids[4]}).json()
    assert [i["id"] for i in before["data"]] == ids[2:4] and before["has_more"] is True
    for params, param in (({"limit": 0}, "limit"), ({"limit": "x"}, "limit"),
                          ({"order": "up"}, "order"), ({"after": "nope"}, "after")):  # fmt: skip
        response = http.get(path, params=params)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    # Another key's response is not found, as for GET.
    with pytest.raises(openai.NotFoundError):
        served.b.responses.input_items.list(second.id)


def test_cancel_is_openais_answer_for_a_response_not_in_background(served: Served) -> None:
    out = served.a.responses.create(model="codex-model", input="PLAIN")
    with pytest.raises(openai.BadRequestError) as err:
        served.a.responses.cancel(out.id)
    assert err.value.body["type"] == "invalid_request_error"
    assert err.value.body["message"].startswith("Cannot cancel a synchronous response.")
    for client, rid in ((served.b, out.id), (served.a, "resp_" + "0" * 24)):
        with pytest.raises(openai.NotFoundError):
            client.responses.cancel(rid)
    assert served.a.responses.retrieve(out.id).status == "completed"  # untouched


# ---------------------------------------------------------------------- event types


def _sdk_event_types() -> set[str]:
    (union,) = typing.get_args(ResponseStreamEvent)[:1]
    names: set[str] = set()
    for model in typing.get_args(union):
        names.update(typing.get_args(model.model_fields["type"].annotation))
    return names


def _values(node: ast.expr) -> set[str]:
    """The strings an expression can be: a constant, or either branch of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _values(node.body) | _values(node.orelse)
    return set()


def test_every_event_type_the_module_can_emit_is_the_sdks() -> None:
    # Every literal the module passes as an event type (``_event(KIND, ...)`` and the names
    # assigned to what it passes), read from its source.
    tree = ast.parse(Path(endpoints_module.__file__).read_text())
    emitted: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        assigned: dict[str, set[str]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, set()).update(_values(node.value))
        for node in ast.walk(func):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "_event"
            ):
                first = node.args[0]
                if isinstance(first, ast.Name):
                    emitted.update(assigned[first.id])
                else:
                    emitted.update(_values(first))
    assert len(emitted) >= 12, emitted
    assert emitted <= _sdk_event_types(), emitted - _sdk_event_types()


def test_every_streamed_event_validates_as_the_sdks_type(served: Served) -> None:
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    seen: set[str] = set()
    for body in (
        {"input": "PLAIN"},
        {"input": "THINK", "include": INCLUDE, "store": False},
        {"input": "CODEX", "tools": [WEATHER]},
    ):
        for event in served.raw_events(body):
            adapter.validate_python(event)  # required fields, their types
            seen.add(event["type"])
    assert {
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.reasoning_text.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    } <= seen  # fmt: skip


def test_streamed_call_arguments_arrive_before_the_call_ends(served: Served) -> None:
    events = served.raw_events({"input": "LONGCALL", "tools": [WEATHER]})
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert json.loads("".join(deltas)) == {"city": LONG_ARGS}
    assert len(deltas[0]) < len("".join(deltas)) / 2, f"first of {len(deltas)}: {deltas[0]!r}"
