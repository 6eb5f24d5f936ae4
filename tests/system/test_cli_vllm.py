"""vLLM's (and SGLang's) command line and routes where tsfront means the same (issue 40.4).

``tsfront serve MODEL`` (positional), ``--model-path``, ``--enable-auto-tool-choice`` (with
``--tool-call-parser``), and ``GET /v1/models/{id}`` as the official ``openai`` client's
``models.retrieve`` asks it. Real servers against in-process simulated ranks; waits have
deadlines. About 15 s.
"""

from __future__ import annotations

import os
import subprocess

import openai
import pytest

from tsfront.process.child import python_module
from tsfront.sim import SimGroup
from tsfront.testing.serve import ServeProcess

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
