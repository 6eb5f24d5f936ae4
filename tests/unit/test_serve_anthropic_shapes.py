"""Anthropic's shapes without a server (tsfront/serve/anthropic/): the error shape and its
statuses, the re-rendering of the edge's errors, the mapping of a Messages request onto chat's,
and a streamed message's events from parsed output."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tsfront.serve.anthropic.blocks import THINKING, MessagesFormat, stop_of
from tsfront.serve.anthropic.messages import MessagesRequest, anthropic_error, chat_of
from tsfront.serve.core.limits import Refused
from tsfront.serve.core.parsing import Pieces
from tsfront.serve.core.reply import ApiError
from tsfront.serve.core.seal import Seal
from tsfront.text.tools import CallArgs, CallStart


def test_errors_take_anthropics_type_by_status() -> None:
    cases = [
        (400, 400, "invalid_request_error"),
        (401, 401, "authentication_error"),
        (404, 404, "not_found_error"),
        (413, 413, "request_too_large"),
        (500, 500, "api_error"),
        (502, 502, "api_error"),
        (503, 529, "overloaded_error"),
        (504, 504, "timeout_error"),
        (422, 422, "invalid_request_error"),
    ]
    for given, status, kind in cases:
        reply = anthropic_error(ApiError(given, "why", param="max_tokens"))
        body = json.loads(reply.body)
        assert reply.status == status and body == {
            "type": "error",
            "error": {"type": kind, "message": "max_tokens: why"},
        }
    overloaded = anthropic_error(ApiError(503, "busy"))
    assert (b"retry-after", b"1") in overloaded.headers


def test_the_edges_error_is_rendered_again_with_its_headers() -> None:
    reply = ApiError(401, "no key", code="invalid_api_key").reply()
    reply.headers = [*reply.headers, (b"www-authenticate", b"Bearer")]
    assert json.loads(reply.body)["error"]["code"] == "invalid_api_key"  # OpenAI's by default
    shaped = reply.shaped(anthropic_error)
    assert shaped.status == 401
    assert json.loads(shaped.body)["error"]["type"] == "authentication_error"
    assert (b"www-authenticate", b"Bearer") in shaped.headers
    plain = ApiError(404, "x").reply()
    assert plain.shaped(anthropic_error).status == 404
    ok = type(reply)(200, b"{}")
    assert ok.shaped(anthropic_error) is ok  # not an error: left as it is


def _request(**kw: Any) -> MessagesRequest:
    kw.setdefault("model", "m")
    kw.setdefault("max_tokens", 10)
    return MessagesRequest(**kw)


def test_a_request_becomes_chats() -> None:
    seal = Seal(bytes(32))
    sig = seal.tag(THINKING, "o", "I think.")
    req = _request(
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I think.", "signature": sig},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                {"type": "text", "text": "and?", "cache_control": {"type": "ephemeral"}}]},
        ],
        tools=[{"name": "f", "input_schema": {"type": "object"}, "cache_control": {}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        top_k=5,
        thinking={"type": "disabled"},
    )  # fmt: skip
    chat = chat_of(req, lambda text, tag: seal.check(THINKING, "o", text, tag))
    assert chat.messages == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Calling.", "reasoning_content": "I think.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
        {"role": "user", "content": "and?"},
    ]  # fmt: skip
    assert chat.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", False)
    assert (chat.stop, chat.top_k, chat.max_tokens) == (["END"], 5, 10)
    assert chat.chat_template_kwargs == {"enable_thinking": False, "thinking": False}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "container": "c"}, "container"),
        ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}},
         "thinking"),
        ({"messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": 5}},
         "metadata"),
        ({"messages": [{"role": "user", "content": "x"}],
          "output_config": {"format": {"type": "regex"}}}, "output_config.format"),
        ({"messages": [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "forged"}]},
          {"role": "user", "content": "x"}]}, "messages[0].content[0].signature"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_refused_naming_it(body: dict[str, Any], named: str) -> None:
    with pytest.raises((ApiError, Refused)) as err:
        chat_of(_request(**body), lambda text, tag: False)
    assert named in str(err.value) or err.value.param == named


class _Stop:
    def __init__(self, matched: str | None) -> None:
        self.matched = matched


class _Choice:
    def __init__(self, finish: str, matched: str | None = None) -> None:
        self.finish = finish
        self.stop = _Stop(matched) if matched is not None else None
        self.prompt_tokens, self.cached, self.tokens = 10, 4, 7


def test_stop_reasons() -> None:
    assert stop_of(_Choice("stop")) == ("end_turn", None)  # type: ignore[arg-type]
    assert stop_of(_Choice("stop", "END")) == ("stop_sequence", "END")  # type: ignore[arg-type]
    assert stop_of(_Choice("length")) == ("max_tokens", None)  # type: ignore[arg-type]
    assert stop_of(_Choice("tool_calls")) == ("tool_use", None)  # type: ignore[arg-type]


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            event, data = block.split("\n")
            out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_streamed_message_from_parsed_output() -> None:
    seal = Seal(bytes(32))
    fmt = MessagesFormat("m", None, 10, seal, "o")
    raw = fmt.opening(0) or b""
    raw += fmt.pieces(0, Pieces(reasoning="I "))
    raw += fmt.pieces(0, Pieces(reasoning="think.", content="Hi"))
    raw += fmt.pieces(0, Pieces(calls=[CallStart(0, "call_1", "f"), CallArgs(0, '{"x"')]))
    raw += fmt.pieces(0, Pieces(calls=[CallArgs(0, ": 1}")]))
    raw += fmt.last(_Choice("tool_calls"), "", None)  # type: ignore[arg-type]
    events = _events(raw)
    assert [k for k, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop",  # thinking, its signature
        "content_block_start", "content_block_delta", "content_block_stop",  # text
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop",  # tool_use
        "message_delta", "message_stop",
    ]  # fmt: skip
    signature = events[5][1]["delta"]
    assert signature["type"] == "signature_delta"
    assert seal.check(THINKING, "o", "I think.", signature["signature"])
    tool = events[10][1]
    assert tool["index"] == 2 and tool["content_block"]["type"] == "tool_use"
    assert tool["content_block"]["id"].startswith("toolu_")
    fragments = [e[1]["delta"]["partial_json"] for e in events[11:13]]
    assert fragments == ['{"x"', ": 1}"]  # passed through as the parser gave them
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert end["usage"]["input_tokens"] == 6 and end["usage"]["cache_read_input_tokens"] == 4
