"""Model and tokenizer folders named by a Hugging Face id, through ``huggingface_hub``.

`local_folder` takes what a user passes as ``--model`` or ``--tokenizer`` (as vLLM does): a
folder is used as it is; anything else that is a Hugging Face repository id (``Qwen/Qwen3-8B``)
is looked up with ``huggingface_hub.snapshot_download``, restricted to the files the text
layer reads (`TEXT_FILES`: the tokenizer, the chat template, the configs; never the
weights, which the engines load). It keeps Hugging Face's own rules: its cache
(``HF_HUB_CACHE``, ``HF_HOME``) is where the files go and are found, ``HF_HUB_OFFLINE=1`` uses
only that cache, a Hub that cannot be reached falls back to it, and ``HF_TOKEN`` reaches
gated repositories. What cannot be found is one `TokenizerNotFound` line saying what to do.
"""

from __future__ import annotations

import os
from pathlib import Path

from tsfront.text._deps import require
from tsfront.text.errors import TokenizerNotFound

__all__ = ["TEXT_FILES", "local_folder"]

#: The files of a repository the text layer reads (`tsfront.text.model`): all it fetches.
TEXT_FILES = (
    "tokenizer.json",
    "tekken.json",
    "tiktoken.model",
    "tokenization_*.py",  # read for a tiktoken.model's split pattern, never run
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "generation_config.json",
)


def local_folder(name: str | os.PathLike[str]) -> tuple[Path, bool]:
    """The local folder of ``name`` (a folder, or a Hugging Face id, fetched into or found in
    its cache) and whether it came from the Hub; raises `TokenizerNotFound`."""
    path = Path(name)
    if path.is_dir():
        return path, False
    text = os.fspath(name)
    if not _is_repo_id(text):
        raise TokenizerNotFound(
            f"{text} is not a directory: pass the folder of a model (with tokenizer.json) or a "
            "Hugging Face id (ORG/NAME)"
        )
    hub = require("huggingface_hub")
    errors = require("huggingface_hub.errors")
    constants = require("huggingface_hub.constants")  # read from the environment at import
    cache = constants.HF_HUB_CACHE
    get = (
        f"fetch it where the Hub is reachable (hf download {text} --include '*.json' "
        f"'*.jinja'), point HF_HUB_CACHE at a cache that holds it, or pass its folder"
    )
    try:
        return Path(hub.snapshot_download(text, allow_patterns=list(TEXT_FILES))), True
    except errors.LocalEntryNotFoundError as exc:
        if constants.HF_HUB_OFFLINE:
            why = "HF_HUB_OFFLINE=1 forbids downloading it"
        else:
            why = f"the Hub could not be reached ({_first_line(exc)})"
        raise TokenizerNotFound(
            f"{text} is neither a folder nor in the Hugging Face cache ({cache}), and {why}: {get}"
        ) from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as exc:
        raise TokenizerNotFound(
            f"{text}: the Hugging Face Hub refused it ({_first_line(exc)}); check the id, and "
            "for a gated or private repository set HF_TOKEN (or run hf auth login)"
        ) from None
    except (errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise TokenizerNotFound(
            f"{text} could not be fetched from the Hugging Face Hub "
            f"({type(exc).__name__}: {_first_line(exc)}): {get}"
        ) from None


def _is_repo_id(text: str) -> bool:
    """Whether ``text`` has the shape of a Hugging Face repository id (``NAME`` or
    ``ORG/NAME``: letters, digits, ``-``, ``_``, ``.``), not that of a path."""
    if text.startswith(("/", ".", "~")) or text.endswith("/") or text.count("/") > 1:
        return False
    validators = require("huggingface_hub.utils")
    try:
        validators.validate_repo_id(text)
    except ValueError:  # HFValidationError
        return False
    return True


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
