"""The parse step's one boundary (tsfront/serve/core/service.py, ``_unparseable``): a parser that
raises on a model's output ends the response cleanly, never with a 500 or a cut connection.

No output makes the parsers raise any more (tests/unit/test_text_tools_hostile.py holds them
to it), so the parser here is made to: ``HermesParser.feed`` (or the reasoning parser's) is
replaced by one that raises, as a bug in a parser would. An embedded `ServeApp` over an
`OpenAIService` whose rank is a `RawEngine` answered by hand (requests through httpx's ASGI
transport): a whole response is a 502 in OpenAI's error shape; a stream ends with an error
event and ``[DONE]`` (chat) or an ``error`` event (Responses), and its engine request is
aborted at once; so is the engine request of a whole response parsed as it comes (with a
reasoning parser) when the parser raises before the output's end.
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
from tsfront.serve.edge.asgi import ServeApp
from tsfront.serve.openai.completions import OpenAIService
from tsfront.text import TextModel
from tsfront.text.reasoning import ReasoningParser
from tsfront.text.tools.hermes import HermesParser

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> TextModel:
    from tsfront.text.testing import make_test_model

    return TextModel.load(make_test_model(tmp_path_factory.mktemp("model") / "words", "wordlevel"))


# Which parser raises on every delta, on a server with which parsers: the tool parser alone
# (a whole response is parsed once it has all come), after a reasoning parser (a whole
# response is parsed as it comes, to count the thought's tokens), or the reasoning parser.
BROKEN = {
    "tools": (HermesParser, ChatSettings(tool_parser="hermes")),
    "tools-after-reasoning": (HermesParser, ChatSettings("hermes", "qwen3")),
    "reasoning": (ReasoningParser, ChatSettings("hermes", "qwen3")),
}


@pytest.fixture(params=sorted(BROKEN))
def broken(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    def boom(self: Any, text: str) -> Any:
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(BROKEN[request.param][0], "feed", boom)
    return str(request.param)


class Rig:
    def __init__(self, http: httpx.AsyncClient, engine: RawEngine) -> None:
        self.http = http
        self.engine = engine


@pytest.fixture
async def rig(text: TextModel, broken: str) -> AsyncIterator[Rig]:
    async with raw_rig(1) as (_io, (engine,), client, _ctx):
        app = ServeApp(OpenAIService(client, text, "words", chat=BROKEN[broken][1]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield Rig(http, engine)


def chat(stream: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "w5"}], "tools": TOOLS, "stream": stream}


def responses(stream: bool) -> dict[str, Any]:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    return {"input": "w5", "tools": tools, "stream": stream}


def check_502(response: httpx.Response) -> None:
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["param"] is None
    assert "could not parse the model's output" in error["message"]


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/chat/completions", chat), ("/v1/responses", responses)]
)
async def test_a_parser_that_raises_on_a_whole_response_is_a_502(
    rig: Rig, broken: str, path: str, body: Any
) -> None:
    task = asyncio.create_task(rig.http.post(path, json=body(False)))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, [100, 101], 2, "stop"))
    check_502(await asyncio.wait_for(task, DEADLINE))


@pytest.mark.parametrize("broken", ["tools-after-reasoning", "reasoning"], indirect=True)
async def test_a_parser_that_raises_before_a_whole_response_ends_aborts_its_engine_request(
    rig: Rig, broken: str
) -> None:
    # With a reasoning parser a whole response is parsed as it comes (to count the thought's
    # tokens): the boundary is met mid-output, and the engine stops at once.
    task = asyncio.create_task(rig.http.post("/v1/chat/completions", json=chat(False)))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, [100, 101], 2))  # not the last
    assert await in_thread(rig.engine.recv_any, DEADLINE) == ("abort", [add.rid])
    check_502(await asyncio.wait_for(task, DEADLINE))


async def test_a_parser_that_raises_mid_chat_stream_ends_it_with_an_error_and_done(
    rig: Rig, broken: str
) -> None:
    task = asyncio.create_task(rig.http.post("/v1/chat/completions", json=chat(True)))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, [100, 101], 2))  # not the last
    # The engine request is aborted at once (the stream has not finished).
    assert await in_thread(rig.engine.recv_any, DEADLINE) == ("abort", [add.rid])
    response = await asyncio.wait_for(task, DEADLINE)
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["type"], error["code"]) == ("server_error", 502)
    assert "could not parse the model's output" in error["message"]


async def test_a_parser_that_raises_mid_responses_stream_ends_it_with_an_error_event(
    rig: Rig, broken: str
) -> None:
    task = asyncio.create_task(rig.http.post("/v1/responses", json=responses(True)))
    add = await in_thread(rig.engine.recv_add)
    rig.engine.push(rig.engine.tokens_frame(add.rid, [100, 101], 2))
    assert await in_thread(rig.engine.recv_any, DEADLINE) == ("abort", [add.rid])
    response = await asyncio.wait_for(task, DEADLINE)
    assert response.status_code == 200
    events = [block.split("\n") for block in response.text.split("\n\n") if block]
    kinds = [lines[0].removeprefix("event: ") for lines in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "error"
    last = json.loads(events[-1][1].removeprefix("data: "))
    assert last["code"] == "server_error" and "could not parse" in last["message"]
    assert [json.loads(e[1].removeprefix("data: "))["sequence_number"] for e in events] == list(
        range(len(events))
    )
