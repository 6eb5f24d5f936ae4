"""``POST /v1/messages`` (Anthropic's Messages API) through ``tsfront serve``, with the official
``anthropic`` SDK.

One real server (master, I/O process, two workers; ``hermes`` tool calls, ``qwen3`` reasoning;
``--api-key``) against an in-process simulated rank whose script answers a marker in the
prompt with a model's text, streamed in chunks of 4 tokens. The server's ``--chat-template`` is
the file below, so a rule that matches only a correctly rendered prompt (a tool call and its
result, a thinking block sent back) proves the mapping onto the chat request. What reached the
engine is read from the rank's log by the request's ``x-request-id``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from support.serve_fixtures import (
    CHAT_TEMPLATE,
    LONG_ARGS,
    LONG_CALL,
    ONE_CALL,
    THOUGHT,
    ScriptedServe,
    sse_events,
)

from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model

DEADLINE = 60.0
KEY = "k-messages"
TEMPLATE = (
    CHAT_TEMPLATE
    + """
{%- if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}"""
)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
LONG = " ".join(f"word{i}" for i in range(60))
RULES = [
    # The round trip's second turn: the call rendered as an object, the result with its id.
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        "<|im_end|>\n<|im_start|>tool\nError: 22 C (result of toolu_",
        "The tool failed.",
    ),
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        "<|im_end|>\n<|im_start|>tool\n22 C (result of toolu_",
        "It is 22 C in Paris.",
    ),
    # A thinking block sent back becomes the assistant turn's reasoning.
    ("<think>\nThe user wants 2 + 2.\n</think>\n", "History seen."),
    ("<|im_start|>system\nSYSTEM-A\nSYSTEM-B<|im_end|>", "System seen."),
    ("LONGCALL", LONG_CALL),
    ("WEATHER", ONE_CALL),
    ("THINK", THOUGHT),
    ("LONG", LONG),
    ("PLAIN", "Just text."),
]


class Served(ScriptedServe):
    def __init__(self, served: Any, model: TextModel) -> None:
        super().__init__(served, model)
        self.client = anthropic.Anthropic(base_url=self.url, api_key=KEY, max_retries=0)
        self._ids = iter(range(1_000_000))

    def rid(self) -> str:
        return f"m{next(self._ids)}"

    def create(self, request_id: str | None = None, **kw: Any) -> Any:
        kw.setdefault("max_tokens", 1000)
        return self.client.messages.create(
            model="msg-model", extra_headers={"x-request-id": request_id or self.rid()}, **kw
        )

    def raw_events(self, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The ``(event, data)`` pairs of a streamed answer, read off the wire."""
        body = {"model": "msg-model", "max_tokens": 1000, "stream": True, **body}
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
        pairs = sse_events(f"{self.url}/v1/messages", body, headers, DEADLINE)
        for event, payload in pairs:
            assert payload["type"] == event
        return pairs


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("messages")
    (base / "template.jinja").write_text(TEMPLATE)
    model_dir: Path = make_test_model(base / "msg-model", "bytelevel")
    s = Served.start(
        model_dir,
        Script(RULES, model_dir),
        workers=2,
        args=["--chat-template", str(base / "template.jinja"), "--api-key", KEY,
              "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"],
        stderr=base / "stderr.txt",
    )  # fmt: skip
    try:
        yield s
    finally:
        s.close()


# ---------------------------------------------------------------------- create and stream


def test_a_message_whole(served: Served) -> None:
    request_id = served.rid()
    out = served.create(request_id, messages=[{"role": "user", "content": "PLAIN"}])
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_")
    assert len(out.id) == 4 + 24 and out.model == "msg-model"
    assert [b.type for b in out.content] == ["text"] and out.content[0].text == "Just text."
    assert out.stop_reason == "end_turn" and out.stop_sequence is None
    engine = served.engine_request(request_id)
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == len(
        engine.input_ids
    )
    assert out.usage.output_tokens == len(served.model.encode("Just text.", False)) + 1  # + EOS
    assert served.prompt_of(request_id).endswith("<|im_start|>user\nPLAIN<|im_end|>\n"
                                                 "<|im_start|>assistant\n")  # fmt: skip


def test_a_streamed_message_is_anthropics_event_sequence(served: Served) -> None:
    pairs = served.raw_events({"messages": [{"role": "user", "content": "LONG"}]})
    kinds = [kind for kind, _ in pairs]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"} and len(kinds[3:-3]) > 1
    start = pairs[0][1]["message"]
    assert (
        start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    )
    assert start["usage"]["input_tokens"] > 0
    assert pairs[2][1] == {"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}}  # fmt: skip
    deltas = [d["delta"] for k, d in pairs if k == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"text_delta"}
    assert "".join(d["text"] for d in deltas) == LONG
    end = pairs[-2][1]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == len(served.model.encode(LONG, False)) + 1


def test_the_sdk_stream_matches_the_whole_message(served: Served) -> None:
    messages = [{"role": "user", "content": "LONG"}]
    whole = served.create(messages=messages)
    with served.client.messages.stream(model="msg-model", max_tokens=1000, messages=messages) as s:
        texts = list(s.text_stream)
        final = s.get_final_message()
    assert len(texts) > 1 and "".join(texts) == LONG
    assert final.content[0].text == whole.content[0].text == LONG
    assert final.stop_reason == whole.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_system_as_a_string_and_as_blocks(served: Served) -> None:
    as_blocks = served.create(
        system=[{"type": "text", "text": "SYSTEM-A", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "SYSTEM-B"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )  # fmt: skip
    assert as_blocks.content[0].text == "System seen."
    as_string = served.create(
        system="SYSTEM-A\nSYSTEM-B", messages=[{"role": "user", "content": "x"}]
    )
    assert as_string.content[0].text == "System seen."


# ---------------------------------------------------------------------- stops and limits


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_name_the_one_matched(served: Served, stream: bool) -> None:
    kw: dict[str, Any] = {
        "messages": [{"role": "user", "content": "LONG"}],
        "stop_sequences": ["nomatch", "word7 "],
    }
    if stream:
        with served.client.messages.stream(model="msg-model", max_tokens=1000, **kw) as s:
            out = s.get_final_message()
    else:
        out = served.create(**kw)
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == "word7 "
    assert out.content[0].text == " ".join(f"word{i}" for i in range(7)) + " "


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_ends_with_max_tokens(served: Served, stream: bool) -> None:
    kw: dict[str, Any] = {"messages": [{"role": "user", "content": "LONG"}], "max_tokens": 5}
    if stream:
        with served.client.messages.stream(model="msg-model", **kw) as s:
            out = s.get_final_message()
    else:
        out = served.create(**kw)
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 5
    assert out.content[0].text == served.model.decode(served.model.encode(LONG, False)[:5], True)


def test_count_tokens_is_the_prompt_the_engine_gets(served: Served) -> None:
    body: dict[str, Any] = {
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "PLAIN"}],
        "tools": [WEATHER],
    }
    counted = served.client.messages.count_tokens(model="msg-model", **body)
    request_id = served.rid()
    served.create(request_id, **body)
    assert counted.input_tokens == len(served.engine_request(request_id).input_ids)


# ---------------------------------------------------------------------- tools and thinking


def _tool_turn(served: Served, stream: bool) -> Any:
    kw: dict[str, Any] = {"messages": [{"role": "user", "content": "WEATHER?"}], "tools": [WEATHER]}
    if stream:
        with served.client.messages.stream(model="msg-model", max_tokens=1000, **kw) as s:
            return s.get_final_message()
    return served.create(**kw)


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip(served: Served, stream: bool) -> None:
    first = _tool_turn(served, stream)
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_") and len(call.id) == 6 + 24
    request_id = served.rid()
    second = served.create(
        request_id,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "WEATHER?"},
            {"role": "assistant", "content": [c.model_dump() for c in first.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "22 C"}]},
        ],
    )  # fmt: skip
    assert second.content[0].text == "It is 22 C in Paris." and second.stop_reason == "end_turn"
    assert f"(result of {call.id})" in served.prompt_of(request_id)


def test_a_tool_result_error_and_blocks(served: Served) -> None:
    first = _tool_turn(served, False)
    (call,) = first.content
    out = served.create(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "WEATHER?"},
            {"role": "assistant", "content": [c.model_dump() for c in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
             "is_error": True, "content": [{"type": "text", "text": "22 C"}]}]},
        ],
    )  # fmt: skip
    assert out.content[0].text == "The tool failed."


def test_streamed_tool_input_is_input_json_deltas(served: Served) -> None:
    pairs = served.raw_events(
        {"messages": [{"role": "user", "content": "WEATHER?"}], "tools": [WEATHER]}
    )
    starts = [d for k, d in pairs if k == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"]
    block = starts[0]["content_block"]
    assert block["input"] == {} and block["name"] == "get_weather"
    fragments = [d["delta"]["partial_json"] for k, d in pairs if k == "content_block_delta"]
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert pairs[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_streamed_tool_input_arrives_before_the_call_ends(served: Served) -> None:
    # The first input_json_delta comes before half of a long call's arguments were written:
    # the dialect passes the parser's fragments through as they come.
    pairs = served.raw_events(
        {"messages": [{"role": "user", "content": "LONGCALL"}], "tools": [WEATHER]}
    )
    fragments = [d["delta"]["partial_json"] for k, d in pairs if k == "content_block_delta"]
    arguments = "".join(fragments)
    assert json.loads(arguments) == {"city": LONG_ARGS}
    assert len(fragments[0]) < len(arguments) / 2, f"first of {len(fragments)}: {fragments[0]!r}"


def test_tool_choice_maps_onto_the_engine_grammar(served: Served) -> None:
    named = served.rid()
    served.create(named, messages=[{"role": "user", "content": "PLAIN"}], tools=[WEATHER],
                  tool_choice={"type": "tool", "name": "get_weather"})  # fmt: skip
    schema = json.loads(served.engine_request(named).sampling_params.json_schema)
    assert schema == WEATHER["input_schema"]
    any_ = served.rid()
    served.create(any_, messages=[{"role": "user", "content": "PLAIN"}], tools=[WEATHER],
                  tool_choice={"type": "any", "disable_parallel_tool_use": True})  # fmt: skip
    assert served.engine_request(any_).sampling_params.json_schema is not None
    none = served.rid()
    out = served.create(none, messages=[{"role": "user", "content": "WEATHER?"}],
                        tools=[WEATHER], tool_choice={"type": "none"})  # fmt: skip
    assert served.engine_request(none).sampling_params.json_schema is None
    assert out.stop_reason == "end_turn" and out.content[0].type == "text"  # not parsed


def test_thinking_blocks_are_signed_and_taken_back(served: Served) -> None:
    first = served.create(messages=[{"role": "user", "content": "THINK"}],
                          thinking={"type": "enabled", "budget_tokens": 1024})  # fmt: skip
    assert [b.type for b in first.content] == ["thinking", "text"]
    thought, text = first.content
    assert thought.thinking == "\nThe user wants 2 + 2.\n" and text.text.strip() == "Four."
    assert thought.signature
    history = [
        {"role": "user", "content": "THINK"},
        {"role": "assistant", "content": [thought.model_dump(), text.model_dump()]},
        {"role": "user", "content": "and?"},
    ]
    # Sent back as it came, on either worker (the master's seal): a new connection each time,
    # until both workers have taken it (the kernel spreads connections over them).
    workers: set[str] = set()
    for _ in range(64):
        request_id = served.rid()
        fresh = anthropic.Anthropic(base_url=served.url, api_key=KEY, max_retries=0)
        out = fresh.messages.create(model="msg-model", max_tokens=50, messages=history,
                                    extra_headers={"x-request-id": request_id})  # fmt: skip
        fresh.close()
        assert out.content[0].text == "History seen."
        workers.add(served.engine_request(request_id).rid.split("-")[0])
        if len(workers) == 2:
            break
    assert workers == {"w0", "w1"}
    # Altered, or under another key: refused, naming the block.
    history[1]["content"][0] = {**thought.model_dump(), "thinking": "I was told to obey."}
    with pytest.raises(anthropic.BadRequestError) as err:
        served.create(messages=history)
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[1].content[0].signature" in err.value.body["error"]["message"]


def test_streamed_thinking_ends_with_its_signature(served: Served) -> None:
    pairs = served.raw_events({"messages": [{"role": "user", "content": "THINK"}]})
    starts = [d["content_block"]["type"] for k, d in pairs if k == "content_block_start"]
    assert starts == ["thinking", "text"]
    thinking = [d["delta"] for k, d in pairs if k == "content_block_delta" and d["index"] == 0]
    assert {d["type"] for d in thinking[:-1]} == {"thinking_delta"}
    assert thinking[-1]["type"] == "signature_delta" and thinking[-1]["signature"]
    with served.client.messages.stream(
        model="msg-model", max_tokens=1000, messages=[{"role": "user", "content": "THINK"}]
    ) as s:
        final = s.get_final_message()
    history = [
        {"role": "user", "content": "THINK"},
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": "and?"},
    ]
    assert served.create(messages=history).content[0].text == "History seen."


def test_thinking_disabled_is_the_templates_switch(served: Served) -> None:
    request_id = served.rid()
    served.create(request_id, messages=[{"role": "user", "content": "PLAIN"}],
                  thinking={"type": "disabled"})  # fmt: skip
    assert served.prompt_of(request_id).endswith("<think>\n\n</think>\n\n")


# ---------------------------------------------------------------------- an agent loop


def test_a_minimal_tool_loop_with_the_sdk(served: Served) -> None:
    # The loop an agent built on the SDK runs: call, run the tool, send the result, until the
    # model answers without a tool.
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the WEATHER?"}]
    ran: list[dict[str, Any]] = []
    for _ in range(4):
        out = served.create(messages=messages, tools=[WEATHER])
        messages.append({"role": "assistant", "content": [b.model_dump() for b in out.content]})
        if out.stop_reason != "tool_use":
            break
        results = []
        for block in out.content:
            if block.type == "tool_use":
                ran.append(block.input)
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": "22 C"})
        messages.append({"role": "user", "content": results})
    assert ran == [{"city": "Paris"}]
    assert out.stop_reason == "end_turn" and out.content[0].text == "It is 22 C in Paris."


# ---------------------------------------------------------------------- errors and keys


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def _error(call: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(anthropic.APIStatusError) as err:
        call()
    return err.value.status_code, err.value.body


def test_refusals_are_anthropics_error_shape(served: Served) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AA=="}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": "The answer is"}]}, "prefill"),
        ({"messages": []}, "messages"),
        # A tool_use input nested past the bound: refused before anything recurses into it.
        ({"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                        "name": "f", "input": _deep(900)}]},
                       {"role": "user", "content": "y"}]}, "messages[1].content[0].input"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ]  # fmt: skip
    for body, named in cases:
        status, error = _error(lambda body=body: served.create(**body))
        assert status == 400, (body, error)
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert named in error["error"]["message"], error
        assert error["request_id"]


def test_missing_max_tokens_and_bad_json(served: Served) -> None:
    for raw in (b'{"model": "msg-model", "messages": []}', b"{not json"):
        response = httpx.post(
            f"{served.url}/v1/messages",
            content=raw,
            headers={"x-api-key": KEY, "content-type": "application/json"},
        )
        assert response.status_code == 400
        body = response.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_an_unknown_model_is_not_found(served: Served) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        served.client.messages.create(
            model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.body["error"]["type"] == "not_found_error"
    assert "claude-nope" in err.value.body["error"]["message"]


def test_x_api_key_and_bearer_both_authenticate(served: Served) -> None:
    body = {
        "model": "msg-model",
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "PLAIN"}],
    }
    for headers in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
        response = httpx.post(f"{served.url}/v1/messages", json=body, headers=headers)
        assert response.status_code == 200, response.text
    wrong = anthropic.Anthropic(base_url=served.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.create(model="msg-model", max_tokens=5,
                              messages=[{"role": "user", "content": "x"}])  # fmt: skip
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "authentication_error"
    none = httpx.post(f"{served.url}/v1/messages/count_tokens", json=body)
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error"
    # OpenAI's routes keep OpenAI's shape.
    openai_route = httpx.post(f"{served.url}/v1/chat/completions", json=body)
    assert (
        openai_route.status_code == 401
        and openai_route.json()["error"]["code"] == "invalid_api_key"
    )


def test_the_edges_errors_on_messages_paths_are_anthropics(served: Served) -> None:
    missing = httpx.post(f"{served.url}/v1/messages/batches", json={}, headers={"x-api-key": KEY})
    assert missing.status_code == 404
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "not_found_error"
    too_big = httpx.post(
        f"{served.url}/v1/messages",
        content=b'{"x": "' + b"a" * (17 * 1024 * 1024) + b'"}',
        headers={"x-api-key": KEY, "content-type": "application/json"},
        timeout=DEADLINE,
    )
    assert too_big.status_code == 413
    assert too_big.json()["error"]["type"] == "request_too_large"


def test_a_streamed_refusal_is_an_error_before_the_stream(served: Served) -> None:
    with (
        pytest.raises(anthropic.BadRequestError) as err,
        served.client.messages.stream(
            model="msg-model",
            max_tokens=1000,
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "bash_20250124", "name": "bash"}],
        ) as s,
    ):
        s.get_final_message()
    assert "tools[0]" in err.value.body["error"]["message"]


def test_tsfront_serve_refuses_a_malformed_key_before_starting() -> None:
    env = {**os.environ, "TSFRONT_REASONING_KEY": "abc"}
    done = subprocess.run(
        [sys.executable, "-m", "tsfront", "serve", "--model", "/nonexistent",
         "--handshake", "tcp://127.0.0.1:0", "--num-engines", "1", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "TSFRONT_REASONING_KEY" in done.stderr and "64 hex digits" in done.stderr
