"""``POST /v1/responses`` through ``tsfront serve``, with the official ``openai`` client.

One real server (master, I/O process, the responses store process, two workers; ``hermes``
tool calls, ``qwen3`` reasoning) against an in-process simulated rank whose script answers a
marker in the prompt with a model's text, streamed in chunks of 1 to 4 tokens drawn per
request. The server's ``--chat-template`` is the file below, so a rule that matches only a
correctly rendered prompt (a function call and its output, a previous response's turn)
proves the rendering. Which worker served a request is read from its engine rid
(``w<worker>-…-<x-request-id>``); what reached the engine (a grammar) from the rank's log.
The store's bounds are checked on the store process itself; the last test kills it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents  # openai-agents (the test extra)
import httpx
import openai
import pytest
from support.serve_fixtures import CHAT_TEMPLATE, ONE_CALL, THOUGHT, ScriptedServe, weather_agent

from tsfront.serve.processes.store import Memory, StoreClient, StoreProcess, StoreUnavailable
from tsfront.sim.script import Script
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model

DEADLINE = 60.0
TEMPLATE = CHAT_TEMPLATE
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}
LONG = " ".join(f"word{i}" for i in range(60))
ENDLESS = "a " * 6000
AGENT_ANSWER = "It is 22 C and sunny in Paris."
RULES = [
    # The round trip's second turn: the call rendered as an object, the output with its id.
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        "<|im_end|>\n<|im_start|>tool\n22 C (result of call_",
        "It is 22 C in Paris.",
    ),
    # previous_response_id: the earlier turn (its input and its output) precedes the new one.
    (
        "user\nMy name is Ada.<|im_end|>\n<|im_start|>assistant\nHello Ada.<|im_end|>\n"
        "<|im_start|>user\nNAME?",
        "Your name is Ada.",
    ),
    ("<think>Earlier thought.</think>\nSure.<|im_end|>", "History seen."),
    ("22 C and sunny in Paris", AGENT_ANSWER),
    ("weather in Paris", ONE_CALL),
    ("My name is Ada.", "Hello Ada."),
    ("WEATHER", ONE_CALL),
    ("THINK", THOUGHT),
    ("JSON", '{"answer": 4}'),
    ("ENDLESS", ENDLESS),
    ("LONG", LONG),
    ("PLAIN", "Just text."),
]


class Served(ScriptedServe):
    def __init__(self, served: Any, model: TextModel) -> None:
        super().__init__(served, model)
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)

    def worker_of(self, request_id: str) -> str:
        return str(self.engine_request(request_id).rid.split("-")[0])

    def aborts(self) -> int:
        return sum(c["aborts"] for c in self.group.counters().values())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("responses")
    (base / "template.jinja").write_text(TEMPLATE)
    return make_test_model(base / "resp-model", "bytelevel")


def _start(model_dir: Path, workers: int, *flags: str) -> Served:
    return Served.start(
        model_dir,
        Script(RULES, model_dir),
        workers=workers,
        args=["--chat-template", str(model_dir.parent / "template.jinja"),
              "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3", *flags],
        stderr=model_dir.parent / f"stderr-{workers}-{len(flags)}.txt",
    )  # fmt: skip


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[Served]:
    s = _start(model_dir, 2)
    try:
        yield s
    finally:
        s.close()


_ids = iter(range(1_000_000))


def rid() -> str:
    return f"r{next(_ids)}"


def create(s: Served, request_id: str | None = None, **kw: Any) -> Any:
    return s.client.responses.create(
        model="resp-model", extra_headers={"x-request-id": request_id or rid()}, **kw
    )


def events_of(s: Served, request_id: str | None = None, **kw: Any) -> list[Any]:
    stream = s.client.responses.create(
        model="resp-model", stream=True, extra_headers={"x-request-id": request_id or rid()}, **kw
    )
    return list(stream)


def check_sequence(events: list[Any]) -> None:
    """Numbered 0, 1, 2, … in order; created, in_progress first; completed/incomplete last;
    every item added before its deltas and done after them."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")
    opened: set[str] = set()
    closed: set[str] = set()
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            opened.add(e.item.id)
        elif e.type == "response.output_item.done":
            assert e.item.id in opened
            closed.add(e.item.id)
        elif hasattr(e, "item_id"):
            assert e.item_id in opened and e.item_id not in closed, e
    assert opened == closed


# ---------------------------------------------------------------------- plain and streamed


def test_a_plain_response(served: Served) -> None:
    request_id = rid()
    out = create(served, request_id, input="PLAIN", instructions="Be brief.", metadata={"k": "v"})
    assert out.object == "response" and out.id.startswith("resp_")
    assert out.status == "completed" and out.output_text == "Just text."
    (item,) = out.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text" and item.content[0].annotations == []
    assert out.metadata == {"k": "v"} and out.store is True and out.parallel_tool_calls
    assert out.usage is not None and out.usage.output_tokens > 0
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.input_tokens == len(served.engine_request(request_id).input_ids)
    prompt = served.prompt_of(request_id)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nPLAIN")


def test_a_streamed_response_matches_the_whole_one(served: Served) -> None:
    whole = create(served, input="LONG")
    events = events_of(served, input="LONG")
    check_sequence(events)
    kinds = [e.type for e in events]
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # it was streamed in pieces
    assert "".join(deltas) == whole.output_text == LONG
    done = events[-1].response
    assert done.output_text == LONG and done.status == "completed" and done.usage is not None


def test_the_sdk_stream_helper(served: Served) -> None:
    with served.client.responses.stream(model="resp-model", input="PLAIN") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == "Just text."


def test_sse_event_lines_name_the_type(served: Served) -> None:
    with httpx.stream(
        "POST",
        f"{served.url}/v1/responses",
        json={"input": "PLAIN", "stream": True},
        timeout=DEADLINE,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    pairs = list(zip(lines[::2], lines[1::2], strict=True))
    for event, data in pairs:
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]
    assert "[DONE]" not in lines[-1]


# ---------------------------------------------------------------------- tools and reasoning


def test_a_function_tool_round_trip(served: Served) -> None:
    first = create(served, input="WEATHER?", tools=[WEATHER])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    request_id = rid()
    second = create(
        served,
        request_id,
        tools=[WEATHER],
        input=[
            {"role": "user", "content": "WEATHER?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "22 C"},
        ],
    )  # fmt: skip
    assert second.output_text == "It is 22 C in Paris."
    assert f"(result of {call.call_id})" in served.prompt_of(request_id)


def test_a_streamed_function_call(served: Served) -> None:
    events = events_of(served, input="WEATHER?", tools=[WEATHER])
    check_sequence(events)
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args == done.arguments and json.loads(args) == {"city": "Paris"}
    (item,) = events[-1].response.output
    assert item.type == "function_call" and item.arguments == args


def test_a_named_tool_choice_is_the_engine_grammar(served: Served) -> None:
    request_id = rid()
    out = create(served, request_id, input="JSON", tools=[WEATHER],
           tool_choice={"type": "function", "name": "get_weather"})  # fmt: skip
    schema = json.loads(served.engine_request(request_id).sampling_params.json_schema)
    assert schema == WEATHER["parameters"]
    (call,) = out.output  # the constrained object, as the named function's arguments
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"answer": 4}


def test_reasoning_whole_and_streamed(served: Served) -> None:
    request_id = rid()
    out = create(served, request_id, input="THINK")
    kinds = [item.type for item in out.output]
    assert kinds == ["reasoning", "message"]
    assert out.output[0].content[0].text.strip() == "The user wants 2 + 2."
    assert out.output_text.strip() == "Four."
    assert out.usage is not None and out.usage.output_tokens_details.reasoning_tokens > 0
    assert out.usage.output_tokens_details.reasoning_tokens < out.usage.output_tokens
    events = events_of(served, input="THINK")
    check_sequence(events)
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert thought == out.output[0].content[0].text and text == out.output_text
    (rdone,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert rdone.text == thought


def test_reasoning_in_the_input_reaches_the_template(served: Served) -> None:
    out = create(
        served,
        input=[
            {"role": "user", "content": "Hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Earlier thought."}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Sure."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Again"}]},
        ],
    )  # fmt: skip
    assert out.output_text == "History seen."


def test_text_format_json_schema_reaches_the_engine(served: Served) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    request_id = rid()
    out = create(
        served,
        request_id,
        input="JSON",
        text={"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}},
    )
    assert json.loads(out.output_text) == {"answer": 4}
    assert out.text is not None and out.text.format.type == "json_schema"
    sp = served.engine_request(request_id).sampling_params
    assert json.loads(sp.json_schema) == schema
    request_id = rid()
    create(served, request_id, input="JSON", text={"format": {"type": "json_object"}})
    assert json.loads(served.engine_request(request_id).sampling_params.json_schema) == {
        "type": "object"
    }


def test_max_output_tokens_is_incomplete(served: Served) -> None:
    out = create(served, input="LONG", max_output_tokens=5)
    assert out.status == "incomplete"
    assert out.incomplete_details is not None
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage is not None and out.usage.output_tokens == 5
    events = events_of(served, input="LONG", max_output_tokens=5)
    check_sequence(events)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == out.output_text


# ---------------------------------------------------------------------- the store


def _on_other_worker(s: Served, worker: str, **kw: Any) -> tuple[Any, str]:
    """A request on a fresh connection each time until one lands on another worker."""
    for _ in range(60):
        request_id = rid()
        with openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0) as client:
            out = client.responses.create(
                model="resp-model", extra_headers={"x-request-id": request_id}, **kw
            )
        if s.worker_of(request_id) != worker:
            return out, request_id
    raise AssertionError("60 connections all landed on one worker")


def test_previous_response_id_continues_on_the_other_worker(served: Served) -> None:
    request_id = rid()
    first = create(served, request_id, input="My name is Ada.")
    assert first.output_text == "Hello Ada."
    second, second_id = _on_other_worker(
        served, served.worker_of(request_id), input="NAME?", previous_response_id=first.id
    )
    assert served.worker_of(second_id) != served.worker_of(request_id)
    assert second.output_text == "Your name is Ada."
    assert second.previous_response_id == first.id
    # Streamed, the same; the stored response answers GET on either worker.
    events = events_of(served, input="NAME?", previous_response_id=first.id)
    assert events[-1].response.output_text == "Your name is Ada."
    got = served.client.responses.retrieve(events[-1].response.id)
    assert got.output_text == "Your name is Ada." and got.id == events[-1].response.id


def test_get_and_delete(served: Served) -> None:
    out = create(served, input="PLAIN")
    got = served.client.responses.retrieve(out.id)
    assert got.id == out.id and got.output_text == out.output_text and got.usage == out.usage
    response = httpx.delete(f"{served.url}/v1/responses/{out.id}", timeout=DEADLINE)
    assert response.status_code == 200
    assert response.json() == {"id": out.id, "object": "response.deleted", "deleted": True}
    for call in (lambda: served.client.responses.retrieve(out.id),
                 lambda: served.client.responses.delete(out.id),
                 lambda: create(served, input="x", previous_response_id=out.id)):  # fmt: skip
        with pytest.raises(openai.NotFoundError) as err:
            call()
        body = err.value.body
        assert isinstance(body, dict) and out.id in body["message"], body
        assert body["type"] == "invalid_request_error"


def test_store_false_is_not_kept(served: Served) -> None:
    out = create(served, input="PLAIN", store=False)
    assert out.store is False and out.output_text == "Just text."
    with pytest.raises(openai.NotFoundError):
        served.client.responses.retrieve(out.id)


def test_the_store_is_bounded_by_count_and_bytes() -> None:
    memory = Memory(items=3, size=100)
    for key in "abc":
        assert memory.put("o", key, b"x" * 10)
    assert memory.get("o", "a") == b"x" * 10  # a is now the most recently used
    memory.put("o", "d", b"x" * 10)
    assert memory.get("o", "b") is None and len(memory) == 3  # b was the least recently used
    memory.put("o", "e", b"y" * 80)  # 30 + 80 > 100: the oldest go until it fits
    assert memory.bytes <= 100 and memory.get("o", "e") is not None
    assert memory.get("o", "c") is None
    assert not memory.put("o", "huge", b"z" * 101) and memory.get("o", "huge") is None
    assert memory.delete("o", "e") and not memory.delete("o", "e")


def test_the_store_process_serves_workers_and_leaves_nothing() -> None:
    store = StoreProcess.start(items=2, size=1000)
    assert store.address.startswith("\0")  # an abstract socket: no file to leave behind

    async def run() -> None:
        a, b = StoreClient(store.address), StoreClient(store.address)
        for key in ("k1", "k2", "k3"):
            assert await a.put("o", key, key.encode())
        assert await b.get("o", "k1") is None  # evicted by count, seen by the other client
        assert await b.get("o", "k3") == b"k3"
        assert await b.get("other", "k3") is None  # another owner's: not found
        assert not await b.delete("other", "k3") and await b.get("o", "k3") == b"k3"
        assert await b.delete("o", "k3") and await a.get("o", "k3") is None
        assert not await a.put("o", "big", b"x" * 1001)
        await a.close()
        await b.close()
        store.stop()
        down = StoreClient(store.address, timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await down.get("o", "k2")
        assert time.monotonic() - t0 < 1.5

    asyncio.run(run())
    assert store.proc.poll() is not None


def test_the_servers_store_keeps_what_its_flags_say(model_dir: Path) -> None:
    s = _start(model_dir, 1, "--responses-store-items", "2")
    try:
        first, second, third = (create(s, input="PLAIN") for _ in range(3))
        with pytest.raises(openai.NotFoundError):
            s.client.responses.retrieve(first.id)  # the least recently used of three
        assert s.client.responses.retrieve(second.id).id == second.id
        assert s.client.responses.retrieve(third.id).id == third.id
    finally:
        s.close()
    small = _start(model_dir, 1, "--responses-store-bytes", "300")
    try:
        # A response and its conversation: more than 300 bytes of JSON, so none is kept.
        out = create(small, input="PLAIN")
        with pytest.raises(openai.NotFoundError):
            small.client.responses.retrieve(out.id)
    finally:
        small.close()


# ---------------------------------------------------------------------- refusals, disconnects


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "built-in tool"),
        ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools",
         "'file_search'"),
        ({"input": "x", "tools": [{"type": "computer_use_preview"}]}, "tools", "built-in"),
        ({"input": "x", "tools": [{"type": "code_interpreter"}]}, "tools", "built-in"),
        ({"input": "x", "tools": [{"type": "mcp", "server_label": "a"}]}, "tools", "built-in"),
        ({"input": "x", "background": True}, "background", "background mode"),
        ({"input": "x", "include": ["file_search_call.results"]}, "include", "include"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
         "input", "only text parts"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input", "only text parts"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "item_reference"),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice", "not supported"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice", "nope"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}},
         "text.format", "schema"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({"input": "x", "max_output_tokens": 10**9}, "max_output_tokens", "max_output_tokens"),
        ({"input": "x", "temperature": -1}, "temperature", "temperature"),
        ({"input": ""}, "input", "must not be empty"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id", "resp_nope"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(
    served: Served, body: dict[str, Any], param: str, words: str
) -> None:
    response = httpx.post(f"{served.url}/v1/responses", json=body, timeout=DEADLINE)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert set(error) >= {"message", "type", "param", "code"}


def test_a_disconnect_aborts_the_engine_request(served: Served) -> None:
    before = served.aborts()
    with httpx.stream(
        "POST",
        f"{served.url}/v1/responses",
        json={"input": "ENDLESS", "stream": True},
        timeout=DEADLINE,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert any("response.output_text.delta" in line for line in lines)
    deadline = time.monotonic() + DEADLINE
    while served.aborts() <= before:
        assert time.monotonic() < deadline, "no ABORT reached the engine"
        time.sleep(0.01)


# ---------------------------------------------------------------------- an agent


def _agent(url: str, calls: list[str]) -> Any:
    return weather_agent(url, "resp-model", calls, responses=True)


def test_an_agent_in_responses_mode_calls_a_tool_and_answers(served: Served) -> None:
    calls: list[str] = []
    result = asyncio.run(agents.Runner.run(_agent(served.url, calls), "The weather in Paris?"))
    assert result.final_output == AGENT_ANSWER and calls == ["Paris"]

    async def streamed() -> Any:
        run = agents.Runner.run_streamed(_agent(served.url, calls), "The weather in Paris?")
        kinds = [event.type async for event in run.stream_events()]
        return run, kinds

    run, kinds = asyncio.run(streamed())
    assert run.final_output == AGENT_ANSWER and calls == ["Paris", "Paris"]
    assert "run_item_stream_event" in kinds


# ---------------------------------------------------------------------- last: the store stops


def _store_pid(s: Served) -> int:
    found = re.findall(r"responses store process (\d+)$", s.server.stderr(), re.M)
    assert found, s.server.stderr()
    return int(found[-1])


def test_a_stuck_store_is_a_503_and_store_false_still_works(served: Served) -> None:
    stored = create(served, input="PLAIN")
    pid = _store_pid(served)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(openai.InternalServerError) as err:
            create(served, input="PLAIN")
        # The store client's timeout (2 s), not the worker's loop, bounds it.
        assert err.value.status_code == 503 and "store" in str(err.value)
        assert time.monotonic() - t0 < 10
        with pytest.raises(openai.InternalServerError):
            served.client.responses.retrieve(stored.id)
        assert create(served, input="PLAIN", store=False).output_text == "Just text."
        assert served.client.models.list().data  # the worker's loop runs on meanwhile
    finally:
        os.kill(pid, signal.SIGCONT)
    assert served.client.responses.retrieve(stored.id).id == stored.id


def test_a_dead_store_is_replaced_empty(served: Served) -> None:
    stored = create(served, input="PLAIN")
    pid = _store_pid(served)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE
    while True:  # until the master noticed and started a new one (every 0.5 s)
        assert time.monotonic() < deadline, "no new store process"
        try:
            fresh = create(served, input="PLAIN")
            break
        except openai.InternalServerError as exc:
            assert exc.status_code == 503
        time.sleep(0.05)
    assert _store_pid(served) != pid
    assert served.client.responses.retrieve(fresh.id).id == fresh.id
    with pytest.raises(openai.NotFoundError):  # what the old one held is gone
        served.client.responses.retrieve(stored.id)
