"""tsfront's ASGI app hosted by a plain uvicorn (``uvicorn --factory
tsfront.serve.edge.asgi:app_from_env``, attached to ``tsfront io``), as docs/SERVE.md's
"Embedding it" says any ASGI server can host it, against two simulated ranks.

Under ``tsfront serve`` the HTTP protocol tells the app of a lost connection itself
(`tsfront.serve.edge.protocol`); under any other server the app watches ``receive()`` for
``http.disconnect`` (`tsfront.serve.edge.asgi._DisconnectWatch`). These tests are that watch's, by
a client that leaves mid-stream, one that leaves before the first token and 64 that leave at
once: each must abort its engine request. About 8 s.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from support.core_fixtures import free_port
from support.embed_fixtures import (
    DEADLINE,
    io_and_ranks,
    spawn,
    stop,
    uvicorn_command,
    wait_healthy,
)
from support.serve_fixtures import Front

FIRST = 100


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    from tsfront.text.testing import make_test_model

    model = str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))
    with io_and_ranks(token_fn) as (address, group):
        port = free_port()
        server = spawn(
            uvicorn_command(
                port, "--factory", "tsfront.serve.edge.asgi:app_from_env", "--http", "httptools"
            ),
            {"TSFRONT_ATTACH": address, "TSFRONT_MODEL": model},
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url)
            yield Front(url, group, first=FIRST, deadline=DEADLINE)
        finally:
            stop(server)


def test_a_stream_under_plain_uvicorn(hosted: Front) -> None:
    client = openai.OpenAI(base_url=f"{hosted.url}/v1", api_key="none", max_retries=0)
    events = client.completions.create(model="tiny-words", prompt="w5", max_tokens=6, stream=True)
    assert "".join(e.choices[0].text for e in events) == "".join(f" w{FIRST + p}" for p in range(6))


def test_a_client_leaving_mid_stream_aborts_the_engine_request(hosted: Front) -> None:
    hosted.leave_mid_stream()


def test_a_client_leaving_before_the_first_token_aborts_the_engine_request(hosted: Front) -> None:
    # Nothing is being sent that could fail: only the watch on receive() sees the client leave.
    hosted.leave_before_first_token()


def test_many_clients_leaving_at_once_abort_every_engine_request(hosted: Front) -> None:
    # 64 watches on receive() in one worker, their connections lost together.
    hosted.leave_together(64)
