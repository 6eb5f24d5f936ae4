"""Shared helpers of the text-layer tests: mixed-script text and the test model folders."""

from __future__ import annotations

import random
from pathlib import Path

from tsfront.text.testing import CORPUS

REPLACEMENT = "\ufffd"

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


def model_dir(base: Path, kind: str) -> Path:
    """A test model folder of ``kind`` under ``base`` (made once per base)."""
    from tsfront.text.testing import make_test_model

    folder = base / kind
    if not (folder / "tokenizer.json").exists():
        make_test_model(folder, kind)
    return folder
