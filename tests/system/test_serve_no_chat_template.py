"""A model folder without a chat template: ``tsfront serve`` says so at start, and a chat
request's 400 says what to do, ``--chat-template`` first (issue 40).

A real server against an in-process simulated rank; the official ``openai`` client. About
6 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tsfront.testing.serve import start_served

DEADLINE = 30.0


@pytest.fixture(scope="module")
def bare_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The word-level test model with its chat template taken out."""
    from tsfront.text.testing import make_test_model

    folder = make_test_model(tmp_path_factory.mktemp("model") / "no-template", "wordlevel")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_model_without_a_chat_template_is_named_at_start_and_in_the_chat_error(
    bare_model: Path, tmp_path: Path
) -> None:
    served = start_served(bare_model, ranks=1, stderr=tmp_path / "err", timeout=DEADLINE)
    try:
        warning = [line for line in served.server.stderr().splitlines() if "warning" in line]
        assert warning == [
            f"tsfront serve: warning: {bare_model} has no chat template (no chat_template in "
            "tokenizer_config.json, no chat_template.jinja or .json): chat requests "
            "(/v1/chat/completions, /v1/responses) will be refused; give one with "
            "--chat-template FILE"
        ], served.server.stderr()
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="no-template", messages=[{"role": "user", "content": "w5"}]
            )
        error = caught.value.body
        assert isinstance(error, dict) and error["param"] == "messages", error
        assert "has no chat template" in error["message"], error
        assert "start it with --chat-template FILE" in error["message"], error
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="no-template", input="w5")
        assert "--chat-template" in str(caught.value)
        # Completions need no template.
        done = client.completions.create(model="no-template", prompt="w5", max_tokens=2)
        assert done.choices[0].text
    finally:
        served.close()


def test_no_warning_when_the_server_is_given_a_template(bare_model: Path, tmp_path: Path) -> None:
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    served = start_served(
        bare_model,
        ranks=1,
        args=["--chat-template", template],
        stderr=tmp_path / "err",
        timeout=DEADLINE,
    )
    try:
        assert "warning" not in served.server.stderr()
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
        done = client.chat.completions.create(
            model="no-template", messages=[{"role": "user", "content": "w5"}], max_tokens=2
        )
        assert done.usage is not None and done.usage.prompt_tokens == 1
    finally:
        served.close()
