"""Building the engine's own ``BatchTokenIDOut`` (shared by the harness and golden regeneration).

The engine's ``OutputProcesser.stream_output`` fills a full ``BatchTokenIDOut``
and hands it to ``MsgpackSendSocket.send_pyobj``, which slices it to the
14-element ``BatchTokenIDOutSlim``. Driving ``stream_output`` itself needs the
scheduler's ``RequestState`` machinery, so this module fills the same full
struct (same columns, same per-request shapes) from plain rows; everything
from there to the wire bytes is the engine's code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenspeed.runtime.engine.io_struct import BatchTokenIDOut


@dataclass
class OutputRow:
    """One request's slice of a frame, as ``stream_output`` computes it."""

    rid: str
    new_ids: list[int]
    #: ``BaseFinishReason.to_json()`` of the engine's finish class, or None mid-stream.
    finished_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    logprob_vals: list[float] = field(default_factory=list)
    logprob_idx: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False


def build_batch(rows: list[OutputRow], generated_time: float | None = None) -> BatchTokenIDOut:
    """The full ``BatchTokenIDOut`` for ``rows`` (columns parallel to ``rids``)."""
    n = len(rows)
    return BatchTokenIDOut(
        rids=[r.rid for r in rows],
        finished_reasons=[r.finished_reason for r in rows],
        decoded_texts=[""] * n,
        decode_ids=[[] for _ in range(n)],
        read_offsets=[0] * n,
        output_ids=[list(r.new_ids) for r in rows],
        output_multi_ids=[[] for _ in range(n)],
        skip_special_tokens=[r.skip_special_tokens for r in rows],
        spaces_between_special_tokens=[r.spaces_between_special_tokens for r in rows],
        no_stop_trim=[r.no_stop_trim for r in rows],
        prompt_tokens=[r.prompt_tokens for r in rows],
        completion_tokens=[r.completion_tokens for r in rows],
        cached_tokens=[r.cached_tokens for r in rows],
        spec_verify_ct=[],
        input_token_logprobs_val=[[] for _ in range(n)],
        input_token_logprobs_idx=[[] for _ in range(n)],
        output_token_logprobs_val=[list(r.logprob_vals) for r in rows],
        output_token_logprobs_idx=[list(r.logprob_idx) for r in rows],
        input_top_logprobs_val=[],
        input_top_logprobs_idx=[],
        output_top_logprobs_val=[],
        output_top_logprobs_idx=[],
        input_token_ids_logprobs_val=[],
        input_token_ids_logprobs_idx=[],
        output_token_ids_logprobs_val=[],
        output_token_ids_logprobs_idx=[],
        output_hidden_states=[],
        batch_accept_draft_tokens=[],
        output_extra_infos=[{} for _ in range(n)],
        generated_time=time.time() if generated_time is None else generated_time,
    )
