"""``/v1/responses`` without ``tsfront serve``'s master, and the store process's life.

An embedded `ServeApp` over an `OpenAIService` (its rank a `RawEngine` the test answers by
hand, requests through httpx's ASGI transport) keeps its responses in a store of its own
process; and a store process started by a parent that is then SIGKILLed goes with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.core_fixtures import DEADLINE, in_thread
from support.raw_engine import raw_rig

from tsfront.serve.edge.asgi import ServeApp
from tsfront.serve.openai.completions import OpenAIService
from tsfront.serve.processes.store import StoreProcess
from tsfront.testing.serve import session_pids
from tsfront.text import TextModel


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> TextModel:
    from tsfront.text.testing import make_test_model

    return TextModel.load(make_test_model(tmp_path_factory.mktemp("model") / "words", "wordlevel"))


async def test_an_embedded_app_stores_responses_in_process(text: TextModel) -> None:
    async with raw_rig(1) as (_io, (engine,), client, _ctx):
        app = ServeApp(OpenAIService(client, text, "words"))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with http:
            task = asyncio.create_task(http.post("/v1/responses", json={"input": "w5"}))
            add = await in_thread(engine.recv_add)
            engine.push(engine.tokens_frame(add.rid, [100, 101], 2, "stop"))
            response = await asyncio.wait_for(task, DEADLINE)
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["output"][0]["content"][0]["text"] == " w100 w101"
            got = await http.get(f"/v1/responses/{body['id']}")
            assert got.status_code == 200 and got.json() == body
            gone = await http.delete(f"/v1/responses/{body['id']}")
            assert gone.json() == {"id": body["id"], "object": "response.deleted", "deleted": True}
            missing = await http.get(f"/v1/responses/{body['id']}")
            assert missing.status_code == 404
            assert missing.json()["error"]["param"] == "response_id"


PARENT = """
import sys
from tsfront.serve.processes.store import StoreProcess
store = StoreProcess.start(10, 1000)
print(store.pid, flush=True)
sys.stdin.read()
"""


def test_the_store_process_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert pid in session_pids(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(DEADLINE)
        deadline = time.monotonic() + DEADLINE
        while pid in session_pids(parent.pid):
            assert time.monotonic() < deadline, "the store outlived its parent"
            time.sleep(0.01)
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_store_process_imports_the_installed_tsfront_not_one_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python -m` puts the working directory first on sys.path: a server started from a
    # checkout of another version (or any directory with a `tsfront/` in it) would run that
    # code in its child processes. They are started with -P, as the I/O process is.
    decoy = tmp_path / "tsfront"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy tsfront was imported')\n")
    monkeypatch.chdir(tmp_path)
    store = StoreProcess.start(16, 1 << 16, timeout=DEADLINE)
    try:
        assert store.alive()
    finally:
        store.stop()
    assert store.proc.returncode is not None
