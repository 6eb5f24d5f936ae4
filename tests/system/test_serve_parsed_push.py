"""A parsed choice's tokens go through its sink (`tsfront.serve.core.push.ParsedPusher`).

A streamed chat answer whose text is parsed (tools, reasoning: every answer of an agent) has
its tokens parsed and its events written in the worker's drain while its response's task
waits, as plain tokens are (issue 39). An embedded `ServeApp` over an `OpenAIService` with the
Hermes tool parser, its rank a `RawEngine` answered one frame at a time, each frame sent only
once the previous frame's event left the app (its ASGI ``send``, wrapped): the task is parked
then, so each later frame meets the sink. What the client reads is the same stream as without
the sink (``TSFRONT_SERVE_PUSH=0`` in tests/system/test_serve_tools.py covers that path), a client
that stops reading holds the sink (one send in flight at a time, nothing lost), and
a parser that raises on a frame the sink took ends the stream with the parse step's error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from support.core_fixtures import DEADLINE, in_thread
from support.raw_engine import RawEngine, raw_rig

from tsfront.serve.core.chatsettings import ChatSettings
from tsfront.serve.core.push import ParsedPusher
from tsfront.serve.edge.asgi import ServeApp
from tsfront.serve.openai.completions import OpenAIService
from tsfront.text import TextModel
from tsfront.text.tools.hermes import HermesParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
ANSWER = (
    'Sure. <tool_call>\n{"name": "read_file", "arguments": {"path": "src/a b.py"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> TextModel:
    from tsfront.text.testing import make_test_model

    folder = make_test_model(
        tmp_path_factory.mktemp("model") / "bytes", added_tokens=["<tool_call>", "</tool_call>"]
    )
    return TextModel.load(folder)


class Rig:
    """The app's client, its rank, and an event set each time the app sends a body part."""

    def __init__(
        self, http: httpx.AsyncClient, engine: RawEngine, sent: asyncio.Queue, client: Any
    ) -> None:
        self.http = http
        self.client = client  # the app's EngineClient (its I/O process's counters)
        self.engine = engine
        self.sent = sent
        #: While cleared, every body part the app sends waits for it (a client that does not
        #: read: the server's ``send`` suspends on back-pressure).
        self.readable = asyncio.Event()
        self.readable.set()
        #: Body parts being sent now, and the most ever at once (one: a send waits for the
        #: one before it to finish, or events would go out of order).
        self.sending = self.most_sending = 0


@pytest.fixture
async def rig(text: TextModel) -> AsyncIterator[Rig]:
    sent: asyncio.Queue[bytes] = asyncio.Queue()
    made: list[Rig] = []
    async with raw_rig(1) as (_io, (engine,), client, _ctx):
        app = ServeApp(OpenAIService(client, text, "m", chat=ChatSettings(tool_parser="hermes")))

        async def watched(scope: dict, receive: Any, send: Any) -> None:
            async def send_watched(message: dict) -> None:
                r = made[0]
                r.sending += 1
                r.most_sending = max(r.most_sending, r.sending)
                try:
                    if message["type"] == "http.response.body":
                        await r.readable.wait()
                    await send(message)
                finally:
                    r.sending -= 1
                if message["type"] == "http.response.body":
                    sent.put_nowait(message.get("body", b""))

            await app(scope, receive, send_watched)

        transport = httpx.ASGITransport(app=watched)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = Rig(http, engine, sent, client)
            made.append(r)
            yield r


class SinkCalls(list):
    """The tokens each `ParsedPusher` call was offered; `until` waits for a count of them."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def add(self, tokens: list[int]) -> None:
        self.append(list(tokens))
        self.changed.set()

    async def until(self, count: int) -> None:
        while sum(map(len, self)) < count:
            self.changed.clear()
            await self.changed.wait()


@pytest.fixture
def sink_calls(monkeypatch: pytest.MonkeyPatch) -> SinkCalls:
    calls = SinkCalls()
    original = ParsedPusher.__call__

    def spy(self: ParsedPusher, tokens: list[int]) -> bool:
        calls.add(tokens)
        return original(self, tokens)

    monkeypatch.setattr(ParsedPusher, "__call__", spy)
    return calls


async def first_content_sent(rig: Rig) -> None:
    """Until the app sent an event with content (the first frame's, after the opening event):
    its response's task then waits for the next frame, parked, so the sink takes it."""
    while True:
        body = await asyncio.wait_for(rig.sent.get(), DEADLINE)
        if b'"content":"' in body and b'"content":""' not in body:
            return


def chat() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": True}


async def stream_tokens(rig: Rig, ids: list[int], taken: SinkCalls) -> str:
    """Answer the request one token a frame: the first, then (once the app sent its content,
    the response's task parked) all but the last, and the last (with the finish) once the
    sink took those (else the ring could join them to the last, which is the task's)."""
    task = asyncio.create_task(rig.http.post("/v1/chat/completions", json=chat()))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[:1], 1))
    await first_content_sent(rig)
    for n in range(2, len(ids)):
        rig.engine.push(rig.engine.tokens_frame(add.rid, [ids[n - 1]], n))
    await asyncio.wait_for(taken.until(len(ids) - 2), DEADLINE)
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[-1:], len(ids), "stop"))
    response = await asyncio.wait_for(task, DEADLINE)
    assert response.status_code == 200, response.text
    return response.text


def answer_of(body: str) -> tuple[str, str | None, str, str | None]:
    """The streamed events' content, call name, call arguments and finish reason."""
    got = events(body)
    assert got[-1] == "[DONE]"
    content, name, arguments, finish = "", None, "", None
    for event in got[:-1]:
        choice = event["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or ():
            name = call["function"].get("name") or name
            arguments += call["function"].get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return content, name, arguments, finish


def events(body: str) -> list[Any]:
    out = []
    for block in body.split("\n\n"):
        if block:
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_a_streamed_tool_call_is_parsed_in_the_sink_and_reads_as_without_it(
    rig: Rig, text: TextModel, sink_calls: SinkCalls
) -> None:
    ids = text.encode(ANSWER, add_special_tokens=False)
    body = await stream_tokens(rig, ids, sink_calls)
    content, name, arguments, finish = answer_of(body)  # it checks the [DONE]
    assert content == "Sure. "
    assert name == "read_file"
    assert json.loads(arguments) == {"path": "src/a b.py"}
    assert finish == "tool_calls"
    # Every token but the first and the last (the task's) went through the sink, in order.
    assert [t for call in sink_calls for t in call] == ids[1:-1]


async def test_a_parser_that_raises_on_a_token_the_sink_took_ends_the_stream_with_an_error(
    rig: Rig, text: TextModel, sink_calls: SinkCalls, monkeypatch: pytest.MonkeyPatch
) -> None:
    feeds = []
    original = HermesParser.feed

    def second_raises(self: HermesParser, delta: str) -> Any:
        feeds.append(delta)
        if len(feeds) == 2:
            raise RuntimeError("a parser bug")
        return original(self, delta)

    monkeypatch.setattr(HermesParser, "feed", second_raises)
    ids = text.encode("Hello there, friend.", add_special_tokens=False)
    task = asyncio.create_task(rig.http.post("/v1/chat/completions", json=chat()))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[:1], 1))
    await first_content_sent(rig)
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[1:2], 2))  # the sink's: it raises
    # The engine request is aborted at once, by the sink.
    assert await in_thread(rig.engine.recv_any, DEADLINE) == ("abort", [add.rid])
    response = await asyncio.wait_for(task, DEADLINE)
    assert response.status_code == 200
    got = events(response.text)
    assert got[-1] == "[DONE]"
    error = got[-2]["error"]
    assert (error["type"], error["code"]) == ("server_error", 502)
    assert "could not parse the model's output" in error["message"]
    assert sink_calls == [ids[1:2]]


async def test_a_client_that_stops_reading_holds_the_sink_and_loses_nothing(
    rig: Rig, text: TextModel, sink_calls: SinkCalls
) -> None:
    # The client stops reading after the first event: the sink's first send suspends (in
    # flight), every later frame is refused by the sink and waits for the response's task, and
    # the whole call arrives in order once the client reads again.
    ids = text.encode(ANSWER, add_special_tokens=False)
    task = asyncio.create_task(rig.http.post("/v1/chat/completions", json=chat()))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[:1], 1))
    await first_content_sent(rig)
    rig.readable.clear()
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[1:2], 2))
    await asyncio.wait_for(sink_calls.until(1), DEADLINE)  # its send is in flight, held
    frames = rig.client.metrics()["frames"]
    for n in range(3, len(ids)):
        rig.engine.push(rig.engine.tokens_frame(add.rid, [ids[n - 1]], n))
    rig.engine.push(rig.engine.tokens_frame(add.rid, ids[-1:], len(ids), "stop"))
    # Every frame reached the slot's ring while the client still does not read.
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while rig.client.metrics()["frames"] < frames + len(ids) - 2:
        assert asyncio.get_running_loop().time() < deadline, "the frames did not arrive"
        await asyncio.sleep(0.005)  # polling a counter in shared memory, with a deadline
    assert not task.done()  # nothing was sent past the held send
    rig.readable.set()
    response = await asyncio.wait_for(task, DEADLINE)
    assert response.status_code == 200, response.text
    content, name, arguments, finish = answer_of(response.text)
    assert content == "Sure. "
    assert name == "read_file"
    assert json.loads(arguments) == {"path": "src/a b.py"}
    assert finish == "tool_calls"
    assert rig.most_sending == 1
