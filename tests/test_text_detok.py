"""The incremental detokenizer against the tokenizers package's own full decode.

For every prefix of a few thousand tokens of mixed-script text (with special tokens between
pieces), the text streamed so far must be exactly the full decode of that prefix whenever the
full decode ends on a whole character, and what is held back (flushed from a copy of the
detokenizer) must complete it otherwise. Two tokenizers made here: a byte-level BPE and a
SentencePiece-style BPE with byte fallback. About 3 s in all.
"""

from __future__ import annotations

import copy
import random

import pytest
from text_fixtures import REPLACEMENT, mixed_text, model_dir

from tsfront.text import ByteLevelDetokenizer, Detokenizer, StreamDetokenizer, TextModel

SPECIAL = {"bytelevel": "<|eot_id|>", "metaspace": "<|im_end|>"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TextModel]:
    base = tmp_path_factory.mktemp("text-models")
    return {k: TextModel.load(model_dir(base, k)) for k in ("bytelevel", "metaspace", "wordlevel")}


def stream_ids(model: TextModel, kind: str, seed: int, min_tokens: int) -> list[int]:
    """Token ids of mixed-script text, a special token between some of its pieces."""
    rng = random.Random(seed)
    special = model.tokenizer.token_to_id(SPECIAL[kind])
    ids: list[int] = []
    piece = 0
    while len(ids) < min_tokens:
        ids += model.encode(mixed_text(seed * 1000 + piece, rng.randint(3, 30)), False)
        if rng.random() < 0.3:
            ids.append(special)
        piece += 1
    return ids


def check_every_prefix(
    model: TextModel,
    detok: Detokenizer,
    prompt: list[int],
    ids: list[int],
    skip: bool,
    byte_fallback: bool,
) -> None:
    base = model.decode(prompt, skip)
    out = ""
    for k, token in enumerate(ids):
        out += detok.step([token])
        full = model.decode(prompt + ids[: k + 1], skip)
        assert full.startswith(base)
        full = full[len(base) :]
        assert REPLACEMENT not in out, f"U+FFFD emitted at token {k}"
        if not full.endswith(REPLACEMENT):
            assert out == full, f"token {k}: streamed text differs from the full decode"
            continue
        held = copy.copy(detok).flush()
        assert held, f"token {k}: an incomplete character was neither emitted nor held"
        if byte_fallback and out + held != full:
            # A byte-fallback decoder shows an invalid group of byte tokens as one U+FFFD per
            # byte, even bytes of a character already complete and emitted.
            assert set(held) == {REPLACEMENT}
        else:
            assert out + held == full, f"token {k}: flushed text differs from the full decode"
    final = model.decode(prompt + ids, skip)[len(base) :]
    assert out + detok.flush() == final
    assert detok.flush() == ""


# (tokenizer, algorithm): the byte table is the default for byte-level BPE, DecodeStream for
# the SentencePiece-style one; DecodeStream is also measured against the table on byte-level.
DEFAULTS = [("bytelevel", "bytes"), ("bytelevel", "decode_stream"), ("metaspace", "decode_stream")]
ALL = [*DEFAULTS, ("bytelevel", "offsets"), ("metaspace", "offsets")]


def test_each_model_gets_its_measured_algorithm(models: dict[str, TextModel]) -> None:
    assert models["bytelevel"].detokenizer_algorithm == "bytes"
    assert isinstance(models["bytelevel"].detokenizer(), ByteLevelDetokenizer)
    assert models["metaspace"].detokenizer_algorithm == "decode_stream"
    assert isinstance(models["metaspace"].detokenizer(), StreamDetokenizer)


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize(("kind", "algorithm"), DEFAULTS)
def test_every_prefix_streams_the_full_decode(
    models: dict[str, TextModel], kind: str, algorithm: str, skip: bool
) -> None:
    model = models[kind]
    # The decoders are not equally fast: a few thousand tokens in about a second each.
    ids = stream_ids(model, kind, seed=1, min_tokens=3000 if kind == "bytelevel" else 2000)
    # The text must really split characters across tokens, or the test proves little.
    assert any(model.decode(ids[:k], skip).endswith(REPLACEMENT) for k in range(1, 300))
    detok = model.detokenizer(skip_special_tokens=skip, algorithm=algorithm)
    check_every_prefix(model, detok, [], ids, skip, kind == "metaspace")


@pytest.mark.parametrize(("kind", "algorithm"), ALL)
def test_every_prefix_after_a_prompt_streams_the_full_decode_of_prompt_and_output(
    models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    """Also the fallback used without DecodeStream (or when it refuses a window)."""
    model = models[kind]
    prompt = model.encode(model.apply_chat_template([{"role": "user", "content": "Hi ü"}]), False)
    ids = stream_ids(model, kind, seed=2, min_tokens=800)
    detok = model.detokenizer(prompt, skip_special_tokens=True, algorithm=algorithm)
    check_every_prefix(model, detok, prompt, ids, True, kind == "metaspace")


@pytest.mark.parametrize("algorithm", ["bytes", "decode_stream", "offsets"])
def test_random_token_ids_stream_the_full_decode_even_when_not_utf8(
    models: dict[str, TextModel], algorithm: str
) -> None:
    """A model may emit byte tokens that never form a character: U+FFFD where the full
    decode has it, and nothing lost or repeated."""
    model = models["bytelevel"]
    rng = random.Random(6)
    ids = [rng.randrange(model.tokenizer.get_vocab_size()) for _ in range(1500)]
    detok = model.detokenizer(skip_special_tokens=False, algorithm=algorithm)
    out = "".join(detok.step([t]) for t in ids) + detok.flush()
    assert out == model.decode(ids, skip_special_tokens=False)
    assert REPLACEMENT in out


def test_random_token_ids_on_the_byte_table_match_every_prefix(
    models: dict[str, TextModel],
) -> None:
    """The table path never shows text the full decode of the same prefix does not start
    with, even for bytes that are not UTF-8 (its C decoder replaces as Rust's lossy one)."""
    model = models["bytelevel"]
    rng = random.Random(7)
    ids = [rng.randrange(model.tokenizer.get_vocab_size()) for _ in range(800)]
    detok = model.detokenizer(skip_special_tokens=False, algorithm="bytes")
    out = ""
    for k, t in enumerate(ids):
        out += detok.step([t])
        full = model.decode(ids[: k + 1], skip_special_tokens=False)
        assert out + copy.copy(detok).flush() == full


@pytest.mark.parametrize(("kind", "algorithm"), ALL)
def test_chunks_of_several_tokens_stream_the_full_decode(
    models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    """A worker that falls behind gets several tokens per chunk: same text, no loss."""
    model = models[kind]
    ids = stream_ids(model, kind, seed=4, min_tokens=2000)
    prompt = model.encode("Question: ", False)
    detok = model.detokenizer(prompt, True, algorithm=algorithm)
    rng = random.Random(5)
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 9)
        out.append(detok.step(ids[i : i + n]))
        assert REPLACEMENT not in out[-1]
        i += n
    out.append(detok.flush())
    base = model.decode(prompt)
    assert "".join(out) == model.decode(prompt + ids)[len(base) :]


def test_a_character_split_across_tokens_is_held_then_emitted_whole(
    models: dict[str, TextModel],
) -> None:
    model = models["bytelevel"]
    ch = next(c for c in "龘𪚥🦜鱻" if len(model.encode(c, False)) >= 3)
    ids = model.encode("a" + ch, False)
    detok = model.detokenizer()
    deltas = [detok.step([t]) for t in ids]
    assert deltas[0] == "a"
    assert deltas[1:-1] == [""] * (len(ids) - 2)
    assert deltas[-1] == ch
    assert detok.flush() == ""


def test_a_stream_cut_inside_a_character_flushes_it_as_the_full_decode_does(
    models: dict[str, TextModel],
) -> None:
    model = models["bytelevel"]
    ids = model.encode("ok 🦜", False)[:-1]
    detok = model.detokenizer()
    text = "".join(detok.step([t]) for t in ids)
    assert REPLACEMENT not in text
    assert text + detok.flush() == model.decode(ids)


def test_sentencepiece_first_token_keeps_its_space_after_a_prompt(
    models: dict[str, TextModel],
) -> None:
    model = models["metaspace"]
    prompt = model.encode("Tell me", False)
    piece = next(t for t in sorted(model.tokenizer.get_vocab()) if t.startswith("▁q"))
    word = model.tokenizer.token_to_id(piece)
    assert model.detokenizer(prompt).step([word]) == " " + piece[1:]
    # Without a prompt it is the first token of the text, whose space the decoder strips.
    assert model.detokenizer().step([word]) == piece[1:]


def test_skip_special_tokens_drops_or_keeps_them(models: dict[str, TextModel]) -> None:
    model = models["bytelevel"]
    ids = [*model.encode("Hi", False), model.tokenizer.token_to_id("<|eot_id|>")]
    kept = model.detokenizer(skip_special_tokens=False)
    skipped = model.detokenizer(skip_special_tokens=True)
    assert "".join(kept.step([t]) for t in ids) + kept.flush() == "Hi<|eot_id|>"
    assert "".join(skipped.step([t]) for t in ids) + skipped.flush() == "Hi"


def test_wordlevel_model_spells_engine_token_ids(models: dict[str, TextModel]) -> None:
    """The simulator's ids 3 .. 31999 read as w<id>, so a server test can check its text."""
    model = models["wordlevel"]
    detok = model.detokenizer(model.encode("w7 w8"))
    assert [detok.step([t]) for t in (3, 31999, 2)] == [" w3", " w31999", ""]
    assert model.decode([5, 6]) == "w5 w6"
    assert model.eos_token_ids == (2, model.tokenizer.token_to_id("<|im_end|>"))


def test_an_empty_step_is_no_text(models: dict[str, TextModel]) -> None:
    detok = models["bytelevel"].detokenizer()
    assert detok.step([]) == ""
    assert detok.flush() == ""
