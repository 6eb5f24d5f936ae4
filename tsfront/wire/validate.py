"""Client-side refusal of requests the engine would abort, silently drop, or crash on.

The msgpack path of the engine has three bad outcomes for a bad request: a terminal ``abort``
with no reason on the wire, a silent drop (the stream hangs), or a dead scheduler loop. This
module refuses all of them before anything is sent, with an exception that names the field,
the value, the rule and the fix. Rules mirror tokenspeed 0.1.1 (``SamplingParams.verify``, the
msgpack ingress logprob checks, the ``n``/session/validation_error checks, and the decode type
rules); the stop-string refusal is our policy (the frontend matches stop strings itself).

It runs on every request, so it is straight-line attribute checks: no reflection, and the only
O(prompt) work is one msgspec conversion of ``input_ids``.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from tsfront._native import first_bad_token
from tsfront.errors import InvalidRequest, PromptTooLong, StopStringsRefused
from tsfront.wire.request import SessionParams, TokenizedGenerateReqInput
from tsfront.wire.sampling import SamplingParams

__all__ = ["validate_request"]

# What the engine's decoder accepts where it declares float (int is widened; bool is not).
_NUMBER = (int, float)
_INT_OR_NONE = (int, type(None))
_STR_OR_NONE = (str, type(None))
_ANY_IDS = list[int]
_ID_LISTS = list[list[int]]
_MAPS = list[dict[Any, Any]]
_BOOL_OR_NONE = (bool, type(None))
# The engine's "top_k disabled" sentinel (it rewrites -1 to this); verify() lets it through.
_TOP_K_DISABLED = 1 << 30
_TOP_K_MAX = 128
_GREEDY_EPS = 1e-6
# Integers the engine keeps as int64 (a larger one cannot even be encoded: msgpack's ints end
# at 2**64 - 1, and a value past int64 breaks the engine's tensors); token ids are int32.
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_TOKEN_ID_MAX = (1 << 31) - 1
# The engine reserves two positions of its context for every request (max_req_len = M - 1,
# then one more for the first sampled token).
_CONTEXT_RESERVE = 2


def validate_request(
    req: TokenizedGenerateReqInput,
    *,
    max_model_len: int | None = None,
    enable_output_logprobs: bool | None = None,
) -> None:
    """Raise if the engine would not serve ``req`` normally; return ``None`` if it would.

    Args:
        req: the request about to be encoded.
        max_model_len: the engine's usable context (e.g. ``min(max_model_len,
            kv_cache_size_tokens)`` from its registration), or ``None`` to skip length checks.
        enable_output_logprobs: whether the engine runs with ``--enable-output-logprobs``;
            ``None`` when unknown (then ``return_logprob`` is not refused for it).

    Raises:
        StopStringsRefused: ``stop`` or ``stop_strs`` is set.
        PromptTooLong: the prompt, or prompt plus ``max_new_tokens``, exceeds the context.
        InvalidRequest: any other rule; ``field`` is the dotted field name.
    """
    if type(req) is not TokenizedGenerateReqInput:
        raise InvalidRequest(
            "request", type(req).__name__, "must be a TokenizedGenerateReqInput",
            "build the request with tsfront.wire.TokenizedGenerateReqInput",
        )  # fmt: skip
    rid = req.rid
    if type(rid) is not str or not rid:
        raise InvalidRequest(
            "rid", rid, "must be a non-empty str (the engine drops other rids)",
            "send a fresh unique string such as uuid.uuid4().hex",
        )  # fmt: skip
    ids = req.input_ids
    if type(ids) is not list or not ids:
        raise InvalidRequest(
            "input_ids", ids, "must be a non-empty list of token ids (nil kills the engine loop)",
            "send the tokenized prompt as a list of ints",
        )  # fmt: skip
    bad = first_bad_token(ids)
    if bad >= 0:
        raise InvalidRequest(
            "input_ids", ids,
            f"must hold only non-negative int32 token ids (input_ids[{bad}]={ids[bad]!r})",
            "send token ids from the model's vocabulary as Python ints",
        )  # fmt: skip
    if req.input_embeds is not None:
        raise InvalidRequest(
            "input_embeds", req.input_embeds, "is not supported on this wire",
            "send input_ids and leave input_embeds as None",
        )  # fmt: skip
    if req.validation_error is not None:
        raise InvalidRequest(
            "validation_error", req.validation_error,
            "must be None (any value makes the engine abort the request)",
            "leave validation_error as None",
        )  # fmt: skip
    session = req.session_params
    if session is not None and (type(session) is not SessionParams or session.id is not None):
        raise InvalidRequest(
            "session_params.id", getattr(session, "id", session),
            "sessions are not supported (the engine aborts any session id)",
            "leave session_params as None",
        )  # fmt: skip
    _check_request_types(req)
    if req.return_logprob:
        _check_logprobs(req, len(ids), enable_output_logprobs)
    sp = req.sampling_params
    if type(sp) is not SamplingParams:
        raise InvalidRequest(
            "sampling_params", sp, "must be a tsfront.wire.SamplingParams",
            "pass SamplingParams(...) (the engine needs a positional array, not a map)",
        )  # fmt: skip
    _check_sampling(sp)
    if max_model_len is not None:
        _check_length(len(ids), sp.max_new_tokens, max_model_len)


def _check_request_types(req: TokenizedGenerateReqInput) -> None:
    # A type the engine's decoder rejects makes it drop the whole message silently.
    if type(req.stream) is not bool:
        _wrong_type("stream", req.stream, "a bool")
    if type(req.return_logprob) is not bool:
        _wrong_type("return_logprob", req.return_logprob, "a bool")
    if type(req.logprob_start_len) is not int:
        _wrong_type("logprob_start_len", req.logprob_start_len, "an int")
    if type(req.top_logprobs_num) is not int:
        _wrong_type("top_logprobs_num", req.top_logprobs_num, "an int")
    if type(req.return_hidden_states) is not bool:
        _wrong_type("return_hidden_states", req.return_hidden_states, "a bool")
    if type(req.created_time) not in _NUMBER:
        _wrong_type("created_time", req.created_time, "a float (unix seconds)")
    if type(req.http_worker_ipc) not in _STR_OR_NONE:
        _wrong_type("http_worker_ipc", req.http_worker_ipc, "a str or None")
    if type(req.input_text) not in _STR_OR_NONE:
        _wrong_type("input_text", req.input_text, "a str or None")
    if type(req.custom_logit_processor) not in _STR_OR_NONE:
        _wrong_type("custom_logit_processor", req.custom_logit_processor, "a str or None")
    if type(req.bootstrap_host) not in _STR_OR_NONE:
        _wrong_type("bootstrap_host", req.bootstrap_host, "a str or None")
    if type(req.bootstrap_port) not in _INT_OR_NONE:
        _wrong_type("bootstrap_port", req.bootstrap_port, "an int or None")
    if type(req.bootstrap_room) not in _INT_OR_NONE:
        _wrong_type("bootstrap_room", req.bootstrap_room, "an int or None")
    if type(req.data_parallel_rank) not in _INT_OR_NONE:
        _wrong_type("data_parallel_rank", req.data_parallel_rank, "an int or None")
    # The int64 bounds inline, `_check_int64` only to raise: a call each cost more than the
    # check (eight a request, on every submission).
    lo, hi = _INT64_MIN, _INT64_MAX
    if not lo <= req.logprob_start_len <= hi:  # ints (checked above)
        _check_int64("logprob_start_len", req.logprob_start_len)
    if not lo <= req.top_logprobs_num <= hi:
        _check_int64("top_logprobs_num", req.top_logprobs_num)
    value = req.bootstrap_port
    if value is not None and not lo <= value <= hi:
        _check_int64("bootstrap_port", value)
    value = req.bootstrap_room
    if value is not None and not lo <= value <= hi:
        _check_int64("bootstrap_room", value)
    value = req.data_parallel_rank
    if value is not None and not lo <= value <= hi:
        _check_int64("data_parallel_rank", value)
    # Rarely-set containers: a conversion check only when present (None is the usual case).
    if req.token_ids_logprob is not None:
        _check_convert("token_ids_logprob", req.token_ids_logprob, _ANY_IDS, "a list of ints")
    if req.input_ids_unpadded is not None:
        _check_convert("input_ids_unpadded", req.input_ids_unpadded, _ANY_IDS, "a list of ints")
    if req.input_multi_ids is not None:
        _check_convert("input_multi_ids", req.input_multi_ids, _ID_LISTS, "a list of int lists")
    if req.input_extra_infos is not None:
        _check_convert("input_extra_infos", req.input_extra_infos, _MAPS, "a list of dicts")
    session = req.session_params
    if session is not None:
        if type(session.rid) not in _STR_OR_NONE:
            _wrong_type("session_params.rid", session.rid, "a str or None")
        if type(session.offset) not in _INT_OR_NONE:
            _wrong_type("session_params.offset", session.offset, "an int or None")
        if type(session.replace) not in _BOOL_OR_NONE:
            _wrong_type("session_params.replace", session.replace, "a bool or None")


def _check_logprobs(
    req: TokenizedGenerateReqInput, prompt_len: int, enable_output_logprobs: bool | None
) -> None:
    if enable_output_logprobs is False:
        raise InvalidRequest(
            "return_logprob", True, "the engine runs without --enable-output-logprobs",
            "set return_logprob=False, or start the engine with --enable-output-logprobs",
        )  # fmt: skip
    if req.top_logprobs_num != 0:
        raise InvalidRequest(
            "top_logprobs_num", req.top_logprobs_num,
            "top-k output logprobs are not supported (only the sampled token's)",
            "send top_logprobs_num=0",
        )  # fmt: skip
    if req.token_ids_logprob:
        raise InvalidRequest(
            "token_ids_logprob", req.token_ids_logprob, "token-id logprobs are not supported",
            "send token_ids_logprob=None",
        )  # fmt: skip
    start = req.logprob_start_len
    if start != -1 and start != prompt_len - 1:
        raise InvalidRequest(
            "logprob_start_len", start,
            "prompt logprobs are not carried on this wire (only -1 or len(input_ids)-1)",
            "send logprob_start_len=-1",
        )  # fmt: skip


def _check_sampling(sp: SamplingParams) -> None:
    stop = sp.stop
    if stop is not None and (type(stop) is not list or stop):
        raise StopStringsRefused(
            "sampling_params.stop", stop,
            "stop strings are matched by the frontend, not sent to the engine",
            "send stop_token_ids for single-token stops and let the client match the strings",
        )  # fmt: skip
    stop = sp.stop_strs
    if stop is not None and (type(stop) is not list or stop):
        raise StopStringsRefused(
            "sampling_params.stop_strs", stop,
            "stop_strs is engine-internal; stop strings are matched by the frontend",
            "leave stop_strs as None and send stop_token_ids",
        )  # fmt: skip
    max_new = sp.max_new_tokens
    if max_new is not None and (type(max_new) is not int or not 0 <= max_new <= _INT64_MAX):
        raise InvalidRequest(
            "sampling_params.max_new_tokens", max_new, "must be None or an int in [0, 2**63)",
            "send a non-negative int that fits the context",
        )  # fmt: skip
    min_new = sp.min_new_tokens
    if (
        type(min_new) is not int
        or not 0 <= min_new <= _INT64_MAX
        or (max_new is not None and min_new > max_new)
    ):
        raise InvalidRequest(
            "sampling_params.min_new_tokens", min_new,
            "must be an int in [0, max_new_tokens]", "send 0 or at most max_new_tokens",
        )  # fmt: skip
    if sp.stop_token_ids is not None:
        _check_stop_ids(sp.stop_token_ids)
    temperature = sp.temperature
    if type(temperature) not in _NUMBER:
        _wrong_type("sampling_params.temperature", temperature, "a float")
    if not math.isfinite(temperature):
        _out_of_range("sampling_params.temperature", temperature, "finite floats", "send 0..2")
    top_p = sp.top_p
    if type(top_p) not in _NUMBER or not 0.0 < top_p <= 1.0:
        _out_of_range("sampling_params.top_p", top_p, "(0, 1]", "send 1.0 to disable top-p")
    top_k = sp.top_k
    if type(top_k) is not int:
        _wrong_type("sampling_params.top_k", top_k, "an int")
    if not _INT64_MIN <= top_k <= _INT64_MAX:
        _out_of_range("sampling_params.top_k", top_k, "[-2**63, 2**63)", "send -1 to disable top-k")
    # The engine forces top_k=1 for near-zero temperature before verify(), so any top_k passes.
    if (
        not temperature < _GREEDY_EPS
        and top_k != -1
        and top_k != _TOP_K_DISABLED
        and not 1 <= top_k < _TOP_K_MAX
    ):
        _out_of_range("sampling_params.top_k", top_k, "-1 or 1..127", "send -1 to disable top-k")
    min_p = sp.min_p
    if type(min_p) not in _NUMBER or not 0.0 <= min_p <= 1.0:
        _out_of_range("sampling_params.min_p", min_p, "[0, 1]", "send 0.0 to disable min-p")
    penalty = sp.frequency_penalty
    if type(penalty) not in _NUMBER or not -2.0 <= penalty <= 2.0:
        _out_of_range("sampling_params.frequency_penalty", penalty, "[-2, 2]", "send 0.0")
    penalty = sp.presence_penalty
    if type(penalty) not in _NUMBER or not -2.0 <= penalty <= 2.0:
        _out_of_range("sampling_params.presence_penalty", penalty, "[-2, 2]", "send 0.0")
    penalty = sp.repetition_penalty
    if type(penalty) not in _NUMBER or not 0.0 <= penalty <= 2.0:
        _out_of_range("sampling_params.repetition_penalty", penalty, "[0, 2]", "send 1.0")
    if type(sp.json_schema) not in _STR_OR_NONE:
        _wrong_type("sampling_params.json_schema", sp.json_schema, "a str or None")
    if type(sp.regex) not in _STR_OR_NONE:
        _wrong_type("sampling_params.regex", sp.regex, "a str or None")
    if type(sp.ebnf) not in _STR_OR_NONE:
        _wrong_type("sampling_params.ebnf", sp.ebnf, "a str or None")
    if type(sp.structural_tag) not in _STR_OR_NONE:
        _wrong_type("sampling_params.structural_tag", sp.structural_tag, "a str or None")
    if (sp.json_schema is not None) + (sp.regex is not None) + (sp.ebnf is not None) > 1:
        raise InvalidRequest(
            "sampling_params.json_schema", (sp.json_schema, sp.regex, sp.ebnf),
            "at most one of json_schema, regex and ebnf may be set",
            "send a single grammar",
        )  # fmt: skip
    if type(sp.ignore_eos) is not bool:
        _wrong_type("sampling_params.ignore_eos", sp.ignore_eos, "a bool")
    if type(sp.skip_special_tokens) is not bool:
        _wrong_type("sampling_params.skip_special_tokens", sp.skip_special_tokens, "a bool")
    if type(sp.spaces_between_special_tokens) is not bool:
        _wrong_type(
            "sampling_params.spaces_between_special_tokens",
            sp.spaces_between_special_tokens,
            "a bool",
        )
    if type(sp.no_stop_trim) is not bool:
        _wrong_type("sampling_params.no_stop_trim", sp.no_stop_trim, "a bool")
    if type(sp.thinking_budget) not in _INT_OR_NONE:
        _wrong_type("sampling_params.thinking_budget", sp.thinking_budget, "an int or None")
    value = sp.thinking_budget
    if value is not None and not _INT64_MIN <= value <= _INT64_MAX:  # (inline: see above)
        _check_int64("sampling_params.thinking_budget", value)
    custom = sp.custom_params
    if custom is not None and (type(custom) is not dict or not all(type(k) is str for k in custom)):
        _wrong_type("sampling_params.custom_params", custom, "a dict with str keys or None")
    interval = sp.stream_interval
    if interval is not None and (type(interval) is not int or not 1 <= interval <= _INT64_MAX):
        # Not in verify(): 0 makes the engine's output loop divide by zero and die.
        _out_of_range(
            "sampling_params.stream_interval", interval, "None or an int >= 1",
            "send None for the engine's --stream-interval",
        )  # fmt: skip
    bias = sp.logit_bias
    if bias is not None:
        _check_logit_bias(bias)
    if type(sp.seed) not in _INT_OR_NONE:
        _wrong_type("sampling_params.seed", sp.seed, "an int or None")
    value = sp.seed
    if value is not None and not _INT64_MIN <= value <= _INT64_MAX:  # (inline: see above)
        _check_int64("sampling_params.seed", value)
    logprobs = sp.logprobs
    if logprobs is not None and (type(logprobs) is not int or logprobs != 0):
        raise InvalidRequest(
            "sampling_params.logprobs", logprobs,
            "only None or 0 (the sampled token) is supported",
            "send None; request logprobs with return_logprob=True",
        )  # fmt: skip
    if type(sp.n) is not int or sp.n != 1:
        raise InvalidRequest(
            "sampling_params.n", sp.n, "must be 1 (the engine does not fan out)",
            "send n=1 and submit n separate requests",
        )  # fmt: skip
    if type(sp.stop_str_max_len) is not int:
        _wrong_type("sampling_params.stop_str_max_len", sp.stop_str_max_len, "an int (0)")
    if not _INT64_MIN <= sp.stop_str_max_len <= _INT64_MAX:  # an int (checked above)
        _check_int64("sampling_params.stop_str_max_len", sp.stop_str_max_len)
    if sp.is_normalized is not False:
        raise InvalidRequest(
            "sampling_params.is_normalized", sp.is_normalized,
            "must be False (True skips the engine's normalisation, e.g. top_k=-1 reaches kernels)",
            "leave is_normalized=False",
        )  # fmt: skip


def _check_logit_bias(bias: Any) -> None:
    if type(bias) is not dict:
        _wrong_type("sampling_params.logit_bias", bias, "a dict of token-id str to float")
    for key, value in bias.items():
        # The engine does int(key) and requires 0 <= id < vocab; the vocab is unknown here.
        if type(key) is not str or not key.isdecimal():
            raise InvalidRequest(
                "sampling_params.logit_bias", key,
                "keys must be decimal token-id strings (int keys make the engine drop it)",
                'send keys like "1234"',
            )  # fmt: skip
        if len(key) > 10 or int(key) > _TOKEN_ID_MAX:
            raise InvalidRequest(
                "sampling_params.logit_bias", key, "keys must be int32 token ids",
                "send token ids from the model's vocabulary",
            )  # fmt: skip
        if type(value) not in _NUMBER:
            raise InvalidRequest(
                "sampling_params.logit_bias", value, "values must be floats",
                "send the bias as a float",
            )  # fmt: skip


def _check_length(prompt_len: int, max_new: int | None, max_model_len: int) -> None:
    limit = max_model_len - _CONTEXT_RESERVE
    if prompt_len > limit:
        raise PromptTooLong(
            "input_ids", f"{prompt_len} tokens",
            f"the prompt must be at most max_model_len - 2 = {limit} tokens",
            "shorten the prompt",
        )  # fmt: skip
    if max_new is not None and prompt_len + max_new > limit:
        raise PromptTooLong(
            "sampling_params.max_new_tokens", max_new,
            f"prompt ({prompt_len}) + max_new_tokens must be at most {limit}",
            f"send max_new_tokens <= {limit - prompt_len}",
        )  # fmt: skip


def _check_stop_ids(ids: Any) -> None:
    if type(ids) is list and all(type(t) is int for t in ids):
        bad = first_bad_token(ids)  # non-negative int32, as input_ids
        if bad >= 0:
            raise InvalidRequest(
                "sampling_params.stop_token_ids", ids[bad],
                "must hold only non-negative int32 token ids",
                "send token ids from the model's vocabulary",
            )  # fmt: skip
        return
    _check_convert("sampling_params.stop_token_ids", ids, _ANY_IDS, "a list of ints")


def _check_int64(field: str, value: int | None) -> None:
    if value is not None and not _INT64_MIN <= value <= _INT64_MAX:
        _out_of_range(field, value, "[-2**63, 2**63)", "send a value that fits in int64")


def _check_convert(field: str, value: Any, target: Any, expected: str) -> None:
    try:
        msgspec.convert(value, target)
    except msgspec.ValidationError:
        _wrong_type(field, value, expected)


def _wrong_type(field: str, value: Any, expected: str) -> None:
    raise InvalidRequest(
        field, value, f"must be {expected} (the engine drops a request with a wrong type)",
        f"send {expected}",
    )  # fmt: skip


def _out_of_range(field: str, value: Any, allowed: str, fix: str) -> None:
    raise InvalidRequest(field, value, f"must be in {allowed}", fix)
