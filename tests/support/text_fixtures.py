"""Shared helpers of the text-layer tests: mixed-script text and the test model folders."""

from __future__ import annotations

from pathlib import Path

from tsfront.text.testing import mixed_text

__all__ = ["REPLACEMENT", "mixed_text", "model_dir"]

REPLACEMENT = "\ufffd"


def model_dir(base: Path, kind: str) -> Path:
    """A test model folder of ``kind`` under ``base`` (made once per base)."""
    from tsfront.text.testing import make_test_model

    folder = base / kind
    if not (folder / "tokenizer.json").exists():
        make_test_model(folder, kind)
    return folder
