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
from support.text_fixtures import REPLACEMENT, mixed_text, model_dir

from tsfront.text import Detokenizer, StreamDetokenizer, TableDetokenizer, TextError, TextModel

SPECIAL = {
    "bytelevel": "<|eot_id|>",
    "metaspace": "<|im_end|>",
    "unigram": "<|im_end|>",
    "wordlevel": "<|im_end|>",
}
KINDS = list(SPECIAL)
# Tokenizers whose test text splits characters across tokens (the others have no byte tokens).
SPLITTING = ("bytelevel", "metaspace")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TextModel]:
    base = tmp_path_factory.mktemp("text-models")
    return {k: TextModel.load(model_dir(base, k)) for k in KINDS}


def stream_ids(model: TextModel, kind: str, seed: int, min_tokens: int) -> list[int]:
    """Token ids of mixed-script text, a special token between some of its pieces (for the
    word-level model, whose vocabulary is w<id>: random ids, special ones included)."""
    rng = random.Random(seed)
    if kind == "wordlevel":
        return [rng.randrange(model.tokenizer.get_vocab_size()) for _ in range(min_tokens)]
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


ALGORITHMS = ["table", "decode_stream", "offsets"]
# The decoders are not equally fast: a few thousand tokens in about half a second each.
PREFIX_TOKENS = {"bytelevel": 3000, "metaspace": 2000, "unigram": 1200, "wordlevel": 1200}


def test_each_model_gets_the_table_algorithm(models: dict[str, TextModel]) -> None:
    for kind in KINDS:
        assert models[kind].detokenizer_algorithm == "table"
        assert isinstance(models[kind].detokenizer(), TableDetokenizer)
        assert isinstance(models[kind].detokenizer(algorithm="offsets"), StreamDetokenizer)


def test_an_unsupported_decoder_gets_decode_stream(models: dict[str, TextModel]) -> None:
    from tokenizers import Tokenizer, decoders

    tok = Tokenizer.from_str(models["bytelevel"].tokenizer.to_str())
    tok.decoder = decoders.WordPiece()
    model = TextModel(tok, name="wordpiece")
    assert model.detokenizer_algorithm == "decode_stream"
    assert isinstance(model.detokenizer(), StreamDetokenizer)
    with pytest.raises(TextError, match="decode_stream"):
        model.detokenizer(algorithm="table")


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_prefix_streams_the_full_decode(
    models: dict[str, TextModel], kind: str, skip: bool
) -> None:
    model = models[kind]
    ids = stream_ids(model, kind, seed=1, min_tokens=PREFIX_TOKENS[kind])
    if kind in SPLITTING:
        # The text must really split characters across tokens, or the test proves little.
        assert any(model.decode(ids[:k], skip).endswith(REPLACEMENT) for k in range(1, 300))
    detok = model.detokenizer(skip_special_tokens=skip)
    check_every_prefix(model, detok, [], ids, skip, kind == "metaspace")


@pytest.mark.parametrize("skip", [True, False], ids=["skip-special", "keep-special"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_prefix_on_decode_stream_streams_the_full_decode(
    models: dict[str, TextModel], kind: str, skip: bool
) -> None:
    """DecodeStream, used for decoders the table does not support, on the same tokenizers."""
    model = models[kind]
    ids = stream_ids(model, kind, seed=8, min_tokens=600)
    detok = model.detokenizer(skip_special_tokens=skip, algorithm="decode_stream")
    check_every_prefix(model, detok, [], ids, skip, kind == "metaspace")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_prefix_after_a_prompt_streams_the_full_decode_of_prompt_and_output(
    models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    """After a prompt the first output token is not the start of the text (SentencePiece
    keeps its space); also the fallback used without DecodeStream."""
    model = models[kind]
    prompt = model.encode(model.apply_chat_template([{"role": "user", "content": "Hi ü"}]), False)
    ids = stream_ids(model, kind, seed=2, min_tokens=600)
    detok = model.detokenizer(prompt, skip_special_tokens=True, algorithm=algorithm)
    check_every_prefix(model, detok, prompt, ids, True, kind == "metaspace")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", ["bytelevel", "unigram", "wordlevel"])
def test_random_token_ids_stream_the_full_decode_even_when_not_utf8(
    models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    """A model may emit byte tokens that never form a character: U+FFFD where the full
    decode has it, and nothing lost or repeated. (Not for byte fallback: there the full
    decode turns a whole run of byte tokens into U+FFFD once any byte of it is invalid,
    characters already streamed included; no streaming decoder can take text back.)"""
    model = models[kind]
    rng = random.Random(6)
    ids = [rng.randrange(model.tokenizer.get_vocab_size()) for _ in range(1500)]
    for skip in (True, False):
        detok = model.detokenizer(skip_special_tokens=skip, algorithm=algorithm)
        out = "".join(detok.step([t]) for t in ids) + detok.flush()
        assert out == model.decode(ids, skip_special_tokens=skip)
        if kind == "bytelevel":
            assert REPLACEMENT in out


def test_random_token_ids_on_the_byte_table_match_every_prefix(
    models: dict[str, TextModel],
) -> None:
    """The table path never shows text the full decode of the same prefix does not start
    with, even for bytes that are not UTF-8 (its C decoder replaces as Rust's lossy one)."""
    model = models["bytelevel"]
    rng = random.Random(7)
    ids = [rng.randrange(model.tokenizer.get_vocab_size()) for _ in range(800)]
    detok = model.detokenizer(skip_special_tokens=False, algorithm="table")
    out = ""
    for k, t in enumerate(ids):
        out += detok.step([t])
        full = model.decode(ids[: k + 1], skip_special_tokens=False)
        assert out + copy.copy(detok).flush() == full


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", KINDS)
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
    # Every id the simulator generates by default reads as its word.
    from tsfront.sim.scheduler import default_token

    ids = [default_token(f"rid-{r}", i) for r in range(4) for i in range(64)]
    assert model.decode(ids) == " ".join(f"w{i}" for i in ids)
    assert model.eos_token_ids == (2, model.tokenizer.token_to_id("<|im_end|>"))


def test_an_empty_step_is_no_text(models: dict[str, TextModel]) -> None:
    detok = models["bytelevel"].detokenizer()
    assert detok.step([]) == ""
    assert detok.flush() == ""


def test_byte_table_follows_the_decoder_rule_for_added_tokens(
    models: dict[str, TextModel],
) -> None:
    """An added token with a character outside the byte alphabet stands for its UTF-8; one
    made only of alphabet characters for the bytes they map to (so "<spé>" holds byte 0xE9,
    which is no UTF-8 on its own), exactly as ``Tokenizer.decode``."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(models["bytelevel"].tokenizer.to_str())
    tok.add_tokens([AddedToken("café✓", special=False), AddedToken("<tool>", special=False)])
    tok.add_special_tokens([AddedToken("<spé>", special=True)])
    model = TextModel(tok, name="added")
    ids = model.encode("hi ", False)
    stream = [
        *ids,
        tok.token_to_id("café✓"),
        *ids,
        tok.token_to_id("<spé>"),
        tok.token_to_id("<tool>"),
        *ids,
    ]
    for skip in (True, False):
        for algorithm in ("table", "decode_stream"):
            detok = model.detokenizer(skip_special_tokens=skip, algorithm=algorithm)
            out = "".join(detok.step([t]) for t in stream) + detok.flush()
            assert out == model.decode(stream, skip), (skip, algorithm)
    assert model.token_bytes(tok.token_to_id("<spé>")) == b"<sp\xe9>"
    assert model.token_bytes(tok.token_to_id("café✓")) == "café✓".encode()


def test_token_bytes_of_split_characters_rebuild_the_text(models: dict[str, TextModel]) -> None:
    for kind in ("bytelevel", "metaspace"):
        model = models[kind]
        text = "日本語 🦜 naïve"
        ids = model.encode(text, False)
        joined = b"".join(model.token_bytes(t) for t in ids).decode()
        # SentencePiece's first token carries the space its normalizer prepended.
        assert joined.removeprefix(" " if kind == "metaspace" else "") == text


def test_token_text_shows_a_token_as_it_reads_in_a_stream(models: dict[str, TextModel]) -> None:
    model = models["metaspace"]
    piece = next(t for t in sorted(model.tokenizer.get_vocab()) if t.startswith("▁q"))
    assert model.token_text(model.tokenizer.token_to_id(piece)) == " " + piece[1:]
    assert model.token_text(model.tokenizer.token_to_id("<0xE6>")) == REPLACEMENT
    assert model.token_bytes(model.tokenizer.token_to_id("<0xE6>")) == b"\xe6"
    assert models["wordlevel"].token_text(7) == " w7"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_a_prompt_of_ids_that_ends_inside_a_character(
    models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    """Completed by the output, the character is output text; not completed, the output
    starts with the U+FFFD the full decode shows for the prompt's broken character."""
    model = models[kind]
    # One character split: byte fallback shows a broken run of byte tokens as U+FFFD
    # throughout, so a whole character before the cut would be no reference.
    ids = model.encode("ok 🦜", False)
    cut = next(k for k in range(len(ids), 0, -1) if model.decode(ids[:k]).endswith(REPLACEMENT))
    prompt = ids[:cut]
    head = model.decode(prompt).rstrip(REPLACEMENT)
    for rest in (ids[cut:], model.encode(" fine", False)):
        detok = model.detokenizer(prompt, algorithm=algorithm)
        out = "".join(detok.step([t]) for t in rest) + detok.flush()
        assert out == model.decode(prompt + rest)[len(head) :]
    assert out.endswith(" fine") and out.startswith(REPLACEMENT)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", KINDS)
def test_ids_outside_the_vocabulary_give_no_text(
    models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    """An engine that sends an id the tokenizer does not know (or a negative one) costs that
    token's text, never the stream: as Tokenizer.decode, which skips unknown ids."""
    model = models[kind]
    ids = stream_ids(model, kind, seed=9, min_tokens=200)
    bad = [-1, model.tokenizer.get_vocab_size() + 10, 2**40]
    mixed = [t for i, t in enumerate(ids) for t in ((t, bad[i % 3]) if i % 7 == 0 else (t,))]
    detok = model.detokenizer([-5, *ids[:3], 2**33], algorithm=algorithm)
    out = "".join(detok.step([t]) for t in mixed[:100]) + detok.step(mixed[100:]) + detok.flush()
    base = model.decode(ids[:3])
    assert out == model.decode(ids[:3] + ids)[len(base) :]


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_cut_anywhere_then_output_decodes_as_the_whole(
    models: dict[str, TextModel], kind: str
) -> None:
    """Whatever the prompt's last token (an ASCII end, whose decode of the prompt's tail the
    table skips, or one inside or at the end of a wider character), the output after it is
    the full decode's continuation."""
    model = models[kind]
    ids = model.encode("ok é 🦜 x, fine ü.", False)
    full_of = {k: model.decode(ids[:k]) for k in range(len(ids) + 1)}
    for cut in range(1, len(ids)):
        head = full_of[cut].rstrip(REPLACEMENT)
        detok = model.detokenizer(ids[:cut], algorithm="table")
        out = "".join(detok.step([t]) for t in ids[cut:]) + detok.flush()
        assert out == full_of[len(ids)][len(head) :], f"cut at {cut}"


MARKERS = ["<|python_tag|>", "[TOOL_CALLS]"]


@pytest.fixture(scope="module")
def marker_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TextModel]:
    from tsfront.text.testing import make_test_model

    base = tmp_path_factory.mktemp("marker-models")
    return {
        k: TextModel.load(make_test_model(base / k, k, special_tokens=MARKERS))
        for k in ("bytelevel", "metaspace", "unigram")
    }


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("kind", ["bytelevel", "metaspace", "unigram"])
def test_kept_special_tokens_are_text_while_the_others_are_skipped(
    marker_models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    # A parser's markers (special tokens) reach it with skip_special_tokens; the others
    # (the end of turn) stay skipped: the text is the full decode of the ids less those.
    model = marker_models[kind]
    keep = model.special_ids(["<|python_tag|>"])
    (tag,) = keep
    end = model.tokenizer.token_to_id(SPECIAL[kind])
    other = model.tokenizer.token_to_id("[TOOL_CALLS]")
    rng = random.Random(f"{kind}-{algorithm}")
    for seed in range(5):
        # Markers between pieces of text (as a model writes them: between characters).
        ids = []
        for k, marker in enumerate((tag, end, other, rng.choice([tag, end, other]))):
            ids += model.encode(mixed_text(seed * 10 + k, rng.randint(3, 20)), False)
            ids.append(marker)
        ids += model.encode(mixed_text(seed * 10 + 9, 5), False)
        prompt = model.encode(mixed_text(seed + 50, 12), False)
        detok = model.detokenizer(prompt, skip_special_tokens=True, keep=keep, algorithm=algorithm)
        text, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            text.append(detok.step(ids[i : i + n]))
            i += n
        text.append(detok.flush())
        special = {i for i, t in model.tokenizer.get_added_tokens_decoder().items() if t.special}
        head = [t for t in prompt[-4:] if t not in special]
        kept = [t for t in ids if t not in special or t in keep]
        want = model.decode([*head, *kept], skip_special_tokens=False)
        want = want[len(model.decode(head, skip_special_tokens=False)) :]
        assert "".join(text) == want
        assert "<|python_tag|>" in want and "[TOOL_CALLS]" not in "".join(text)
    # Not kept, the marker is skipped as before.
    plain = model.detokenizer(None, skip_special_tokens=True, algorithm=algorithm)
    assert plain.step([tag]) + plain.flush() == ""
