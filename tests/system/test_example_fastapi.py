"""``examples/fastapi``: the FastAPI app under gunicorn (uvicorn workers) and under
``uvicorn --workers 2`` (attached to ``tsfront io``), against simulated ranks.

Each recipe runs as its own process group; the test waits (with deadlines) for the handshake
address it prints, starts two in-process `SimGroup` ranks, waits for ``/health``, then
streams a completion with the ``openai`` client, runs a chat and the app's own
``/v1/tokens`` route, and checks that every worker served (distinct pids in ``/health``).
SIGTERM must stop the group with nothing left. About 10 s for both.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from support.core_fixtures import free_port
from support.embed_fixtures import (
    DEADLINE,
    io_and_ranks,
    read_line,
    stop,
    uvicorn_command,
    wait_healthy,
)
from support.embed_fixtures import spawn as spawn_in

from tsfront.sim import SimGroup

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "examples" / "fastapi"
FIRST = 100


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


def spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return spawn_in(cmd, env, APP_DIR)


def exercise(url: str, workers: int) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    text = "".join(
        e.choices[0].text
        for e in client.completions.create(
            model="tiny-words", prompt="w5 w6", max_tokens=8, stream=True
        )
    )
    assert text == "".join(f" w{FIRST + p}" for p in range(8))
    chat = client.chat.completions.create(
        model="tiny-words", messages=[{"role": "user", "content": "w5"}], max_tokens=3
    )
    assert chat.choices[0].message.content.split() == ["w100", "w101", "w102"]
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="tiny-words", prompt="w5", top_p=9.0)
    tokens = httpx.post(f"{url}/v1/tokens", json={"text": "w5", "max_tokens": 4}, timeout=10)
    assert tokens.json()["token_ids"] == [100, 101, 102, 103]
    # Every worker attached and serves: new connections spread over them.
    pids = set()
    deadline = time.monotonic() + DEADLINE
    while len(pids) < workers and time.monotonic() < deadline:
        with httpx.Client() as fresh:
            pids.add(fresh.get(f"{url}/health", timeout=5).json()["worker"])
    assert len(pids) == workers


def test_gunicorn_with_uvicorn_workers(model_dir: str) -> None:
    port = free_port()
    proc = spawn(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "-w",
            "2",
            "-b",
            f"127.0.0.1:{port}",
            "app:app",
        ],
        {
            "TSFRONT_HANDSHAKE": "tcp://127.0.0.1:0",
            "TSFRONT_NUM_ENGINES": "2",
            "TSFRONT_MODEL": model_dir,
            "TSFRONT_HANDSHAKE_TIMEOUT": "60",
        },
    )
    group = None
    try:
        handshake = read_line(proc, "handshake: ", DEADLINE)
        group = SimGroup(handshake, 2, token_fn=token_fn).start()
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        exercise(url, workers=2)
    finally:
        stop(proc)
        if group is not None:
            group.stop()


def test_uvicorn_workers_attached_to_tsfront_io(model_dir: str) -> None:
    with io_and_ranks(token_fn) as (address, _group):
        port = free_port()
        server = spawn(
            uvicorn_command(port, "app:app", "--workers", "2"),
            {"TSFRONT_ATTACH": address, "TSFRONT_MODEL": model_dir},
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url)
            exercise(url, workers=2)
        finally:
            stop(server)
