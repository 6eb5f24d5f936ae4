"""The request bodies of ``POST /v1/tokenize`` and ``POST /v1/detokenize``, as vLLM takes them.

``/v1/tokenize`` takes a ``prompt`` (text, encoded with the special tokens unless
``add_special_tokens`` is false) or chat ``messages`` (rendered by the chat template as
``/v1/chat/completions`` renders them, ``tools`` included; no special tokens added by
default, the template writes them) and answers ``{"tokens", "count", "max_model_len"}`` (and
``token_strs`` with ``return_token_strs``). ``/v1/detokenize`` takes ``tokens`` and answers
``{"prompt"}``: their text, special tokens kept. The routes are also served without the
``/v1`` prefix, where vLLM serves them.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["DetokenizeRequest", "TokenizeRequest"]


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/tokenize``: ``prompt``, or ``messages`` (with ``tools``)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/detokenize``: token ids back to text."""

    tokens: list[int]
    model: str | None = None
