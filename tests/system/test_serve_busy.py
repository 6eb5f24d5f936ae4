"""The OpenAI server at capacity: a request finding every slot of its worker in use gets 503.

In process: `ServeApp` over an `OpenAIService` over a real `EngineClient` attached to an I/O
process with two slots per worker, its rank a `RawEngine` (nothing finishes until the test
pushes it), requests sent through httpx's ASGI transport. About 1 s.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support.core_fixtures import DEADLINE, collect, in_thread, request
from support.raw_engine import raw_rig

from tsfront.serve.core.reply import RETRY_AFTER_S
from tsfront.serve.edge.asgi import ServeApp
from tsfront.serve.openai.completions import OpenAIService
from tsfront.text import TextModel

SLOTS = 2


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> TextModel:
    from tsfront.text.testing import make_test_model

    return TextModel.load(make_test_model(tmp_path_factory.mktemp("model") / "words", "wordlevel"))


def _assert_busy(response: httpx.Response) -> None:
    assert response.status_code == 503
    assert response.headers["retry-after"] == str(RETRY_AFTER_S)
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "service_unavailable_error"
    assert error["param"] is None and error["code"] is None
    # It says what happened and what to do.
    assert f"all {SLOTS} slots of this worker are in use" in error["message"]
    assert "wait for streams to finish" in error["message"]


async def test_a_request_with_every_slot_in_use_gets_503_and_the_held_streams_finish(text):
    async with raw_rig(1, slots_per_worker=SLOTS) as (_io, (engine,), client, _ctx):
        app = ServeApp(OpenAIService(client, text, "words"))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with http:
            held = [await client.generate(request(f"held-{i}", 3, pin=0)) for i in range(SLOTS)]
            for i in range(SLOTS):
                assert (await in_thread(engine.recv_add)).rid == f"held-{i}"
            body = {"model": "words", "prompt": "w5 w6", "max_tokens": 3}
            _assert_busy(await http.post("/v1/completions", json=body))
            _assert_busy(await http.post("/v1/completions", json={**body, "stream": True}))
            chat = {"model": "words", "messages": [{"role": "user", "content": "w5"}]}
            _assert_busy(await http.post("/v1/chat/completions", json=chat))

            # One slot free, two choices: the first is sent, the second finds no slot; the
            # first is aborted on the engine and its slot comes back.
            done = held.pop()
            engine.push(engine.tokens_frame(done.rid, [7, 8, 9], 3, "length"))
            assert (await collect(done))[0] == [7, 8, 9]
            _assert_busy(await http.post("/v1/completions", json={**body, "n": 2}))
            sent = await in_thread(engine.recv_add)
            kind, rids = await in_thread(engine.recv_any, DEADLINE)
            assert (kind, rids) == ("abort", [sent.rid])

            # That slot is free again: the next request is served, beside the held stream.
            task = asyncio.create_task(http.post("/v1/completions", json=body))
            add = await in_thread(engine.recv_add)
            engine.push(engine.tokens_frame(add.rid, [100, 101, 102], 3, "length"))
            response = await asyncio.wait_for(task, DEADLINE)
            assert response.status_code == 200
            assert response.json()["choices"][0]["text"] == " w100 w101 w102"

            # The stream held all along was never disturbed: it finishes with every token.
            (stream,) = held
            engine.push(engine.tokens_frame(stream.rid, [1, 2], 2))
            engine.push(engine.tokens_frame(stream.rid, [3], 3, "length"))
            tokens, chunks = await collect(stream)
            assert tokens == [1, 2, 3] and chunks[-1].finish_reason == "length"
