"""Benchmarks of the tsfront.wire hot paths: output decode, ADD encode, request validation.

Run: ``.venv/bin/python -m pytest tsfront/bench/micro -q``.
"""

from __future__ import annotations

import uuid

import pytest

from tsfront.wire import (
    BatchTokenIDOutSlim,
    SamplingParams,
    TokenizedGenerateReqInput,
    decode_output,
    encode_add,
    encode_output,
    validate_request,
)

BATCH_ROWS = 256
PROMPT_TOKENS = 1024


@pytest.fixture(scope="module")
def output_frame() -> bytes:
    """A 0.1.1 (14-element) frame of 256 running requests, one new token each."""
    rids = [uuid.uuid4().hex for _ in range(BATCH_ROWS)]
    batch = BatchTokenIDOutSlim(
        rids=rids,
        output_ids=[[1000 + i] for i in range(BATCH_ROWS)],
        finished_reasons=[""] * BATCH_ROWS,
        prompt_tokens=[PROMPT_TOKENS] * BATCH_ROWS,
        completion_tokens=[17] * BATCH_ROWS,
        cached_tokens=[512] * BATCH_ROWS,
        output_token_logprobs_val=[[] for _ in range(BATCH_ROWS)],
        output_token_logprobs_idx=[[] for _ in range(BATCH_ROWS)],
        engine_index=1,
        num_running=BATCH_ROWS,
        num_waiting=3,
        kv_active_pages=4000,
        kv_total_pages=16384,
    )
    return encode_output(batch, form=14)


@pytest.fixture(scope="module")
def request_1k() -> TokenizedGenerateReqInput:
    """A realistic request: 1,024 prompt tokens, sampling knobs set, one stop token."""
    sp = SamplingParams(
        max_new_tokens=512, temperature=0.7, top_p=0.95, top_k=50, stop_token_ids=[151645]
    )
    return TokenizedGenerateReqInput(
        rid=uuid.uuid4().hex,
        input_ids=list(range(10_000, 10_000 + PROMPT_TOKENS)),
        stream=True,
        sampling_params=sp,
    )


def test_decode_output_256_rows(benchmark, output_frame):
    batch = benchmark(decode_output, output_frame)
    assert len(batch.rids) == BATCH_ROWS


def test_encode_add_1024_tokens(benchmark, request_1k):
    payload = benchmark(encode_add, request_1k)
    assert len(payload) > PROMPT_TOKENS


def test_validate_request_1024_tokens(benchmark, request_1k):
    benchmark(validate_request, request_1k, max_model_len=32768, enable_output_logprobs=True)
