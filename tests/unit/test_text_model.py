"""Loading a model folder: eos and stop ids, context length, chat templates, typed errors.

Model folders are written by ``tsfront.text.testing.make_test_model`` and then edited per test.
About 2 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.text_fixtures import model_dir

from tsfront.text import ChatTemplateError, TextError, TextModel, TokenizerNotFound
from tsfront.text.testing import CHATML_TEMPLATE


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("text-model")


def folder(base: Path, tmp_path: Path, kind: str = "bytelevel", **edits: dict | None) -> Path:
    """A copy of a test model folder with some of its JSON files replaced (None: removed)."""
    src = model_dir(base, kind)
    dst = tmp_path / "my-model"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    for name, data in edits.items():
        path = dst / f"{name}.json"
        if data is None:
            path.unlink()
        else:
            path.write_text(json.dumps(data))
    return dst


def tid(model: TextModel, token: str) -> int:
    i = model.tokenizer.token_to_id(token)
    assert i is not None
    return i


def test_eos_from_generation_config_list_and_stop_adds_the_tokenizer_eos(
    base: Path, tmp_path: Path
) -> None:
    model = TextModel.load(folder(base, tmp_path))
    end, eot = tid(model, "<|end_of_text|>"), tid(model, "<|eot_id|>")
    assert model.name == "my-model"
    assert model.eos_token_ids == (end, eot)
    assert model.stop_token_ids == (end, eot)
    assert model.bos_token == "<|begin_of_text|>"
    assert model.eos_token == "<|eot_id|>"
    assert model.max_model_len == 4096


def test_eos_from_generation_config_int(base: Path, tmp_path: Path) -> None:
    probe = TextModel.load(model_dir(base, "bytelevel"))
    end, eot = tid(probe, "<|end_of_text|>"), tid(probe, "<|eot_id|>")
    model = TextModel.load(
        folder(base, tmp_path, generation_config={"eos_token_id": end, "stop_token_ids": [7]})
    )
    assert model.eos_token_ids == (end,)
    # config.json's eos (end) and tokenizer_config's "<|eot_id|>" are stop tokens too.
    assert model.stop_token_ids == (end, eot, 7)


def test_eos_from_config_json_when_generation_config_has_none(base: Path, tmp_path: Path) -> None:
    probe = TextModel.load(model_dir(base, "bytelevel"))
    eot = tid(probe, "<|eot_id|>")
    model = TextModel.load(
        folder(
            base,
            tmp_path,
            generation_config=None,
            config={"eos_token_id": [5, 6], "max_position_embeddings": 8192},
        )
    )
    assert model.eos_token_ids == (5, 6)
    assert model.stop_token_ids == (5, 6, eot)
    assert model.max_model_len == 8192


def test_eos_from_the_tokenizer_config_eos_token_string(base: Path, tmp_path: Path) -> None:
    probe = TextModel.load(model_dir(base, "bytelevel"))
    model = TextModel.load(
        folder(
            base,
            tmp_path,
            generation_config=None,
            config=None,
            tokenizer_config={
                "eos_token": {"content": "<|end_of_text|>", "special": True},
                "bos_token": "<|begin_of_text|>",
                "model_max_length": 2048,
            },
        )
    )
    assert model.eos_token == "<|end_of_text|>"
    assert model.eos_token_ids == (tid(probe, "<|end_of_text|>"),)
    assert model.stop_token_ids == model.eos_token_ids
    assert model.max_model_len == 2048
    assert model.chat_template is None


def test_context_length_placeholder_is_not_a_length(base: Path, tmp_path: Path) -> None:
    model = TextModel.load(
        folder(
            base,
            tmp_path,
            config={"model_type": "x"},
            tokenizer_config={"model_max_length": 1e30},
        )
    )
    assert model.max_model_len is None


def test_no_eos_anywhere_is_an_empty_tuple(base: Path, tmp_path: Path) -> None:
    model = TextModel.load(
        folder(base, tmp_path, generation_config=None, config=None, tokenizer_config=None)
    )
    assert model.eos_token_ids == ()
    assert model.stop_token_ids == ()
    assert model.bos_token is None


def test_the_tokenizer_and_chat_template_may_come_from_another_folder(
    base: Path, tmp_path: Path
) -> None:
    # As vLLM's --tokenizer: tokenizer.json, tokenizer_config.json (special tokens, template)
    # and chat_template.jinja from the tokenizer's folder; config.json and
    # generation_config.json (context, eos ids) from the model's, and the model's name.
    tok = folder(base, tmp_path)
    (tok / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    (tok / "chat_template.jinja").write_text("T{{ messages[0]['content'] }}")
    model_folder = tmp_path / "weights"
    model_folder.mkdir()
    (model_folder / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    (model_folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    model = TextModel.load(model_folder, tok)
    assert model.name == "weights"
    assert (model.folder, model.tokenizer_folder) == (model_folder, tok)
    assert model.max_model_len == 1024
    assert model.eos_token_ids == (9,)
    assert model.bos_token == "<|begin_of_text|>"
    assert model.apply_chat_template([{"role": "user", "content": "x"}]) == "Tx"
    with pytest.raises(TokenizerNotFound, match=r"weights has no tokenizer\.json"):
        TextModel.load(model_folder)
    with pytest.raises(TokenizerNotFound, match="absent is not a directory"):
        TextModel.load(model_folder, tmp_path / "absent")


def test_missing_tokenizer_json_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(TokenizerNotFound, match=r"no tokenizer\.json.*save_pretrained"):
        TextModel.load(tmp_path)
    with pytest.raises(TokenizerNotFound, match="not a directory"):
        TextModel.load(tmp_path / "absent")


def test_unreadable_files_are_typed_errors(base: Path, tmp_path: Path) -> None:
    bad = folder(base, tmp_path)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(TextError, match=r"config\.json is not valid JSON"):
        TextModel.load(bad)
    (bad / "config.json").write_text("[1, 2]")
    with pytest.raises(TextError, match="not an object"):
        TextModel.load(bad)
    (bad / "config.json").write_text("{}")
    (bad / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(TokenizerNotFound, match="cannot be loaded"):
        TextModel.load(bad)


def test_encode_adds_bos_only_when_asked(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    bos = tid(model, "<|begin_of_text|>")
    assert model.encode("hi")[0] == bos
    assert bos not in model.encode("hi", add_special_tokens=False)
    assert model.decode(model.encode("Zürich 東京 🚀")) == "Zürich 東京 🚀"


def test_token_text_shows_one_token(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    assert model.token_text(tid(model, "<|eot_id|>")) == "<|eot_id|>"
    ids = model.encode(" the", False)
    assert "".join(model.token_text(i) for i in ids) == " the"


# Chat templates


LLAMA3_EXPECTED = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


def test_llama3_like_template_renders_with_bos_and_generation_prompt(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi there \n"},
    ]
    assert model.apply_chat_template(messages) == LLAMA3_EXPECTED
    without = model.apply_chat_template(messages, add_generation_prompt=False)
    assert without == LLAMA3_EXPECTED.removesuffix(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # The rendered prompt holds bos already: encoded without special tokens, it has one.
    ids = model.encode(model.apply_chat_template(messages), add_special_tokens=False)
    assert ids.count(tid(model, "<|begin_of_text|>")) == 1


def test_chatml_template_renders(base: Path) -> None:
    model = TextModel.load(model_dir(base, "metaspace"))
    out = model.apply_chat_template([{"role": "user", "content": "Привет"}])
    assert out == "<|im_start|>user\nПривет<|im_end|>\n<|im_start|>assistant\n"


def test_raise_exception_in_a_template_is_a_chat_template_error(base: Path) -> None:
    llama = TextModel.load(model_dir(base, "bytelevel"))
    with pytest.raises(ChatTemplateError, match="Unknown role: wizard"):
        llama.apply_chat_template([{"role": "wizard", "content": "x"}])
    chatml = TextModel.load(model_dir(base, "metaspace"))
    with pytest.raises(ChatTemplateError, match="must not start with an assistant"):
        chatml.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_a_model_without_template_refuses_chat(base: Path, tmp_path: Path) -> None:
    model = TextModel.load(folder(base, tmp_path, tokenizer_config={"eos_token": "<|eot_id|>"}))
    with pytest.raises(ChatTemplateError, match=r"has no chat template.*tokenizer_config"):
        model.apply_chat_template([{"role": "user", "content": "x"}])
    # A template given by the caller is used instead.
    out = model.apply_chat_template(
        [{"role": "user", "content": "x"}], chat_template=CHATML_TEMPLATE
    )
    assert out.startswith("<|im_start|>user\nx")


def test_named_templates_pick_tool_use_when_tools_are_given(base: Path, tmp_path: Path) -> None:
    templates = [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "tool_use", "template": "T{{ tools | tojson }}"},
    ]
    model = TextModel.load(folder(base, tmp_path, tokenizer_config={"chat_template": templates}))
    assert model.apply_chat_template([{"role": "user", "content": "x"}]) == "D1"
    tools = [{"type": "function", "function": {"name": "météo"}}]
    out = model.apply_chat_template([], tools=tools)
    # tojson keeps non-ASCII text as transformers' filter does.
    assert out == 'T[{"type": "function", "function": {"name": "météo"}}]'


def test_chat_template_jinja_file_overrides_the_config(base: Path, tmp_path: Path) -> None:
    path = folder(base, tmp_path)
    (path / "chat_template.jinja").write_text("{{ bos_token }}|{{ eos_token }}|{{ greeting }}")
    model = TextModel.load(path)
    assert model.apply_chat_template([], greeting="hey") == "<|begin_of_text|>|<|eot_id|>|hey"


def test_templates_are_sandboxed(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    for evil in (
        "{{ messages.__class__.__mro__ }}",
        "{% set _ = messages.append(1) %}",
        "{{ ''.__class__.__subclasses__() }}",
    ):
        with pytest.raises(ChatTemplateError):
            model.apply_chat_template([{"role": "user", "content": "x"}], chat_template=evil)


def test_a_template_that_does_not_compile_is_a_chat_template_error(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    with pytest.raises(ChatTemplateError, match="does not compile"):
        model.apply_chat_template([], chat_template="{% for %}")


def test_hf_whitespace_semantics_trim_and_lstrip_blocks(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    template = "{% for m in messages %}\n    {{ m['content'] }}\n{% endfor %}"
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert model.apply_chat_template(msgs, chat_template=template) == "    a\n    b\n"


def test_tsfront_imports_without_the_text_extra(tmp_path: Path) -> None:
    """tokenizers and jinja2 are optional: tsfront and StopMatcher work without them, and
    loading a model names the extra to install."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tokenizers", "jinja2"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import tsfront, tsfront.text
from tsfront.text import StopMatcher, TextModel, TextDependencyMissing
assert StopMatcher(["x"]).feed("axb") == ("a", True)
try:
    TextModel.load(sys.argv[1])
except TextDependencyMissing as e:
    print(e)
"""
    path = tmp_path / "m"
    path.mkdir()
    (path / "tokenizer.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    assert re.search(r"-m pip install '\S+\[text\]'", out.stdout), out.stdout


def test_generation_blocks_and_loop_controls_render(base: Path) -> None:
    """transformers' templates may mark assistant text with {% generation %} and use
    {% break %} / {% continue %}."""
    model = TextModel.load(model_dir(base, "bytelevel"))
    template = (
        "{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
        "{% if m['role'] == 'assistant' %}{% generation %}[{{ m['content'] }}]{% endgeneration %}"
        "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "skip", "content": "x"},
        {"role": "assistant", "content": "a"},
    ]
    assert model.apply_chat_template(msgs, chat_template=template) == "q[a]"


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("{{ 1/0 }}", "ZeroDivisionError"),
        ("{{ 10.0 ** 1000 }}", "OverflowError"),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    ],
)
def test_any_exception_out_of_a_template_is_a_chat_template_error(
    base: Path, source: str, words: str
) -> None:
    # Before: only TypeError/KeyError/... were caught; ZeroDivisionError (and any other)
    # escaped to the server as a 500.
    model = TextModel.load(model_dir(base, "metaspace"))
    with pytest.raises(ChatTemplateError, match=words):
        model.apply_chat_template([{"role": "user", "content": 7, "x": "7"}], chat_template=source)


@pytest.mark.parametrize(
    "name", ["bos_token", "eos_token", "pad_token", "documents", "raise_exception"]
)
def test_extra_template_variables_may_not_replace_the_renderers_own(base: Path, name: str) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    assert name in model.template_names
    with pytest.raises(ChatTemplateError, match=name):
        model.apply_chat_template([{"role": "user", "content": "x"}], **{name: "PWNED"})


def test_encode_batch_equals_encode_and_the_bounds_the_server_uses(base: Path) -> None:
    model = TextModel.load(model_dir(base, "bytelevel"))
    texts = ["Hello world", "Привет, мир 😀", "x" * 5000]
    assert model.encode_batch(texts) == [model.encode(t) for t in texts]
    assert model.encode_batch(texts, False) == [model.encode(t, False) for t in texts]
    vocab = model.tokenizer.get_vocab(with_added_tokens=True)
    assert model.vocab_size == max(vocab.values()) + 1
    assert model.max_token_chars == max(len(t) for t in vocab)
    # No token covers more characters than the longest: the cheap length bound holds.
    for t in texts:
        assert len(t) <= len(model.encode(t, False)) * model.max_token_chars
