"""``tsfront serve`` against TokenSpeed 0.1.1's real engine transport, with the openai client.

One server per module (two uvicorn workers) whose bound handshake the interop harness's two
ranks dial (the engine's own ``connect_msgpack_engine``, ``MsgpackRecvSocket``,
``MsgpackSendSocket``). The model is the text layer's word-level test model (token ``i``
reads ``w<i>``), so the harness's deterministic tokens (`sim_rules.token_at`) give the exact
text. Covers a streamed completion, a chat (whole and streamed) and a stop string whose
ABORT the engine decodes (read back from the harness log). About 10 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from harness_process import Harness, spawn_harness
from sim_rules import token_at

from tsfront.testing import ServeProcess

DEADLINE = 30.0


def words(prompt_len: int, count: int) -> list[str]:
    return [f"w{token_at(prompt_len, i)}" for i in range(count)]


class Served:
    def __init__(self, server: ServeProcess, harness: Harness, url: str) -> None:
        self.server = server
        self.harness = harness
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def served(interop_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tsfront.text.testing import make_test_model

    tmp = tmp_path_factory.mktemp("serve")
    model = make_test_model(tmp / "tiny-words", "wordlevel")
    server = ServeProcess(
        [
            "--model",
            str(model),
            "--handshake",
            "tcp://127.0.0.1:0",
            "--num-engines",
            "2",
            "--workers",
            "2",
            "--port",
            "0",
            "--handshake-timeout",
            "60",
        ]
    )
    harness = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        harness = spawn_harness(interop_python, handshake, tmp / "harness.jsonl", 2, 0)
        url = server.wait_line(r"^listening: (http://\S+)", DEADLINE).group(1)
        yield Served(server, harness, url)
    finally:
        assert server.stop() == 0
        if harness is not None:
            harness.stop()


def test_streamed_completion_on_real_transport(served: Served) -> None:
    stream = served.client.completions.create(
        model="tiny-words",
        prompt=[5, 6, 7],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for event in stream:
        if event.choices:
            text += event.choices[0].text
            finish = event.choices[0].finish_reason or finish
        if event.usage:
            usage = event.usage
    assert text.split() == words(3, 12)
    assert finish == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 12)


def test_chat_on_real_transport(served: Served) -> None:
    messages = [{"role": "user", "content": "w5 w6"}]
    whole = served.client.chat.completions.create(
        model="tiny-words", messages=messages, max_tokens=6
    )
    prompt_len = whole.usage.prompt_tokens
    assert whole.choices[0].message.content.split() == words(prompt_len, 6)
    streamed = "".join(
        e.choices[0].delta.content or ""
        for e in served.client.chat.completions.create(
            model="tiny-words", messages=messages, max_tokens=6, stream=True
        )
        if e.choices
    )
    assert streamed.split() == words(prompt_len, 6)


def test_stop_string_aborts_on_the_real_engine(served: Served) -> None:
    expected = words(2, 40)
    stop = f"{expected[3]} {expected[4]}"
    out = served.client.completions.create(
        model="tiny-words", prompt=[5, 6], max_tokens=2000, stop=[stop]
    )
    assert out.choices[0].text.split() == expected[:3]
    assert out.choices[0].finish_reason == "stop"
    deadline = time.monotonic() + DEADLINE
    while not served.harness.events("abort"):
        assert time.monotonic() < deadline, "the engine never decoded the ABORT"
        time.sleep(0.02)


_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": _SCHEMA},
    }
]
_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<n>", "schema": _SCHEMA, "end": "</n>"}],
    "triggers": ["<n>"],
}


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("chat", {"response_format": {"type": "json_object"}}, "json_schema"),
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "n", "schema": _SCHEMA, "strict": True}}},
            "json_schema",
        ),
        ("completions", {"response_format": {"type": "json_object"}}, "json_schema"),
        ("chat", {"structured_outputs": {"regex": "w[0-9]+"}}, "regex"),
        ("completions", {"structured_outputs": {"choice": ["a b", "c.d"]}}, "regex"),
        ("chat", {"structured_outputs": {"grammar": 'root ::= "w" [0-9]+'}}, "ebnf"),
        ("chat", {"response_format": _TAG}, "structural_tag"),
        ("chat", {"tools": _TOOLS, "tool_choice": "required"}, "json_schema"),
        (
            "chat",
            {"tools": _TOOLS, "tool_choice": {"type": "function", "function": {
                "name": "get_weather"}}},
            "json_schema",
        ),
    ],
)  # fmt: skip
def test_grammar_fields_are_accepted_by_the_engine_decoder(
    served: Served, route: str, body: dict, field: str
) -> None:
    # tsfront serve maps each request shape onto one grammar field; the engine's own
    # transport decodes it (and verify()s the request) without refusing it.
    request_id = f"g{abs(hash((route, repr(body)))) % 10**9}"
    headers = {"x-request-id": request_id}
    if route == "chat":
        out = served.client.chat.completions.create(
            model="tiny-words",
            messages=[{"role": "user", "content": "w5"}],
            max_tokens=4,
            extra_headers=headers,
            extra_body=body,
        )
        assert out.choices[0].finish_reason == "length"
    else:
        out = served.client.completions.create(
            model="tiny-words", prompt="w5", max_tokens=4, extra_headers=headers, extra_body=body
        )
        assert out.choices[0].finish_reason == "length"
    deadline = time.monotonic() + DEADLINE
    while True:
        seen = [r for r in served.harness.events("request") if r["rid"].endswith(request_id)]
        if seen:
            break
        assert time.monotonic() < deadline, "the engine logged no request"
        time.sleep(0.02)
    (record,) = seen
    sp = record["sampling_params"]
    assert record.get("validation_error") is None
    assert isinstance(sp[field], str) and sp[field]
    grammars = ("json_schema", "regex", "ebnf", "structural_tag")
    assert [name for name in grammars if sp.get(name) is not None] == [field]
    aborted = [r for r in served.harness.events("finish") if r["rid"] == record["rid"]]
    assert not [r for r in aborted if r.get("reason") == "abort"]
