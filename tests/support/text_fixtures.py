"""Shared helpers of the text-layer tests: mixed-script text and the test model folders."""

from __future__ import annotations

from pathlib import Path

from tsfront.text.testing import mixed_text

__all__ = [
    "LONG_TOKEN_CHARS",
    "REPLACEMENT",
    "long_token_model",
    "long_words",
    "mixed_text",
    "model_dir",
]

REPLACEMENT = "\ufffd"
#: The longest token of `long_token_model`, in characters (a real 128k-vocabulary byte-level
#: BPE's longest tokens are runs of 128 characters).
LONG_TOKEN_CHARS = 128


def model_dir(base: Path, kind: str) -> Path:
    """A test model folder of ``kind`` under ``base`` (made once per base)."""
    from tsfront.text.testing import make_test_model

    folder = base / kind
    if not (folder / "tokenizer.json").exists():
        make_test_model(folder, kind)
    return folder


def long_words() -> list[str]:
    """Four words of `LONG_TOKEN_CHARS` letters, each one token of `long_token_model` (or
    two, after a space): text of them is ~100 characters a token, and encoding it costs
    what a real tokenizer's longest tokens cost (tens of microseconds a token)."""
    return [
        "".join(chr(ord("a") + (i * 7 + j * 3) % 26) for j in range(LONG_TOKEN_CHARS))
        for i in range(4)
    ]


def long_token_model(directory: Path, context: int) -> Path:
    """A model folder like ``make_test_model(directory, "bytelevel")`` (Llama-3's special
    tokens and template, a ``context``-token context) whose byte-level BPE also learned the
    `long_words`: its longest token is `LONG_TOKEN_CHARS` characters, as a real 128k
    vocabulary's is, so the server's character bounds (context x longest token) and the cost
    of encoding and decoding text at those bounds are a real model's."""
    import tokenizers as tk

    from tsfront.text.testing import CORPUS, LLAMA3_SPECIALS, make_test_model

    folder = make_test_model(directory, "bytelevel", max_position_embeddings=context)
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=LLAMA3_SPECIALS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*CORPUS, *[" ".join(long_words())] * 50], trainer)
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
    )
    # The special tokens come first, in the same order: the configs' ids stay right.
    tok.save(str(folder / "tokenizer.json"))
    return folder
