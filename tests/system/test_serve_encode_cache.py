"""``tsfront serve``'s shared encode cache gives the exact ids of a whole encode, end to end.

Two workers share one store (`--encode-cache-mb`); a conversation grows turn by turn over new
connections (each may land on either worker) and forks; every prompt's ids from ``/tokenize``
(rendered and encoded as a chat request is) equal one whole encode of the same rendered text,
with the store and without it (``--encode-cache-mb 0``). A bad size is a usage error. ~15 s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.text_fixtures import mixed_text, model_dir

from tsfront.testing.serve import start_served
from tsfront.text import TextModel

DEADLINE = 60.0


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("encode-cache-serve"), "metaspace")


def conversation(turns: int, fork: int) -> list[list[dict]]:
    system = {"role": "system", "content": mixed_text(1, 900)}  # well over 2,048 characters
    prompts, messages = [], [system]
    for t in range(turns):
        messages = [*messages, {"role": "user", "content": mixed_text(100 * fork + t, 40)}]
        prompts.append(messages)
        messages = [*messages, {"role": "assistant", "content": mixed_text(50 + t, 12)}]
    return prompts


@pytest.mark.parametrize("size", ["16", "0"])
def test_chat_prompt_ids_through_the_shared_cache_equal_a_whole_encode(
    model: Path, size: str
) -> None:
    text = TextModel.load(model)
    served = start_served(model, workers=2, args=["--encode-cache-mb", size], timeout=DEADLINE)
    try:
        for fork in range(3):  # three conversations sharing the system prompt
            for messages in conversation(6, fork):
                with httpx.Client(timeout=10) as client:  # a new connection each time
                    got = client.post(f"{served.url}/tokenize", json={"messages": messages})
                assert got.status_code == 200, got.text
                rendered = text.apply_chat_template(messages)
                want = text.encode(rendered, add_special_tokens=False)
                assert got.json()["tokens"] == want
    finally:
        served.close()


def test_a_negative_cache_size_is_a_usage_error(model: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tsfront", "serve", "--model", str(model), "--handshake",
         "tcp://127.0.0.1:0", "--encode-cache-mb", "-1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--encode-cache-mb=-1" in done.stderr
