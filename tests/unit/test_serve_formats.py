"""The streamed response bytes of `tsfront.serve.openai.formats`: the fast last events are the same
JSON as the dict-built ones, and what is built once (the model's JSON, the envelope) belongs
to its own request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tsfront.serve.core.choice import Choice
from tsfront.serve.core.shape import Format
from tsfront.serve.openai.formats import ChatFormat, CompletionFormat


def parse(event: bytes) -> Any:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])


def choice(index: int, finish: str) -> Choice:
    ch = Choice(index, None, None, None, 3)  # type: ignore[arg-type]  # only index, finish read
    ch.finish = finish
    return ch


@pytest.mark.parametrize("cls", [CompletionFormat, ChatFormat])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("text", ["", " w5", 'quote " back \\ nl \n é 😀 \x00'])
@pytest.mark.parametrize(("index", "finish"), [(0, "length"), (3, "stop")])
def test_last_event_is_the_dict_built_event(
    cls: type[Format], usage: bool, text: str, index: int, finish: str
) -> None:
    fmt = cls('m "x"', None, 1, usage)
    ch = choice(index, finish)
    fast = fmt.last(ch, text, None)
    if cls is CompletionFormat:
        fields: dict[str, Any] = {"index": index, "text": text}
    else:
        fields = {"index": index, "delta": {"content": text} if text else {}}
    slow = fmt.event({**fields, "logprobs": None, "finish_reason": finish})
    assert parse(fast) == parse(slow)


def test_two_requests_get_their_own_id_model_and_bytes() -> None:
    a = CompletionFormat("model-a", None, 1, False)
    b = CompletionFormat("model-b", None, 1, False)
    c = CompletionFormat("model-a", None, 1, False)  # the cached name again
    events = [parse(f.head(0) + b'"t"' + f.tail) for f in (a, b, c)]
    lasts = [parse(f.last(choice(0, "length"), "t", None)) for f in (a, b, c)]
    for made, f in zip(events + lasts, [a, b, c] * 2, strict=True):
        assert made["id"] == f.id and made["model"] == f.model
        assert made["id"].startswith("cmpl-") and len(made["id"]) == 5 + 24
    assert len({a.id, b.id, c.id}) == 3
    assert [e["model"] for e in events] == ["model-a", "model-b", "model-a"]
    chat = ChatFormat("model-b", None, 1, False)
    assert parse(chat.last(choice(0, "stop"), "", None))["object"] == "chat.completion.chunk"
    assert chat.id.startswith("chatcmpl-") and chat.id != b.id


@pytest.mark.parametrize("usage", [False, True])
def test_a_text_event_is_the_same_bytes_in_each_second(
    usage: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The envelope after the id is made once per (second, model, usage): a request of a
    later second carries its own ``created``, and every event is the bytes of the shape."""
    import tsfront.serve.core.shape as shape

    for now in (1000.25, 1000.75, 1001.5, 1000.5):
        monkeypatch.setattr(shape.time, "time", lambda now=now: now)
        fmt = ChatFormat('m "x"', None, 1, usage)
        usage_field = ',"usage":null' if usage else ""
        expected = (
            f'data: {{"id":"{fmt.id}","object":"chat.completion.chunk","created":{int(now)},'
            f'"model":"m \\"x\\""{usage_field},"choices":[{{"index":2,'
            '"delta":{"content":"t"},"logprobs":null,"finish_reason":null}]}\n\n'
        )
        assert fmt.head(2) + b'"t"' + fmt.tail == expected.encode()
        assert fmt.created == int(now)
        assert parse(fmt.head(0) + b'"t"' + fmt.tail)["created"] == int(now)
        assert fmt.id[len("chatcmpl-") :].isalnum() and fmt.id == fmt.id.lower()


def test_parsed_output_holding_a_lone_surrogate_is_encoded_not_raised() -> None:
    # The parsers never give one (they write a decoded surrogate back as its escape); the
    # encoders of what carries their output still may not raise on one (issue 36, item 6).
    from tsfront.serve.core.parsing import Pieces
    from tsfront.serve.core.shape import encode_json
    from tsfront.serve.responses.endpoints import ResponsesFormat, ResponsesRequest
    from tsfront.text.tools import CallArgs, CallStart

    lone = "a\ud800b"
    assert json.loads(encode_json({"k": [lone, "é", 1]})) == {"k": [lone, "é", 1]}
    assert encode_json({"k": "é"}) == '{"k":"é"}'.encode()  # the usual bytes otherwise
    calls = [CallStart(0, "call_1", lone), CallArgs(0, '{"x":"' + lone + '"}')]
    pieces = Pieces(reasoning=lone, content=lone, calls=calls)
    chat = ChatFormat("m", None, 1, False)
    events = [parse(e + b"\n\n") for e in chat.pieces(0, pieces).split(b"\n\n") if e]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"reasoning_content": lone} and deltas[1] == {"content": lone}
    assert deltas[2]["tool_calls"][0]["function"]["name"] == lone
    assert deltas[3]["tool_calls"][0]["function"]["arguments"] == '{"x":"' + lone + '"}'
    responses = ResponsesFormat("m", None, ResponsesRequest())
    for block in responses.pieces(0, pieces).split(b"\n\n"):
        if block:
            json.loads(block.split(b"\ndata: ", 1)[1])
