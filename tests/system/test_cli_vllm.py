"""vLLM's (and SGLang's) command line and routes where tsfront means the same (issue 40.4).

``tsfront serve MODEL`` (positional), ``--model-path``, ``--enable-auto-tool-choice`` (with
``--tool-call-parser``), ``GET /v1/models/{id}`` as the official ``openai`` client's
``models.retrieve`` asks it, ``--max-model-len`` (the smaller of it and the engines'
context applies) and ``--tokenizer`` (the tokenizer and chat template of another folder).
Real servers against in-process simulated ranks; waits have deadlines. About 30 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tsfront.process.child import python_module
from tsfront.sim import SimGroup
from tsfront.testing.serve import ServeProcess, start_served
from tsfront.text import TextModel

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


def test_tokenizer_and_its_chat_template_come_from_another_folder(
    model_dir: str, tmp_path: Path
) -> None:
    # The model's folder holds only its configs (its context: 512 positions); the tokenizer's
    # folder its tokenizer and a chat template of its own, which the chat route must render.
    model = tmp_path / "model-only"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    tokenizer = tmp_path / "tokenizer-only"
    shutil.copytree(model_dir, tokenizer)
    (tokenizer / "config.json").unlink()
    (tokenizer / "chat_template.jinja").write_text(
        "w7{% for m in messages %} {{ m['content'] }}{% endfor %}"
    )
    served = start_served(model, ranks=1, args=["--tokenizer", str(tokenizer)], timeout=DEADLINE)
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
        (card,) = client.models.list().data
        assert card.id == "model-only"  # the model's name, not the tokenizer's
        assert card.model_extra is not None and card.model_extra["max_model_len"] == 512
        rendered = httpx.post(
            f"{served.url}/tokenize",
            json={"messages": [{"role": "user", "content": "w9 w11"}]},
            timeout=5,
        ).json()
        assert rendered["tokens"] == [7, 9, 11]  # the tokenizer folder's template
        done = client.chat.completions.create(
            model="model-only", messages=[{"role": "user", "content": "w9"}], max_tokens=3
        )
        assert done.usage is not None and done.usage.prompt_tokens == 2
        assert done.choices[0].message.content  # the tokenizer decodes the engine's tokens
    finally:
        served.close()
    # Without --tokenizer the model's folder has none: one line, exit 1.
    done = subprocess.run(
        python_module("tsfront", "serve", str(model), "--handshake", "tcp://127.0.0.1:0"),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "model-only has no tokenizer.json" in line, line


def hf_cache(root: Path, repo: str, files: Path) -> None:
    """Put ``files`` (a folder) into a Hugging Face cache at ``root`` as ``repo``'s main
    revision, laid out as ``huggingface_hub`` lays it out: the contents under ``blobs/``,
    ``snapshots/<commit>/NAME`` links to them, ``refs/main`` naming the commit."""
    base = root / ("models--" + repo.replace("/", "--"))
    commit = secrets.token_hex(20)
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (base / "blobs").mkdir()
    for f in files.iterdir():
        data = f.read_bytes()
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)


@pytest.mark.parametrize("how", ["positional id", "--tokenizer id"])
def test_a_hugging_face_id_is_served_from_its_cache_offline(
    model_dir: str, tmp_path: Path, how: str
) -> None:
    cache = tmp_path / "hub"
    hf_cache(cache, "acme/tiny-words", Path(model_dir))
    tokenizer = tmp_path / "tok"
    shutil.copytree(model_dir, tokenizer)
    (tokenizer / "config.json").unlink()
    (tokenizer / "chat_template.jinja").write_text(
        "w7{% for m in messages %} {{ m.content }}{% endfor %}"
    )
    hf_cache(cache, "acme/tok", tokenizer)
    if how == "positional id":
        model, args, name, source = "acme/tiny-words", [], "acme/tiny-words", Path(model_dir)
    else:
        # A local folder with the model's configs only, its tokenizer an id.
        model = tmp_path / "local-model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
        args, name, source = ["--tokenizer", "acme/tok"], "local-model", tokenizer
    messages = [{"role": "user", "content": "w9"}]
    text = TextModel.load(source)
    template = text.encode(text.apply_chat_template(messages), add_special_tokens=False)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    served = start_served(model, ranks=1, args=args, env=env, timeout=DEADLINE)
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
        (card,) = client.models.list().data
        assert card.id == name  # a Hugging Face id serves as the id, as vLLM's
        done = client.completions.create(model=name, prompt="w5 w6", max_tokens=3)
        assert re.fullmatch(r"( w\d+)+", done.choices[0].text)  # decoded by its tokenizer
        rendered = httpx.post(
            f"{served.url}/tokenize", json={"messages": messages}, timeout=5
        ).json()
        assert rendered["tokens"] == template  # its chat template
        assert (template == [7, 9]) == (how == "--tokenizer id")
    finally:
        served.close()


def test_an_id_neither_a_folder_nor_in_the_cache_offline_is_one_line_saying_what_to_do(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    for args in (["acme/absent"], ["--model", "acme/absent"], ["--model-path", "acme/absent"]):
        done = subprocess.run(
            python_module("tsfront", "serve", *args, "--handshake", "tcp://127.0.0.1:0"),
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            env=env,
        )
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(
            "tsfront: error: --model acme/absent: acme/absent is neither a "
            f"folder nor in the Hugging Face cache ({tmp_path})"
        ), line
        assert "HF_HUB_OFFLINE=1 forbids downloading it" in line, line
        assert "hf download acme/absent" in line, line
        assert "handshake:" not in done.stdout  # nothing started
