"""validate_request refuses what the engine would abort, drop or die on, naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tsfront.errors import InvalidRequest, PromptTooLong, StopStringsRefused
from tsfront.wire import SamplingParams, SessionParams, TokenizedGenerateReqInput, validate_request


def make(*, sp: dict[str, Any] | None = None, **fields: Any) -> TokenizedGenerateReqInput:
    base: dict[str, Any] = {"rid": "0f3a9c", "input_ids": [1, 2, 3, 4], "stream": True}
    base.update(fields)
    return TokenizedGenerateReqInput(sampling_params=SamplingParams(**(sp or {})), **base)


VALID = [
    pytest.param(make(), id="defaults"),
    pytest.param(make(sp={"max_new_tokens": 0}), id="max-new-0"),
    pytest.param(make(sp={"temperature": 0.0, "top_k": 0}), id="greedy-overrides-top-k"),
    pytest.param(make(sp={"temperature": -1.0}), id="negative-temperature-is-greedy"),
    pytest.param(make(sp={"top_k": 127, "top_p": 1e-9, "min_p": 1.0}), id="range-edges"),
    pytest.param(
        make(sp={"frequency_penalty": -2, "presence_penalty": 2.0, "repetition_penalty": 0.0}),
        id="penalty-edges-and-int-for-float",
    ),
    pytest.param(make(sp={"min_new_tokens": 5, "max_new_tokens": 5}), id="min-equals-max"),
    pytest.param(make(sp={"stop": [], "stop_strs": []}), id="empty-stop-lists"),
    pytest.param(make(sp={"stop_token_ids": [2, 151645]}), id="stop-token-ids"),
    pytest.param(make(sp={"logit_bias": {"42": -100.0, "7": 3}}), id="logit-bias"),
    pytest.param(make(sp={"json_schema": "{}", "structural_tag": "x"}), id="one-grammar"),
    pytest.param(make(sp={"logprobs": 0, "seed": 7, "stream_interval": 4}), id="logprobs-0"),
    pytest.param(make(return_logprob=True), id="logprobs-start-default"),
    pytest.param(make(return_logprob=True, logprob_start_len=3), id="logprobs-start-len-minus-1"),
    pytest.param(make(return_logprob=False, logprob_start_len=0), id="start-ignored-without-lp"),
    pytest.param(make(session_params=SessionParams()), id="empty-session"),
    pytest.param(
        make(sp={"seed": (1 << 63) - 1, "stop_token_ids": [(1 << 31) - 1]}), id="int64-int32-edges"
    ),
    pytest.param(
        make(sp={"seed": -(1 << 63), "top_k": 1 << 40, "temperature": 0}), id="greedy-big-k"
    ),
    pytest.param(make(data_parallel_rank=1, bootstrap_room=9), id="dp-rank"),
]


@pytest.mark.parametrize("req", VALID)
def test_valid_requests_pass(req):
    validate_request(req, max_model_len=4096, enable_output_logprobs=True)


REFUSED = [
    # (request, exception type, field, validate_request kwargs)
    (make(rid=""), InvalidRequest, "rid", {}),
    (make(rid=b"r1"), InvalidRequest, "rid", {}),
    (make(input_ids=None), InvalidRequest, "input_ids", {}),
    (make(input_ids=[]), InvalidRequest, "input_ids", {}),
    (make(input_ids=(1, 2)), InvalidRequest, "input_ids", {}),
    (make(input_ids=[1, -2]), InvalidRequest, "input_ids", {}),
    (make(input_ids=[1, 2.0]), InvalidRequest, "input_ids", {}),
    (make(input_ids=[1, True]), InvalidRequest, "input_ids", {}),
    (make(input_embeds=[[0.1]]), InvalidRequest, "input_embeds", {}),
    (make(validation_error="bad"), InvalidRequest, "validation_error", {}),
    (make(session_params=SessionParams(id="s")), InvalidRequest, "session_params.id", {}),
    (make(stream=1), InvalidRequest, "stream", {}),
    (make(created_time="now"), InvalidRequest, "created_time", {}),
    (make(bootstrap_port="8998"), InvalidRequest, "bootstrap_port", {}),
    (
        make(return_logprob=True),
        InvalidRequest,
        "return_logprob",
        {"enable_output_logprobs": False},
    ),
    (make(return_logprob=True, top_logprobs_num=5), InvalidRequest, "top_logprobs_num", {}),
    (make(return_logprob=True, token_ids_logprob=[3]), InvalidRequest, "token_ids_logprob", {}),
    (make(return_logprob=True, logprob_start_len=0), InvalidRequest, "logprob_start_len", {}),
    (make(return_logprob=True, logprob_start_len=4), InvalidRequest, "logprob_start_len", {}),
    (make(return_logprob=True, logprob_start_len=-2), InvalidRequest, "logprob_start_len", {}),
    (make(sp={"stop": ["\n\n"]}), StopStringsRefused, "sampling_params.stop", {}),
    (make(sp={"stop": "END"}), StopStringsRefused, "sampling_params.stop", {}),
    (make(sp={"stop": ""}), StopStringsRefused, "sampling_params.stop", {}),
    (make(sp={"stop_strs": ["x"]}), StopStringsRefused, "sampling_params.stop_strs", {}),
    (make(sp={"n": 2}), InvalidRequest, "sampling_params.n", {}),
    (make(sp={"n": 0}), InvalidRequest, "sampling_params.n", {}),
    (make(sp={"top_p": 0.0}), InvalidRequest, "sampling_params.top_p", {}),
    (make(sp={"top_p": 1.5}), InvalidRequest, "sampling_params.top_p", {}),
    (make(sp={"top_p": float("nan")}), InvalidRequest, "sampling_params.top_p", {}),
    (make(sp={"top_k": 0}), InvalidRequest, "sampling_params.top_k", {}),
    (make(sp={"top_k": -2}), InvalidRequest, "sampling_params.top_k", {}),
    (make(sp={"top_k": 128}), InvalidRequest, "sampling_params.top_k", {}),
    (make(sp={"top_k": 5.0}), InvalidRequest, "sampling_params.top_k", {}),
    (make(sp={"min_p": -0.1}), InvalidRequest, "sampling_params.min_p", {}),
    (make(sp={"min_p": 1.1}), InvalidRequest, "sampling_params.min_p", {}),
    (make(sp={"frequency_penalty": 2.5}), InvalidRequest, "sampling_params.frequency_penalty", {}),
    (make(sp={"presence_penalty": -3}), InvalidRequest, "sampling_params.presence_penalty", {}),
    (
        make(sp={"repetition_penalty": -0.1}),
        InvalidRequest,
        "sampling_params.repetition_penalty",
        {},
    ),
    (
        make(sp={"repetition_penalty": 2.1}),
        InvalidRequest,
        "sampling_params.repetition_penalty",
        {},
    ),
    (make(sp={"temperature": True}), InvalidRequest, "sampling_params.temperature", {}),
    (make(sp={"min_new_tokens": -1}), InvalidRequest, "sampling_params.min_new_tokens", {}),
    (
        make(sp={"min_new_tokens": 9, "max_new_tokens": 8}),
        InvalidRequest,
        "sampling_params.min_new_tokens",
        {},
    ),
    (make(sp={"max_new_tokens": -1}), InvalidRequest, "sampling_params.max_new_tokens", {}),
    (make(sp={"max_new_tokens": 8.0}), InvalidRequest, "sampling_params.max_new_tokens", {}),
    (
        make(sp={"json_schema": "{}", "regex": "a+"}),
        InvalidRequest,
        "sampling_params.json_schema",
        {},
    ),
    (make(sp={"regex": "a", "ebnf": "b"}), InvalidRequest, "sampling_params.json_schema", {}),
    (make(sp={"logit_bias": {42: 1.0}}), InvalidRequest, "sampling_params.logit_bias", {}),
    (make(sp={"logit_bias": {"-1": 1.0}}), InvalidRequest, "sampling_params.logit_bias", {}),
    (make(sp={"logit_bias": {"abc": 1.0}}), InvalidRequest, "sampling_params.logit_bias", {}),
    (make(sp={"logit_bias": {"5": "big"}}), InvalidRequest, "sampling_params.logit_bias", {}),
    (make(sp={"logprobs": 1}), InvalidRequest, "sampling_params.logprobs", {}),
    (make(sp={"logprobs": -1}), InvalidRequest, "sampling_params.logprobs", {}),
    (make(sp={"stop_token_ids": [2, "3"]}), InvalidRequest, "sampling_params.stop_token_ids", {}),
    (make(sp={"stream_interval": 0}), InvalidRequest, "sampling_params.stream_interval", {}),
    (make(sp={"ignore_eos": 1}), InvalidRequest, "sampling_params.ignore_eos", {}),
    (make(sp={"seed": "42"}), InvalidRequest, "sampling_params.seed", {}),
    (make(sp={"custom_params": {1: 2}}), InvalidRequest, "sampling_params.custom_params", {}),
    (make(sp={"is_normalized": True}), InvalidRequest, "sampling_params.is_normalized", {}),
    # Integers past what msgpack or the engine's int64 holds (encode_add raised OverflowError).
    (make(sp={"seed": 1 << 64}), InvalidRequest, "sampling_params.seed", {}),
    (make(sp={"seed": 1 << 63}), InvalidRequest, "sampling_params.seed", {}),
    (make(sp={"seed": -(1 << 63) - 1}), InvalidRequest, "sampling_params.seed", {}),
    (make(sp={"top_k": 1 << 70, "temperature": 0.0}), InvalidRequest, "sampling_params.top_k", {}),
    (make(sp={"stop_token_ids": [1 << 64]}), InvalidRequest, "sampling_params.stop_token_ids", {}),
    (make(sp={"stop_token_ids": [1 << 31]}), InvalidRequest, "sampling_params.stop_token_ids", {}),
    (make(sp={"stop_token_ids": [-1]}), InvalidRequest, "sampling_params.stop_token_ids", {}),
    (make(sp={"max_new_tokens": 1 << 64}), InvalidRequest, "sampling_params.max_new_tokens", {}),
    (make(sp={"min_new_tokens": 1 << 64}), InvalidRequest, "sampling_params.min_new_tokens", {}),
    (make(sp={"logit_bias": {"9" * 20: 1.0}}), InvalidRequest, "sampling_params.logit_bias", {}),
    (make(sp={"thinking_budget": 1 << 64}), InvalidRequest, "sampling_params.thinking_budget", {}),
    (make(sp={"stream_interval": 1 << 64}), InvalidRequest, "sampling_params.stream_interval", {}),
    (make(sp={"temperature": float("nan")}), InvalidRequest, "sampling_params.temperature", {}),
    (make(sp={"temperature": float("inf")}), InvalidRequest, "sampling_params.temperature", {}),
    (make(bootstrap_room=1 << 64), InvalidRequest, "bootstrap_room", {}),
    (make(logprob_start_len=-(1 << 64)), InvalidRequest, "logprob_start_len", {}),
    (make(top_logprobs_num=1 << 63), InvalidRequest, "top_logprobs_num", {}),
    (make(bootstrap_port=-(1 << 63) - 1), InvalidRequest, "bootstrap_port", {}),
    (make(data_parallel_rank=1 << 64), InvalidRequest, "data_parallel_rank", {}),
    (
        make(sp={"stop_str_max_len": 1 << 63}),
        InvalidRequest,
        "sampling_params.stop_str_max_len",
        {},
    ),
    (make(input_ids=list(range(99))), PromptTooLong, "input_ids", {"max_model_len": 100}),
    (
        make(input_ids=list(range(90)), sp={"max_new_tokens": 9}),
        PromptTooLong,
        "sampling_params.max_new_tokens",
        {"max_model_len": 100},
    ),
]


@pytest.mark.parametrize(
    ("req", "error", "field", "kwargs"),
    REFUSED,
    ids=[f"{case[2]}-{i}" for i, case in enumerate(REFUSED)],
)
def test_each_refusal_rule_raises_its_type_naming_the_field(req, error, field, kwargs):
    with pytest.raises(error) as info:
        validate_request(req, **kwargs)
    exc = info.value
    assert type(exc) is error
    assert exc.field == field
    assert exc.rule and exc.fix
    assert field in str(exc)


def test_sampling_params_sent_as_a_dict_is_refused():
    req = msgspec.structs.replace(make(), sampling_params={"top_p": 0.5})
    with pytest.raises(InvalidRequest) as info:
        validate_request(req)
    assert info.value.field == "sampling_params"


def test_refusal_carries_the_offending_value():
    with pytest.raises(InvalidRequest) as info:
        validate_request(make(sp={"top_p": 1.5}))
    assert info.value.value == 1.5


def test_length_limit_is_exactly_max_model_len_minus_two():
    validate_request(make(input_ids=list(range(98))), max_model_len=100)
    validate_request(make(input_ids=list(range(90)), sp={"max_new_tokens": 8}), max_model_len=100)
    validate_request(make(input_ids=list(range(98)), sp={"max_new_tokens": 0}), max_model_len=100)


def test_unknown_logprob_support_does_not_refuse_return_logprob():
    validate_request(make(return_logprob=True), enable_output_logprobs=None)


def test_validation_does_not_mutate_the_request():
    req = make(sp={"temperature": 0.0, "stop_token_ids": [2]})
    before = msgspec.msgpack.encode(req)
    validate_request(req)
    assert msgspec.msgpack.encode(req) == before
