"""``POST /v1/messages`` against TokenSpeed 0.1.1's real engine transport, with the official
``anthropic`` SDK.

One server (two workers, ``hermes`` tool calls, ``--api-key``) whose handshake the interop
harness's rank dials (the engine's own ``connect_msgpack_engine``, ``MsgpackRecvSocket``,
``MsgpackSendSocket``). The harness answers by script (``--replies``: the token ids of a
marker in the prompt → the ids it emits, ending with the model's EOS), so the model writes
plain text, a tool call, and the answer to the call's result; every other byte is the
engine's. Covers create and stream, a tool round trip (whole and streamed), stop_sequences,
max_tokens, usage against what the engine decoded, count_tokens, and errors, whole and
streamed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from harness_process import Harness, spawn_harness

from tsfront.testing import ServeProcess
from tsfront.text import TextModel

DEADLINE = 30.0
KEY = "k-interop"
TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{%- if message.content %}
{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>{{ call.function.name }} {{ call.function.arguments | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
WEATHER = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LONG = " ".join(f"word{i}" for i in range(30))
# Marker (a word in the prompt) → what the model writes. The result marker comes first: the
# second turn's prompt holds the first's marker too.
SCRIPT = [
    ("RESULTMARK", "It is 22 C in Paris."),
    ("WEATHERMARK", ONE_CALL),
    ("LONGMARK", LONG),
    ("PLAINMARK", "Just text."),
]


class Served:
    def __init__(self, server: ServeProcess, harness: Harness, url: str, model: TextModel):
        self.server, self.harness, self.model = server, harness, model
        self.client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
        self._ids = iter(range(1_000_000))

    def create(self, **kw: Any) -> tuple[Any, dict[str, Any]]:
        """The answer and the request as the engine decoded it (from the harness's log)."""
        request_id = f"i{next(self._ids)}"
        kw.setdefault("max_tokens", 300)
        if kw.pop("stream", False):
            with self.client.messages.stream(
                model="tiny-bytes", extra_headers={"x-request-id": request_id}, **kw
            ) as stream:
                out = stream.get_final_message()
        else:
            out = self.client.messages.create(
                model="tiny-bytes", extra_headers={"x-request-id": request_id}, **kw
            )
        return out, self.engine_request(request_id)

    def engine_request(self, request_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE
        while True:
            seen = [r for r in self.harness.events("request") if r["rid"].endswith(request_id)]
            if seen:
                (record,) = seen
                return record
            assert time.monotonic() < deadline, "the engine logged no request"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def served(interop_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tsfront.text.testing import make_test_model

    tmp = tmp_path_factory.mktemp("messages")
    model_dir = make_test_model(tmp / "tiny-bytes", "bytelevel")
    (tmp / "template.jinja").write_text(TEMPLATE)
    model = TextModel.load(model_dir)
    eos = model.eos_token_ids[0]
    replies = [
        {"when": model.encode(mark, False), "emit": [*model.encode(text, False), eos]}
        for mark, text in SCRIPT
    ]
    (tmp / "replies.json").write_text(json.dumps(replies))
    server = ServeProcess(
        [
            "--model", str(model_dir), "--handshake", "tcp://127.0.0.1:0", "--num-engines", "1",
            "--workers", "2", "--port", "0", "--handshake-timeout", "60",
            "--chat-template", str(tmp / "template.jinja"), "--tool-call-parser", "hermes",
            "--api-key", KEY,
        ]
    )  # fmt: skip
    harness = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
        harness = spawn_harness(
            interop_python, handshake, tmp / "harness.jsonl", 1, 0,
            "--vocab-size", str(vocab), "--eos-token-id", str(eos),
            "--replies", str(tmp / "replies.json"),
        )  # fmt: skip
        url = server.wait_line(r"^listening: (http://\S+)", DEADLINE).group(1)
        yield Served(server, harness, url, model)
    finally:
        assert server.stop() == 0
        if harness is not None:
            harness.stop()


def _tokens(served: Served, text: str) -> int:
    return len(served.model.encode(text, False))


@pytest.mark.parametrize("stream", [False, True])
def test_a_message_and_its_usage_on_real_transport(served: Served, stream: bool) -> None:
    out, engine = served.create(messages=[{"role": "user", "content": "PLAINMARK"}], stream=stream)
    assert out.id.startswith("msg_") and out.content[0].text == "Just text."
    assert out.stop_reason == "end_turn"
    cached = out.usage.cache_read_input_tokens or 0
    assert out.usage.input_tokens + cached == len(engine["input_ids"])
    assert out.usage.output_tokens == _tokens(served, "Just text.") + 1  # + EOS


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip_on_real_transport(served: Served, stream: bool) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "WEATHERMARK?"}]
    first, _ = served.create(messages=messages, tools=[WEATHER], stream=stream)
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    messages += [
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "RESULTMARK"}]},
    ]  # fmt: skip
    second, engine = served.create(messages=messages, tools=[WEATHER], stream=stream)
    assert second.content[0].text == "It is 22 C in Paris." and second.stop_reason == "end_turn"
    prompt = served.model.decode(engine["input_ids"], skip_special_tokens=False)
    assert '<tool_call>get_weather {"city": "Paris"}</tool_call>' in prompt


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_on_real_transport(served: Served, stream: bool) -> None:
    out, engine = served.create(
        messages=[{"role": "user", "content": "LONGMARK"}], stop_sequences=["word4 "], stream=stream
    )
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == "word4 "
    assert out.content[0].text == "word0 word1 word2 word3 "
    # The match ended the engine request (an ABORT the engine decoded).
    deadline = time.monotonic() + DEADLINE
    while not [a for a in served.harness.events("abort") if a["rid"] == engine["rid"]]:
        assert time.monotonic() < deadline, "the engine never decoded the ABORT"
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_on_real_transport(served: Served, stream: bool) -> None:
    out, engine = served.create(
        messages=[{"role": "user", "content": "LONGMARK"}], max_tokens=6, stream=stream
    )
    assert engine["sampling_params"]["max_new_tokens"] == 6
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 6


def test_count_tokens_on_real_transport(served: Served) -> None:
    body: dict[str, Any] = {
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "PLAINMARK"}],
        "tools": [WEATHER],
    }
    counted = served.client.messages.count_tokens(model="tiny-bytes", **body)
    _, engine = served.create(**body)
    assert counted.input_tokens == len(engine["input_ids"])


@pytest.mark.parametrize("stream", [False, True])
def test_errors_on_real_transport(served: Served, stream: bool) -> None:
    def call(client: anthropic.Anthropic, **kw: Any) -> None:
        body = {"model": "tiny-bytes", "max_tokens": 5, **kw}
        if stream:
            with client.messages.stream(**body) as s:
                s.get_final_message()
        else:
            client.messages.create(**body)

    plain = [{"role": "user", "content": "PLAINMARK"}]
    image = [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as bad:
        call(served.client, messages=image)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        call(served.client, messages=plain, model="claude-x")
    assert missing.value.body["error"]["type"] == "not_found_error"
    wrong = anthropic.Anthropic(base_url=str(served.client.base_url), api_key="no", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        call(wrong, messages=plain)
    assert denied.value.body["error"]["type"] == "authentication_error"
