"""The engine's ``SamplingParams``: a positional msgpack array nested in every ADD request.

Field order, types and defaults are the engine's (tokenspeed 0.1.1): declaration order IS the
wire layout, so never reorder, only append. Unlike the engine's class this one has no
``__post_init__``: we send exactly what the caller set and the engine normalises on decode
(greedy rewrite, ``top_k=-1`` rewrite, seed from rid, stop-string bookkeeping).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["SamplingParams"]


class SamplingParams(msgspec.Struct, array_like=True, kw_only=True):
    """Sampling knobs of one request, encoded as a 29-element array (every field defaulted).

    Validity rules (what the engine aborts on) are in :func:`tsfront.wire.validate_request`.
    ``stop`` / ``stop_strs`` exist for layout fidelity only: the frontend matches stop strings
    itself and sends ``stop_token_ids``. ``stop_token_ids`` is a list here (the engine decodes
    it into a set; the msgpack array is the same).
    """

    max_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    thinking_budget: int | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    # Keys are decimal token-id strings: the engine decodes dict[str, float] (int keys drop).
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    logprobs: int | None = None
    n: int = 1
    # Engine-internal fields (filled by its normalize()); always send the defaults.
    stop_strs: str | list[str] | None = None
    stop_str_max_len: int = 0
    is_normalized: bool = False
