"""The encode cache is exact: a prompt's ids through it are the ids of one whole encode.

Property tests over seeded random conversations (growing turn by turn, forking, edited) on
every tokenizer family the server supports: byte-level BPE (trained here, with and without
``add_prefix_space``; and DeepSeek-V3's real 128k one when it can be fetched), SentencePiece
BPE with a ``Prepend`` normalizer and byte fallback, Unigram with Metaspace's ``first``
prepend scheme, WordPiece with the BERT normalizer, word-level; plus tokenizers built to
break a naive cut: added tokens that overlap an anchor, ``lstrip`` / ``rstrip`` neighbours,
normalized tokens under a lowercasing normalizer. And what `exact_anchors` refuses. ~10 s.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from support.text_fixtures import model_dir

from tsfront.text.encode_cache import Anchors, PromptEncoder, exact_anchors, new_cache
from tsfront.text.testing import CORPUS, mixed_text

tk = pytest.importorskip("tokenizers")

CHATML = ["<|im_start|>", "<|im_end|>"]
LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encode-cache")


def folder_tokenizer(base: Path, kind: str) -> Any:
    return tk.Tokenizer.from_file(str(model_dir(base, kind) / "tokenizer.json"))


def wordpiece() -> Any:
    tok = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    trainer = tk.trainers.WordPieceTrainer(
        vocab_size=400,
        special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", *CHATML],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = tk.processors.BertProcessing(
        ("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]"))
    )
    return tok


def bytelevel_prefix_space(base: Path) -> Any:
    """The trained byte-level BPE with ``add_prefix_space``: every piece gets a space in
    front, so a piece cut at the wrong place encodes differently."""
    spec = json.loads(folder_tokenizer(base, "bytelevel").to_str())
    spec["pre_tokenizer"] = {
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True,
    }  # fmt: skip
    tok = tk.Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(CHATML)
    return tok


def hostile(base: Path) -> Any:
    """ChatML anchors among added tokens that overlap them or strip around them, and a
    normalized token under a lowercasing normalizer."""
    spec = json.loads(folder_tokenizer(base, "bytelevel").to_str())
    spec["normalizer"] = {"type": "Lowercase"}
    tok = tk.Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens(CHATML)
    tok.add_tokens(
        [
            tk.AddedToken("<|im_end|>\n", normalized=False),  # holds an anchor
            tk.AddedToken("x<|im", normalized=False),  # its suffix is an anchor's prefix
            tk.AddedToken("[INST]", normalized=False, rstrip=True),
            tk.AddedToken("<mask>", normalized=False, lstrip=True),
            tk.AddedToken("<sep>", normalized=False, single_word=True),
            tk.AddedToken("<Think>", normalized=True),  # matched after lowercasing
        ]
    )
    return tok


def metaspace_identity_normalized() -> Any:
    """Unigram/Metaspace ``first`` with no normalizer and normalized added tokens as anchors
    (DeepSeek-V3's user and assistant markers are normalized tokens under an empty
    normalizer)."""
    tok = tk.Tokenizer(tk.models.Unigram())
    tok.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = tk.trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([tk.AddedToken(t, normalized=True) for t in ("<｜User｜>", "<｜Assistant｜>")])
    return tok


# ---------------------------------------------------------------------- conversations

BITS = [
    " ", "  ", "\n", "\n\n", " \t", "x", "<|im_", "im_end|>", "|>", "<", "12345", "[INST]",
    "<mask>", "<sep>", "<think>", "<Think>", "▁", "é", "日本", "👍🏽", "<|eot_id|>", "<s>",
]  # fmt: skip


def content(rng: random.Random, anchors: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(0, 6)):
        r = rng.random()
        if r < 0.45:
            parts.append(mixed_text(rng.randrange(1 << 30), rng.randint(1, 12)))
        elif r < 0.85:
            parts.append(rng.choice(BITS))
        else:
            parts.append(rng.choice(anchors))  # a client may write an anchor's text
    return "".join(parts)


def turn(rng: random.Random, anchors: list[str]) -> str:
    """One message as a template writes it: an anchor, a role, text, an anchor, maybe text
    glued to either side of an anchor."""
    a, b = rng.choice(anchors), rng.choice(anchors)
    role = rng.choice(["system", "user", "assistant", "tool", ""])
    sep = rng.choice(["\n", "", " ", "\n\n"])
    return a + role + sep + content(rng, anchors) + b + rng.choice(["\n", "", " ", "x"])


def conversations(seed: int, anchors: list[str], n: int) -> list[str]:
    """Prompts in an order a server sees: conversations growing, forks of earlier prefixes,
    edits of earlier turns, lone prompts."""
    rng = random.Random(seed)
    prompts: list[str] = []
    live: list[list[str]] = []
    for _ in range(n):
        r = rng.random()
        if not live or r < 0.15:
            live.append([turn(rng, anchors) for _ in range(rng.randint(1, 3))])
            turns = live[-1]
        elif r < 0.7:
            turns = rng.choice(live)
            turns.append(turn(rng, anchors))
        elif r < 0.85:  # a fork: the same history up to a point, then another turn
            turns = [*rng.choice(live)[: rng.randint(0, 3)], turn(rng, anchors)]
            live.append(turns)
        else:  # an earlier turn edited
            turns = list(rng.choice(live))
            i = rng.randrange(len(turns))
            turns[i] = turns[i][: rng.randint(0, len(turns[i]))] + content(rng, anchors)
        tail = rng.choice(["", anchors[0] + "assistant\n", "x", " ", anchors[0]])
        prompts.append("".join(turns) + tail)
    return prompts


def check_exact(tok: Any, wanted: list[str], seed: int, n: int = 150) -> PromptEncoder:
    anchors, why = exact_anchors(tok, wanted)
    assert anchors is not None, why
    encoder = PromptEncoder(tok, anchors, new_cache(bytearray(1 << 20), seed=seed))
    for i, prompt in enumerate(conversations(seed, wanted, n)):
        want = tok.encode(prompt, add_special_tokens=False).ids
        got = encoder.encode(prompt)
        assert got == want, f"prompt {i}: {prompt!r}"
    counters = encoder.counters()
    assert counters["hits"] > n // 3, counters  # the cache was used, not bypassed
    return encoder


# ---------------------------------------------------------------------- exactness


@pytest.mark.parametrize(
    "kind, wanted",
    [
        ("bytelevel", LLAMA3),
        ("metaspace", CHATML),
        ("unigram", CHATML),
        ("wordlevel", CHATML),
    ],
)
def test_cached_ids_equal_a_whole_encode_on_each_test_family(
    base: Path, kind: str, wanted: list[str]
) -> None:
    tok = folder_tokenizer(base, kind)
    for seed in (1, 2):
        check_exact(tok, wanted, seed)


def test_cached_ids_equal_a_whole_encode_on_wordpiece() -> None:
    check_exact(wordpiece(), CHATML, 3)


def test_cached_ids_equal_a_whole_encode_with_a_prefix_space_per_piece(base: Path) -> None:
    check_exact(bytelevel_prefix_space(base), CHATML, 4)


def test_normalized_tokens_are_anchors_under_an_empty_normalizer() -> None:
    tok = metaspace_identity_normalized()
    anchors, _ = exact_anchors(tok, ["<｜User｜>", "<｜Assistant｜>"])
    assert anchors is not None and len(anchors.texts) == 2
    check_exact(tok, ["<｜User｜>", "<｜Assistant｜>"], 5)


def test_overlapping_and_stripping_neighbours_keep_it_exact(base: Path) -> None:
    tok = hostile(base)
    anchors, _ = exact_anchors(tok, [*CHATML, "<Think>", "[INST]", "<mask>", "<sep>"])
    # <|im_end|> is held by "<|im_end|>\n", <|im_start|>'s prefix ends "x<|im"; the others
    # strip, need a word boundary, or are normalized by a normalizer that does something.
    assert anchors is None
    tok.add_special_tokens(["<|endoftext|>"])
    anchors, _ = exact_anchors(tok, [*CHATML, "<|endoftext|>"])
    assert anchors is not None and anchors.texts == ("<|endoftext|>",)
    check_exact(tok, ["<|endoftext|>", *CHATML], 6)


def test_a_cut_where_an_overlapping_token_wins_would_be_wrong(base: Path) -> None:
    # What the refusal prevents: "x<|im" takes the start of the second <|im_start|>, so the
    # tokenizer does not cut there; cut anyway, "w7" is a word of its own instead of part of
    # "_start|>w7".
    tok = folder_tokenizer(base, "wordlevel")
    tok.add_tokens([tk.AddedToken("x<|im", normalized=False)])
    assert exact_anchors(tok, ["<|im_start|>"])[0] is None
    forced = Anchors(("<|im_start|>",), (tok.token_to_id("<|im_start|>"),))
    encoder = PromptEncoder(tok, forced, new_cache(bytearray(1 << 20)))
    prompt = "<|im_start|>w5 x<|im_start|>w7"
    assert encoder.encode(prompt) != tok.encode(prompt, add_special_tokens=False).ids


def test_the_real_deepseek_v3_tokenizer(tmp_path: Path) -> None:
    from tsfront.bench.realtok import TokenizerUnavailable, deepseek_tokenizer

    try:
        path = deepseek_tokenizer()
    except TokenizerUnavailable as exc:
        pytest.skip(str(exc))
    tok = tk.Tokenizer.from_file(str(path))
    tok.add_special_tokens(CHATML)
    wanted = [*CHATML, "<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>"]
    anchors, why = exact_anchors(tok, wanted)
    assert anchors is not None and set(anchors.texts) == set(wanted), why
    check_exact(tok, wanted, 7, n=80)


# ---------------------------------------------------------------------- refusals


def test_no_cache_for_a_tokenizer_that_truncates_or_pads(base: Path) -> None:
    tok = folder_tokenizer(base, "metaspace")
    tok.enable_truncation(64)
    assert exact_anchors(tok, CHATML) == (None, "the tokenizer truncates or pads")
    tok.no_truncation()
    tok.enable_padding(length=64)
    assert exact_anchors(tok, CHATML)[0] is None


def test_no_cache_with_bpe_dropout(base: Path) -> None:
    spec = json.loads(folder_tokenizer(base, "bytelevel").to_str())
    spec["model"]["dropout"] = 0.1
    tok = tk.Tokenizer.from_str(json.dumps(spec))
    assert exact_anchors(tok, LLAMA3) == (None, "the BPE model has dropout")


def test_special_tokens_are_no_anchors_when_they_are_encoded_as_text(base: Path) -> None:
    tok = folder_tokenizer(base, "metaspace")
    tok.encode_special_tokens = True
    assert exact_anchors(tok, CHATML)[0] is None


def test_only_the_tokens_the_template_writes_are_searched(base: Path) -> None:
    tok = folder_tokenizer(base, "metaspace")
    anchors, _ = exact_anchors(tok, ["<|im_end|>", "not a token"])
    assert anchors is not None and anchors.texts == ("<|im_end|>",)


def test_a_short_prompt_without_anchors_is_encoded_whole(base: Path) -> None:
    tok = folder_tokenizer(base, "metaspace")
    anchors, _ = exact_anchors(tok, CHATML)
    assert anchors is not None
    encoder = PromptEncoder(tok, anchors, new_cache(bytearray(1 << 20)))
    text = "no anchor here at all"
    assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert encoder.counters()["lookups"] == 0
