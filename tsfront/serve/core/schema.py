"""The OpenAI request bodies the server accepts, as msgspec structs (decoded in one C pass).

Unknown fields are ignored, as OpenAI's own server does for fields it does not know; fields
the server knows but cannot honour are refused by `tsfront.serve.core.service` with a 400 that names
them. Types are checked by the decoder, whose message says where (``Expected `int`, got
`str` - at `$.max_tokens```).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["ChatRequest", "CompletionRequest", "StreamOptions"]


class StreamOptions(msgspec.Struct, kw_only=True):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    """Fields shared by both endpoints."""

    model: str | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    #: Structured outputs (tsfront.serve.core.structured): OpenAI's and vLLM's.
    response_format: Any = None
    structured_outputs: Any = None
    #: vLLM's older names of structured outputs (tsfront.serve.core.structured.GUIDED_FIELDS), and
    #: two it had that are refused: checked there, so their refusals say what to send.
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    # Known but not supported: refused with a 400 when set.
    best_of: int | None = None


class CompletionRequest(_Sampling, kw_only=True):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a list of either."""

    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    """``POST /v1/chat/completions``: ``messages`` rendered by the model's chat template."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    #: gpt-oss's (Harmony) reasoning effort: low, medium, high (minimal reads as low).
    reasoning_effort: str | None = None
