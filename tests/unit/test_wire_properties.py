"""Property tests: codecs round-trip arbitrary valid values; decoders fail only one way."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront.errors import InvalidRequest, WireDecodeError
from tsfront.wire import (
    ENGINE_DEAD,
    BatchTokenIDOutSlim,
    SamplingParams,
    SessionParams,
    TokenizedGenerateReqInput,
    decode_abort,
    decode_add,
    decode_init,
    decode_output,
    decode_ready_message,
    decode_registration,
    encode_abort,
    encode_add,
    encode_output,
    identity_index,
    validate_request,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "golden_vectors.json").read_text())
GOLDEN_PAYLOADS = [bytes.fromhex(v["hex"]) for k, v in GOLDEN.items() if k != "_meta"]

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u32 = st.integers(min_value=0, max_value=2**32 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
floats = st.floats(allow_nan=False, width=64)
text = st.text(max_size=12)
token_ids = st.lists(u32, max_size=12)


def opt(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | strategy


sampling_params = st.builds(
    SamplingParams,
    max_new_tokens=opt(u32),
    stop=opt(st.one_of(text, st.lists(text, max_size=3))),
    stop_token_ids=opt(token_ids),
    temperature=floats,
    top_p=floats,
    top_k=i64,
    min_p=floats,
    frequency_penalty=floats,
    presence_penalty=floats,
    repetition_penalty=floats,
    min_new_tokens=i64,
    json_schema=opt(text),
    regex=opt(text),
    ebnf=opt(text),
    structural_tag=opt(text),
    ignore_eos=st.booleans(),
    skip_special_tokens=st.booleans(),
    spaces_between_special_tokens=st.booleans(),
    no_stop_trim=st.booleans(),
    thinking_budget=opt(i64),
    custom_params=opt(st.dictionaries(text, st.one_of(i64, text, st.booleans()), max_size=3)),
    stream_interval=opt(i64),
    logit_bias=opt(st.dictionaries(u32.map(str), floats, max_size=3)),
    seed=opt(i64),
    logprobs=opt(i64),
    n=i64,
    stop_strs=opt(st.lists(text, max_size=2)),
    stop_str_max_len=i64,
    is_normalized=st.booleans(),
)

requests = st.builds(
    TokenizedGenerateReqInput,
    rid=text,
    http_worker_ipc=opt(text),
    input_text=opt(text),
    input_ids=opt(token_ids),
    sampling_params=sampling_params,
    return_logprob=st.booleans(),
    logprob_start_len=i64,
    top_logprobs_num=i64,
    token_ids_logprob=opt(token_ids),
    stream=st.booleans(),
    input_embeds=opt(st.lists(st.lists(floats, max_size=3), max_size=2)),
    session_params=opt(st.builds(SessionParams, id=opt(text), offset=opt(i64))),
    custom_logit_processor=opt(text),
    return_hidden_states=st.booleans(),
    created_time=floats,
    bootstrap_host=opt(text),
    bootstrap_port=opt(u32),
    bootstrap_room=opt(i64),
    input_multi_ids=opt(st.lists(token_ids, max_size=2)),
    input_extra_infos=opt(st.lists(st.dictionaries(text, i64, max_size=2), max_size=2)),
    input_ids_unpadded=opt(token_ids),
    multimodal_inputs=opt(st.lists(st.one_of(text, i64), max_size=3)),
    validation_error=opt(text),
    data_parallel_rank=opt(u32),
)


@st.composite
def batches(draw) -> BatchTokenIDOutSlim:
    n = draw(st.integers(min_value=0, max_value=6))

    def column(elements):
        return draw(st.lists(elements, min_size=n, max_size=n))

    # Output ids are int32; a row's logprob lists are empty or as long as its ids.
    ids = column(st.lists(i32, max_size=12))
    lp = [draw(st.booleans()) for _ in ids]
    return BatchTokenIDOutSlim(
        rids=column(text),
        output_ids=ids,
        finished_reasons=column(st.sampled_from(["", "stop", "length", "abort"])),
        prompt_tokens=column(u32),
        completion_tokens=column(u32),
        cached_tokens=column(u32),
        output_token_logprobs_val=[
            draw(st.lists(floats, min_size=len(x), max_size=len(x))) if on else []
            for x, on in zip(ids, lp, strict=True)
        ],
        output_token_logprobs_idx=[
            draw(st.lists(i32, min_size=len(x), max_size=len(x))) if on else []
            for x, on in zip(ids, lp, strict=True)
        ],
        engine_index=draw(st.integers(0, 65535)),
        num_running=draw(u32),
        num_waiting=draw(u32),
        kv_active_pages=draw(u32),
        kv_total_pages=draw(u32),
    )


@FAST
@given(requests)
def test_add_round_trips_for_arbitrary_requests(req):
    encoded = encode_add(req)
    assert decode_add(encoded) == req
    assert len(msgspec.msgpack.decode(encoded)) == 25


@FAST
@given(st.lists(text, max_size=8))
def test_abort_round_trips(rids):
    assert decode_abort(encode_abort(rids)) == rids


@FAST
@given(batches(), st.sampled_from([9, 10, 14, 15, 20]))
def test_output_round_trips_for_every_form(batch, form):
    decoded = decode_output(encode_output(batch, form=form))
    expected = batch
    if form < 14:
        expected = msgspec.structs.replace(
            batch, num_running=0, num_waiting=0, kv_active_pages=0, kv_total_pages=0
        )
    if form < 10:
        expected = msgspec.structs.replace(expected, engine_index=0)
    assert decoded == expected


DECODERS = [
    decode_output,
    decode_add,
    decode_abort,
    decode_ready_message,
    decode_init,
    decode_registration,
    identity_index,
]


def assert_fails_only_as_wire_decode_error(decoder, data: bytes) -> None:
    try:
        result = decoder(data)
    except WireDecodeError:
        return
    if decoder is decode_output:
        assert result is ENGINE_DEAD or isinstance(result, BatchTokenIDOutSlim)


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_raise_only_wire_decode_error(decoder, data):
    assert_fails_only_as_wire_decode_error(decoder, data)


@st.composite
def mutated_golden(draw) -> bytes:
    # Random bytes rarely get past the msgpack header; mutations of real frames reach the
    # typed field checks.
    data = bytearray(draw(st.sampled_from(GOLDEN_PAYLOADS)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) if draw(st.booleans()) else bytes(data)


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda d: d.__name__)
@settings(max_examples=150, deadline=None)
@given(data=mutated_golden())
def test_mutated_golden_frames_raise_only_wire_decode_error(decoder, data):
    assert_fails_only_as_wire_decode_error(decoder, data)


junk = st.one_of(
    st.none(), st.booleans(), i64, st.floats(), text, st.lists(i64, max_size=2), st.just({1: 2})
)
REQUEST_FIELDS = [f for f in msgspec.structs.fields(TokenizedGenerateReqInput) if f.name != "rid"]
SAMPLING_FIELDS = list(msgspec.structs.fields(SamplingParams))


@st.composite
def loosely_typed_requests(draw) -> TokenizedGenerateReqInput:
    # Mostly plausible requests with a few fields replaced by values of any type.
    sp = draw(st.builds(SamplingParams, top_p=st.floats(0.1, 1.0), top_k=st.just(-1)))
    req = TokenizedGenerateReqInput(rid=draw(text), input_ids=draw(token_ids), sampling_params=sp)
    for field in draw(st.lists(st.sampled_from(SAMPLING_FIELDS), max_size=2)):
        sp = msgspec.structs.replace(sp, **{field.name: draw(junk)})
    changes = {
        f.name: draw(junk) for f in draw(st.lists(st.sampled_from(REQUEST_FIELDS), max_size=2))
    }
    changes.setdefault("sampling_params", sp)
    return msgspec.structs.replace(req, **changes)


@settings(max_examples=300, deadline=None)
@given(loosely_typed_requests())
def test_validate_raises_only_invalid_request_and_what_it_accepts_the_engine_decodes(req):
    try:
        validate_request(req, max_model_len=64, enable_output_logprobs=True)
    except InvalidRequest:
        return
    # Accepted means the engine's typed decode succeeds (an int sent for a float field comes
    # back as a float, and NaN never equals itself, so compare the fields that must survive).
    decoded = decode_add(encode_add(req))
    assert (decoded.rid, decoded.input_ids) == (req.rid, req.input_ids)
