"""vLLM's (and SGLang's) command line and routes where tsfront means the same (issue 40.4).

``tsfront serve MODEL`` (positional), ``--model-path``, ``--enable-auto-tool-choice`` (with
``--tool-call-parser``), ``GET /v1/models/{id}`` as the official ``openai`` client's
``models.retrieve`` asks it, and ``--max-model-len`` (the smaller of it and the engines'
context applies). Real servers against in-process simulated ranks; waits have
deadlines. About 15 s.
"""

from __future__ import annotations

import os
import subprocess

import httpx
import openai
import pytest

from tsfront.process.child import python_module
from tsfront.sim import SimGroup
from tsfront.testing.serve import ServeProcess, start_served

DEADLINE = 30.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


def refused(*args: str) -> str:
    done = subprocess.run(
        python_module("tsfront", "serve", "--handshake", "tcp://127.0.0.1:0", *args),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={k: v for k, v in os.environ.items() if k != "TSFRONT_LOG"},
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.endswith("(see 'tsfront serve --help')"), line
    return line


@pytest.mark.parametrize("how", ["positional", "--model-path"])
def test_serve_takes_the_model_as_vllm_and_sglang_do_and_models_retrieve_works(
    model_dir: str, how: str
) -> None:
    args = [model_dir] if how == "positional" else ["--model-path", model_dir]

    server = ServeProcess(
        [*args, "--handshake", "tcp://127.0.0.1:0", "--port", "0",
         "--served-model-name", "m", "--tool-call-parser", "hermes",
         "--enable-auto-tool-choice"],
    )  # fmt: skip
    group = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        group = SimGroup(handshake, 1).start()
        url = server.wait_line(r"^listening: (http://\S+)", DEADLINE).group(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        card = client.models.retrieve("m")
        assert card.id == "m" and card.object == "model"
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve("another")
        error = caught.value.body
        assert isinstance(error, dict) and error["code"] == "model_not_found", error
        assert error["param"] == "model" and "'m'" in error["message"]
    finally:
        server.stop()
        if group is not None:
            group.stop()


def test_the_model_is_required_in_one_of_its_spellings(model_dir: str) -> None:
    assert "give the model folder" in refused()
    assert "two models" in refused(model_dir, "--model", model_dir + "-other")


def test_enable_auto_tool_choice_needs_a_tool_call_parser(model_dir: str) -> None:
    line = refused(model_dir, "--enable-auto-tool-choice")
    assert "--tool-call-parser" in line


@pytest.mark.parametrize(
    ("flag", "engines", "limit", "named"),
    [
        (16, 4096, 16, "--max-model-len"),  # the flag is the smaller: it applies
        (100_000, 64, 64, "the engines' max_model_len"),  # the engines' is: theirs applies
    ],
)
def test_max_model_len_is_the_smaller_of_the_flag_and_the_engines_context(
    model_dir: str, flag: int, engines: int, limit: int, named: str
) -> None:
    served = start_served(
        model_dir,
        ranks=1,
        args=["--served-model-name", "m", "--max-model-len", str(flag)],
        timeout=DEADLINE,
        max_model_len=engines,
    )
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
        card = client.models.retrieve("m")
        assert card.model_extra is not None and card.model_extra["max_model_len"] == limit
        # A prompt that fills the context but its 2 reserved positions and 1 new token: served.
        fits = " ".join(["w5"] * (limit - 3))
        done = client.completions.create(model="m", prompt=fits, max_tokens=1)
        assert done.usage is not None and done.usage.prompt_tokens == limit - 3
        # One token more is refused, naming the limit and where it comes from.
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="m", prompt=fits + " w5", max_tokens=2)
        body = caught.value.body
        assert isinstance(body, dict) and body["param"] == "max_tokens", body
        assert f"context is {limit} tokens ({named}" in body["message"], body
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": fits + " w5" * 8}]
            )
        body = caught.value.body
        assert isinstance(body, dict) and body["param"] == "messages", body
        assert f"context is {limit} tokens ({named}" in body["message"], body
        tokenized = httpx.post(f"{served.url}/tokenize", json={"prompt": "w5"}, timeout=5).json()
        assert tokenized["max_model_len"] == limit
    finally:
        served.close()


def test_max_model_len_below_three_is_refused(model_dir: str) -> None:
    line = refused(model_dir, "--max-model-len", "2")
    assert "--max-model-len=2: must be at least 3" in line
