"""Every tokenizer format a model folder ships, loaded as the folder ships it.

Real vocabularies, nothing downloaded: Mistral's Tekken file that mistral-common's wheel
carries (131,072 ids, its v3 pattern), and the same token bytes written as a Kimi folder's
``tiktoken.model`` with Kimi's split pattern and reserved tokens. The references are the
libraries those models' own tokenizer classes run: mistral-common's ``Tekkenizer`` and
``tiktoken`` (as Kimi's ``TikTokenTokenizer`` builds it). The text is mixed-script (Latin,
accents, Cyrillic, CJK, Hangul, emoji sequences, newlines), plus strings of few characters
that stress BPE's order of merges.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.text_fixtures import REPLACEMENT, mixed_text

from tsfront.text import TextModel, TokenizerNotFound
from tsfront.text.testing import O200K_PATTERN
from tsfront.text.tokenizer_files import KIMI_PATTERN, load_tokenizer, read_tiktoken_file

mistral_common = pytest.importorskip("mistral_common")
tiktoken = pytest.importorskip("tiktoken")

from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # noqa: E402

TEKKEN = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
KIMI_NAMES = {0: "[BOS]", 1: "[EOS]", 4: "<|im_end|>", 5: "<|im_user|>", 6: "<|im_assistant|>"}


def texts() -> list[str]:
    """Mixed-script text, and short strings of a few characters that overlap in many ways
    (where two merges of the same token compete)."""
    rng = random.Random(7)
    out = [mixed_text(seed, rng.randint(5, 80)) for seed in range(60)]
    alphabet = "ab aba xyz  \n\t.,'sSéЖж中文漢字🎉0123456789AĀ"
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(600)]
    out += ["Hello, world! don't I'M 中文abc漢字Ab 안녕 👨\u200d👩\u200d👧 3.14159 \r\n  x"]
    return out


def tekken_tokens() -> list[bytes]:
    data = json.loads(TEKKEN.read_text(encoding="utf-8"))
    n = data["config"]["default_vocab_size"] - data["config"]["default_num_special_tokens"]
    return [base64.b64decode(v["token_bytes"]) for v in data["vocab"][:n]]


def kimi_folder(base: Path, pattern: str | None, *, source: bool = True) -> Path:
    """A Kimi-shaped folder: tiktoken.model (Tekken's token bytes), a tokenizer_config.json
    naming the class and the reserved tokens, and (``source``) the class's module with
    ``pat_str`` written as Kimi writes it (a ``"|".join`` of literals)."""
    folder = base / f"kimi-{'own' if pattern else 'none'}-{source}"
    folder.mkdir()
    tokens = tekken_tokens()
    with (folder / "tiktoken.model").open("wb") as f:
        for rank, token in enumerate(tokens):
            f.write(base64.b64encode(token) + b" %d\n" % rank)
    n = len(tokens)
    config = {
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "added_tokens_decoder": {
            str(n + k): {"content": name, "special": True} for k, name in KIMI_NAMES.items()
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if source and pattern is not None:
        parts = pattern.split("|")  # no "|" inside these patterns' parts
        (folder / "tokenization_kimi.py").write_text(
            "import os\n\n\nclass TikTokenTokenizer(object):\n"
            "    num_reserved_special_tokens = 256\n"
            f"    pat_str = '|'.join({parts!r})\n\n"
            "    def __init__(self):\n        raise RuntimeError('never run')\n"
        )
    return folder


def kimi_reference(pattern: str) -> Any:
    tokens = tekken_tokens()
    n = len(tokens)
    specials = {f"<|reserved_token_{i}|>": i for i in range(n, n + 258)}
    for k, name in KIMI_NAMES.items():
        del specials[f"<|reserved_token_{n + k}|>"]
        specials[name] = n + k
    ranks = {t: r for r, t in enumerate(tokens)}
    return tiktoken.Encoding(
        "kimi", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )


@pytest.fixture(scope="module")
def tekken(tmp_path_factory: pytest.TempPathFactory) -> tuple[TextModel, Any]:
    folder = tmp_path_factory.mktemp("mistral")
    shutil.copyfile(TEKKEN, folder / "tekken.json")
    return TextModel.load(folder), Tekkenizer.from_file(TEKKEN)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> tuple[TextModel, Any]:
    folder = kimi_folder(tmp_path_factory.mktemp("kimi"), KIMI_PATTERN)
    return TextModel.load(folder), kimi_reference(KIMI_PATTERN)


def stream(model: TextModel, ids: list[int], skip: bool) -> str:
    """The text of ``ids`` streamed one id a step, checking no U+FFFD is ever sent."""
    detok = model.detokenizer(skip_special_tokens=skip)
    out = ""
    for i in ids:
        out += detok.step([i])
        assert REPLACEMENT not in out
    return out + detok.flush()


def test_tekken_ids_are_mistral_commons(tekken: tuple[TextModel, Any]) -> None:
    model, reference = tekken
    assert model.tokenizer_format == "tekken"
    for text in texts():
        ids = model.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, bos=False, eos=False), text
        assert model.decode(ids) == text == reference.decode(ids)


def test_tekken_streams_exact_text_on_the_table_path(tekken: tuple[TextModel, Any]) -> None:
    model, reference = tekken
    assert model.detokenizer_algorithm == "table"
    assert model.vocab_size == reference.n_words == 131072
    rng = random.Random(3)
    ids: list[int] = []
    for text in texts()[:60]:
        ids += model.encode(text, add_special_tokens=False)
        if rng.random() < 0.3:
            ids.append(rng.randrange(reference.num_special_tokens))  # a control token
    assert stream(model, ids, True) == reference.decode(ids) == model.decode(ids)
    assert stream(model, ids, False) == model.decode(ids, skip_special_tokens=False)
    # Several ids a step: the same text.
    detok, out, k = model.detokenizer(), "", 0
    while k < len(ids):
        n = rng.randint(1, 4)
        out += detok.step(ids[k : k + n])
        k += n
    assert out + detok.flush() == reference.decode(ids)


def test_tekken_control_tokens_are_single_special_tokens(tekken: tuple[TextModel, Any]) -> None:
    model, reference = tekken
    assert (model.bos_token, model.eos_token) == ("<s>", "</s>")
    assert model.eos_token_ids == (reference.eos_id,) == (2,)
    ids = model.encode("[INST]hi[/INST][TOOL_CALLS]", add_special_tokens=False)
    inst, end, calls = map(reference.get_special_token, ("[INST]", "[/INST]", "[TOOL_CALLS]"))
    assert ids[0] == inst and ids[-2:] == [end, calls]
    assert model.decode(ids) == "hi"
    assert model.decode(ids, skip_special_tokens=False) == "[INST]hi[/INST][TOOL_CALLS]"
    assert model.tokenizer.id_to_token(999) == "<SPECIAL_999>"
    # No token covers more characters than the longest token's text.
    longest = max(len(reference.id_to_byte_piece(i)) for i in range(1000, reference.n_words))
    assert model.max_token_chars >= longest


def test_kimi_ids_are_tiktokens_with_kimis_pattern(kimi: tuple[TextModel, Any]) -> None:
    model, reference = kimi
    assert model.tokenizer_format == "tiktoken"
    for text in texts():
        ids = model.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, allowed_special="all"), text
        assert model.decode(ids) == text
    # Han runs are split from other letters (the pattern's first part), as tiktoken does.
    assert model.encode("中文abc", False) == reference.encode("中文abc", allowed_special="all")


def test_kimi_reserved_tokens_are_named_by_the_config(kimi: tuple[TextModel, Any]) -> None:
    model, reference = kimi
    n = reference.max_token_value - 257
    assert (model.bos_token, model.eos_token) == ("[BOS]", "[EOS]")
    assert model.tokenizer.token_to_id("<|im_end|>") == n + 4
    assert model.tokenizer.id_to_token(n + 100) == f"<|reserved_token_{n + 100}|>"
    assert model.vocab_size == reference.n_vocab == n + 258
    text = "<|im_user|>user<|im_middle|>héllo 中文<|im_end|>"
    ids = model.encode(text, add_special_tokens=False)
    assert ids[0] == n + 5 and ids[-1] == n + 4
    assert model.decode(ids) == "user<|im_middle|>héllo 中文"  # no such token: text
    assert stream(model, ids, True) == model.decode(ids)
    assert stream(model, ids, False) == text


def test_the_folders_own_class_source_gives_the_pattern(tmp_path: Path) -> None:
    # A pattern other than Kimi's (o200k's): the folder's own class source is what is read.
    own = TextModel.load(kimi_folder(tmp_path, O200K_PATTERN))
    reference = kimi_reference(O200K_PATTERN)
    for text in ("中文abc漢字Ab don't", *texts()[:20]):
        assert own.encode(text, False) == reference.encode(text, allowed_special="all")
    # Without the source, a Kimi class gets Kimi's pattern.
    fallback = TextModel.load(kimi_folder(tmp_path, None, source=False))
    kimi = kimi_reference(KIMI_PATTERN)
    differ = [t for t in texts() if kimi.encode(t) != reference.encode(t)]
    assert len(differ) > 10
    for text in differ:
        assert fallback.encode(text, False) == kimi.encode(text) != own.encode(text, False)


def test_a_tiktoken_file_without_its_class_says_what_to_do(tmp_path: Path) -> None:
    folder = kimi_folder(tmp_path, KIMI_PATTERN)
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerNotFound, match=r"names no tokenizer class.*tokenizer\.json"):
        TextModel.load(folder)
    config = {"auto_map": {"AutoTokenizer": ["tokenization_other.Other", None]}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerNotFound, match=r"no split pattern for tokenization_other\.Other"):
        TextModel.load(folder)


def test_a_malformed_tiktoken_file_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tiktoken.model"
    path.write_bytes(b"IQ== 0\nnot-base64! 1\n")
    with pytest.raises(TokenizerNotFound, match="line 2"):
        read_tiktoken_file(path)
    path.write_bytes(b"IQ== 0\nIg== 2\n")
    with pytest.raises(TokenizerNotFound, match=r"ranks are not 0\.\.1"):
        read_tiktoken_file(path)


def test_tokenizer_json_wins_over_other_files(tmp_path: Path) -> None:
    from tsfront.text.testing import make_test_model

    folder = make_test_model(tmp_path / "m", "bytelevel")
    shutil.copyfile(TEKKEN, folder / "tekken.json")
    assert load_tokenizer(folder, {}).format == "tokenizer.json"
    (folder / "tokenizer.json").unlink()
    assert load_tokenizer(folder, {}).format == "tekken"


def test_copies_of_a_stream_fork_its_state(tekken: tuple[TextModel, Any]) -> None:
    model, _ = tekken
    ids = model.encode("naïve 🎉 中文", add_special_tokens=False)
    detok = model.detokenizer()
    head = "".join(detok.step([i]) for i in ids[:3])
    fork = copy.copy(detok)
    tail = "".join(detok.step([i]) for i in ids[3:]) + detok.flush()
    assert head + tail == "naïve 🎉 中文"
    assert head + "".join(fork.step([i]) for i in ids[3:]) + fork.flush() == "naïve 🎉 中文"
