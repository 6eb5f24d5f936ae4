"""What a hostile client sends to ``tsfront serve`` to hold a worker's event loop or to get a
500 out of it: the key on every route, tokenize/detokenize bounds, large work sized by the
work (history loaded from the store, the reasoning count), client history and schemas that
nest or hold lone surrogates.

One real server (master, I/O process, store, ONE worker, so every connection reaches the same
event loop) with an API key, over a model whose byte-level BPE has 129-character tokens as a
real 128k vocabulary has (`support.text_fixtures.long_token_model`): the character bounds
(context x longest token) and the cost of encoding text at them are a real model's (~1.7 s
to encode 3.6 MB). A simulated rank answers ``THINK`` with a ~30,000-token thought. The
server's template writes tool-call arguments raw, parameter by parameter, as Qwen3-Coder's
does.

`LoopWatch` measures what a client of the same worker sees: a thread polls ``GET /health``
on its own keep-alive connection while the request under test runs; the longest poll is how
long the loop was held. Run with ``-s`` for the figures.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from support.serve_fixtures import ScriptedServe
from support.text_fixtures import long_token_model, long_words

from tsfront.sim.script import Script
from tsfront.text import TextModel

DEADLINE = 60.0
CONTEXT = 40_000
KEY = "sk-hostile-loop"
AUTH = {"authorization": f"Bearer {KEY}"}
#: The loop may be held this long by one request's own steps (generous: a loaded 2-core
#: machine); every attack below held it for 1.5 s or more before its fix.
RESPONSIVE_S = 0.5
#: Qwen3-Coder's way with arguments: each parameter written raw (the arguments parsed first).
TEMPLATE = """\
{%- for t in tools or [] %}{{ t | tojson }}
{% endfor %}
{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>
{{ m.content or "" }}
{%- for call in m.tool_calls or [] %}<function={{ call.function.name }}>
{%- for k, v in call.function.arguments | items %}<parameter={{ k }}>{{ v }}</parameter>
{%- endfor %}</function>{% endfor %}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>
{% endif %}"""
WORDS = " ".join(long_words()) + " "
#: ~30,000 tokens of thought (the script encodes it; `thought_tokens` counts it).
THOUGHT = WORDS * 6_000


class Served(ScriptedServe):
    def __init__(self, served: Any, model: TextModel) -> None:
        super().__init__(served, model)
        self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=DEADLINE)

    def post(self, path: str, body: object, **kw: Any) -> httpx.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.post(path, content=data, **kw)

    def adds(self) -> int:
        return sum(c["adds"] for c in self.group.counters().values())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("hostile-loop")
    folder = long_token_model(base / "long-model", CONTEXT)
    (base / "template.jinja").write_text(TEMPLATE)
    s = Served.start(
        folder,
        Script([("THINK", f"<think>{THOUGHT}</think>\n\nDone.")], folder),
        args=["--api-key", KEY, "--chat-template", str(base / "template.jinja"),
              "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder"],
        stderr=base / "stderr.txt",
        vocab_size=TextModel.load(folder).vocab_size,
        max_model_len=CONTEXT,
        chunk_tokens=64,
        step_ms=0.0,
    )  # fmt: skip
    try:
        yield s
    finally:
        s.http.close()
        s.close()


class LoopWatch:
    """Polls ``GET /health`` from a thread, on its own keep-alive connection, until closed:
    `worst` is the longest a poll took, i.e. the longest the worker's loop was held."""

    def __init__(self, url: str) -> None:
        self._client = httpx.Client(base_url=url, timeout=DEADLINE)
        self._stop = threading.Event()
        self._first = threading.Event()
        self.worst = 0.0
        self.polls = 0
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            status = self._client.get("/health").status_code
            took = time.monotonic() - t0
            assert status == 200
            self.worst = max(self.worst, took)
            self.polls += 1
            self._first.set()

    def __enter__(self) -> LoopWatch:
        self._thread.start()
        assert self._first.wait(DEADLINE), "/health never answered"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(DEADLINE)
        self._client.close()


def watched(s: Served, what: str, request: Callable[[], httpx.Response]) -> httpx.Response:
    """``request()`` while a `LoopWatch` polls: asserts the loop stayed responsive."""
    with LoopWatch(s.url) as watch:
        t0 = time.monotonic()
        response = request()
        took = time.monotonic() - t0
    print(f"\n{what}: {response.status_code} in {took:.2f}s; /health worst {watch.worst:.3f}s "
          f"over {watch.polls} polls")  # fmt: skip
    assert watch.worst < RESPONSIVE_S, (
        f"{what}: the worker's loop was held {watch.worst:.2f}s (the request took {took:.2f}s)"
    )
    return response


def openai_error(response: httpx.Response, status: int, param: str | None, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.text
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert error["param"] == param, error
    assert words in error["message"], error["message"]


# ---------------------------------------------------------------------- 2. the key


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/v1/tokenize"),
     ("GET", "/v1/models"), ("GET", "/no/such/route"), ("POST", "/tokenize/")],
)  # fmt: skip
def test_every_route_but_health_and_metrics_needs_the_key(
    served: Served, method: str, path: str
) -> None:
    # Before: /tokenize and /detokenize (vLLM's aliases without /v1) answered without a key.
    body = {"prompt": "hi"} if "detokenize" not in path else {"tokens": [5]}
    bare = httpx.request(method, f"{served.url}{path}", json=body, timeout=DEADLINE)
    assert bare.status_code == 401, (path, bare.status_code, bare.text)
    assert bare.json()["error"]["code"] == "invalid_api_key"
    keyed = served.http.request(method, path, json=body)
    assert keyed.status_code != 401, keyed.text


def test_health_and_metrics_stay_open(served: Served) -> None:
    for path in ("/health", "/metrics"):
        assert httpx.get(f"{served.url}{path}", timeout=DEADLINE).status_code == 200, path


# ---------------------------------------------------------------------- 3. tokenize, detokenize


def test_a_huge_tokenize_prompt_does_not_hold_the_loop(served: Served) -> None:
    # 3.6 MB under the bound (40,000 tokens x 129 characters): it must be encoded, and was on
    # the loop (~1.7 s here).
    text = WORDS * (3_600_000 // len(WORDS))
    out = watched(served, "tokenize 3.6 MB", lambda: served.post("/tokenize", {"prompt": text}))
    assert out.status_code == 200, out.text
    assert out.json()["count"] == len(served.model.encode(text))


def test_tokenize_messages_of_a_huge_text_do_not_hold_the_loop(served: Served) -> None:
    text = WORDS * (3_600_000 // len(WORDS))
    body = {"messages": [{"role": "user", "content": text}], "return_token_strs": True}
    out = watched(served, "tokenize 3.6 MB of messages", lambda: served.post("/v1/tokenize", body))
    assert out.status_code == 200, out.text
    reply = out.json()
    assert len(reply["token_strs"]) == reply["count"] > 30_000


def test_detokenize_is_capped_by_the_context(served: Served) -> None:
    # Before: 1M copies of the longest token built a 129 MB reply on the loop.
    longest = served.model.encode(" " + long_words()[1], add_special_tokens=False)
    assert len(longest) == 1
    body = json.dumps({"tokens": longest * 1_000_000}).encode()
    out = watched(served, "detokenize 1M tokens", lambda: served.post("/detokenize", body))
    openai_error(out, 400, "tokens", f"at most {CONTEXT}")
    # The context's worth is served (5 MB of text), off the loop.
    body = json.dumps({"tokens": longest * CONTEXT}).encode()
    out = watched(served, "detokenize 40,000 tokens", lambda: served.post("/detokenize", body))
    assert out.status_code == 200, out.text
    assert len(out.json()["prompt"]) == CONTEXT * 129


# ---------------------------------------------------------------------- 4. history from the store


def test_a_stored_history_is_rendered_off_the_loop(served: Served) -> None:
    # A 3.6 MB input is stored (its own request is large, so its body sends it off the loop);
    # then a request of ~100 bytes continues from it: the history's render and encode were
    # sized by that body, and held the loop ~1.7 s.
    text = WORDS * (3_500_000 // len(WORDS))
    first = served.post("/v1/responses", {"input": text, "max_output_tokens": 1})
    assert first.status_code == 200, first.text
    rid = first.json()["id"]
    body = {"previous_response_id": rid, "input": "and then?", "max_output_tokens": 1}
    out = watched(served, "continue a 3.5 MB history", lambda: served.post("/v1/responses", body))
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]


# ---------------------------------------------------------------------- 5. reasoning tokens


def thought_tokens(s: Served) -> int:
    return len(s.model.encode(f"<think>{THOUGHT}</think>", add_special_tokens=False))


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_tokens_are_counted_from_the_engine_tokens(served: Served, stream: bool) -> None:
    # Before: the 3.8 MB thought was encoded again on the loop (~1.7 s) to count it.
    body = {"input": "THINK", "max_output_tokens": 35_000, "stream": stream}
    out = watched(
        served,
        f"a 30,000-token thought (stream={stream})",
        lambda: served.post("/v1/responses", body),
    )
    assert out.status_code == 200, out.text
    if stream:
        events = [
            json.loads(line[6:]) for line in out.text.splitlines() if line.startswith("data: ")
        ]
        assert events[-1]["type"] == "response.completed", events[-1]["type"]
        response = events[-1]["response"]
    else:
        response = out.json()
    usage = response["usage"]
    counted = usage["output_tokens_details"]["reasoning_tokens"]
    # The thought's tokens with its tags, to within the chunk that closes it (up to 64 tokens
    # here, split by characters, so the few short tokens of "\n\nDone." in it may count too;
    # one token a chunk is exact: tests/unit/test_serve_offload.py).
    assert abs(counted - thought_tokens(served)) <= 64, (counted, thought_tokens(served))
    assert counted <= usage["output_tokens"]
    assert response["output"][0]["type"] == "reasoning"


# ---------------------------------------------------------------------- 7. client history


DEEP_ARGUMENTS = "[" * 5000 + "]" * 5000
SURROGATE_ARGUMENTS = '{"city": "\\ud800"}'  # JSON text whose value is a lone surrogate


def chat_history(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


def responses_input(arguments: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "words"),
    [(DEEP_ARGUMENTS, "at most 64 levels"), (SURROGATE_ARGUMENTS, "surrogate")],
    ids=["5000-deep", "lone-surrogate"],
)
@pytest.mark.parametrize("route", ["chat", "responses", "tokenize"])
def test_client_history_that_cannot_be_rendered_is_a_400(
    served: Served, route: str, arguments: str, words: str
) -> None:
    # Before: RecursionError (deep) and the tokenizer's TypeError (the surrogate, written raw
    # by the template) were 500s; /v1/tokenize's a plain-text "Internal Server Error".
    adds = served.adds()
    if route == "chat":
        out = served.post("/v1/chat/completions", {"messages": chat_history(arguments)})
        param = "messages"
    elif route == "tokenize":
        out = served.post("/v1/tokenize", {"messages": chat_history(arguments)})
        param = "messages"
    else:
        out = served.post("/v1/responses", {"input": responses_input(arguments)})
        param = "input"
    openai_error(out, 400, param, words)
    assert "function.arguments" in out.json()["error"]["message"]
    assert served.adds() == adds


def test_a_history_with_sane_arguments_is_served(served: Served) -> None:
    out = served.post(
        "/v1/chat/completions",
        {"messages": chat_history('{"city": "Paris \\ud83d\\ude00"}'), "max_tokens": 1},
    )
    assert out.status_code == 200, out.text


# ---------------------------------------------------------------------- 8. deep schemas


def deep_schema(levels: int) -> str:
    """The JSON text of a schema nested ``levels`` levels (arrays of arrays of ... strings);
    as text, since ``json.dumps`` itself stops short of ~1,000 levels."""
    return '{"type": "array", "items": ' * (levels - 1) + '{"type": "string"}' + "}" * (levels - 1)


def with_schema(body: dict[str, Any], levels: int) -> bytes:
    """``body`` with its ``"SCHEMA"`` string replaced by `deep_schema` ``(levels)``."""
    return json.dumps(body).replace('"SCHEMA"', deep_schema(levels)).encode()


# The report's schemas nested 640-980 levels. The body's own nesting is the schema's plus the
# fields around it, and msgspec's decoder refuses a body at what is left of the recursion
# limit below the frames of the call that decodes it (~985-995 levels: a 400 that names no
# field, test_serve_hostile_requests.py); 900 keeps every case clear of that edge.
DEEP = 900
CHAT = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": "SCHEMA"}}
SCHEMA_CASES = [
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": "SCHEMA"}}}, DEEP,
     "response_format"),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"json": "SCHEMA"}}, DEEP,
     "structured_outputs"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [TOOL]}, DEEP, "tools"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [TOOL], "tool_choice": "required"}, 640,
     "tools"),
    ("/v1/tokenize", {"messages": CHAT, "tools": [TOOL]}, DEEP, "tools"),
    ("/v1/responses", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": "SCHEMA"}}}, DEEP, "text.format"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "text", "x": "SCHEMA"}}}, DEEP,
     "text.format"),
    ("/v1/responses", {"input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": "SCHEMA"}]}, DEEP, "tools"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f", "x": "SCHEMA"}]},
     DEEP, "tools"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "levels", "param"),
    SCHEMA_CASES,
    ids=["response_format", "structured_outputs", "tools-auto", "tools-required-640",
         "tokenize-tools", "text.format", "text.format-echoed", "responses-tools",
         "responses-tools-echoed"],
)  # fmt: skip
def test_a_deep_schema_is_a_400_that_names_the_limit(
    served: Served, path: str, body: dict[str, Any], levels: int, param: str
) -> None:
    # Before: RecursionError (json.dumps, the tool schema, the response's encoder): a 500.
    adds = served.adds()
    out = served.post(path, with_schema(body, levels))
    openai_error(out, 400, param, "at most 64 levels")
    assert served.adds() == adds


def test_a_schema_at_the_limit_is_served(served: Served) -> None:
    # response_format > json_schema > the schema: 62 levels of schema are 64 of the field.
    body = {
        "messages": CHAT,
        "max_tokens": 1,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": "SCHEMA"},
        },
    }
    out = served.post("/v1/chat/completions", with_schema(body, 62))
    assert out.status_code == 200, out.text
    out = served.post("/v1/chat/completions", with_schema(body, 63))
    openai_error(out, 400, "response_format", "at most 64 levels")


def test_nothing_answers_a_plain_text_500(served: Served) -> None:
    # Every error above is JSON; this is the route that was not under the handler's guard.
    out = served.post("/v1/tokenize", {"messages": chat_history(SURROGATE_ARGUMENTS)})
    assert out.headers["content-type"] == "application/json", out.text


def test_the_model_folder_is_what_the_docstring_says(served: Served) -> None:
    assert served.model.max_token_chars == 129
    assert served.model.max_model_len == CONTEXT
