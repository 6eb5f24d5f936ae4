"""tsfront.wire against the engine's own bytes (tests/data/golden_vectors.json)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import msgspec
import pytest

from tsfront.errors import StopStringsRefused, WireDecodeError
from tsfront.wire import (
    ABORT,
    ADD,
    ENGINE_CORE_DEAD,
    ENGINE_DEAD,
    BatchTokenIDOutSlim,
    EngineRegistration,
    SamplingParams,
    TokenizedGenerateReqInput,
    decode_abort,
    decode_add,
    decode_init,
    decode_output,
    decode_ready_message,
    decode_registration,
    encode_abort,
    encode_add,
    encode_hello,
    encode_init,
    encode_output,
    encode_ready,
    encode_registration,
    engine_identity,
    identity_index,
    validate_request,
)
from tsfront.wire import request as request_module

GOLDEN_PATH = Path(__file__).parents[1] / "data" / "golden_vectors.json"
GOLDEN_SHA256 = "de450d7cfddf70157dcd02e76d8c827a184df6360d9aab8f7045b464ac319631"
GOLDEN = json.loads(GOLDEN_PATH.read_text())

IN_ADDR = "tcp://127.0.0.1:30501"
OUT_ADDR = "tcp://127.0.0.1:30502"


def payload(name: str) -> bytes:
    return bytes.fromhex(GOLDEN[name]["hex"])


def frames(name: str) -> list[bytes]:
    return [bytes.fromhex(f) for f in GOLDEN[name]["frames"]]


def tree(data: bytes):
    return msgspec.msgpack.decode(data)


def minimal_request() -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid="r1", input_ids=[1, 2, 3], stream=True, sampling_params=SamplingParams()
    )


def sampling_request() -> TokenizedGenerateReqInput:
    sp = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16, stop_token_ids=[2], seed=42)
    return TokenizedGenerateReqInput(rid="r2", input_ids=[1, 2, 3], stream=True, sampling_params=sp)


def dp_rank_request() -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid="r3",
        input_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_new_tokens=8),
        data_parallel_rank=1,
    )


def stop_string_request() -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid="r4",
        input_ids=[1, 2, 3],
        stream=True,
        sampling_params=SamplingParams(max_new_tokens=32, stop=["\n\n"]),
    )


TWO_ROW_BATCH = BatchTokenIDOutSlim(
    rids=["r1", "r2"],
    output_ids=[[42], [7, 2]],
    finished_reasons=["", "stop"],
    prompt_tokens=[3, 3],
    completion_tokens=[4, 2],
    cached_tokens=[0, 0],
    output_token_logprobs_val=[[], []],
    output_token_logprobs_idx=[[], []],
    engine_index=0,
    num_running=2,
    num_waiting=1,
    kv_active_pages=10,
    kv_total_pages=1000,
)
OLD_ENGINE_BATCH = msgspec.structs.replace(
    TWO_ROW_BATCH, num_running=0, num_waiting=0, kv_active_pages=0, kv_total_pages=0
)


# --- the file itself -------------------------------------------------------------------------


def test_golden_file_is_byte_for_byte_the_pinned_copy():
    assert hashlib.sha256(GOLDEN_PATH.read_bytes()).hexdigest() == GOLDEN_SHA256


@pytest.mark.parametrize("name", [k for k in GOLDEN if k not in ("_meta", "engine_core_dead")])
def test_golden_hex_decodes_to_the_recorded_tree_and_is_the_last_frame(name):
    entry = GOLDEN[name]
    assert entry["frames"][-1] == entry["hex"]
    assert tree(payload(name)) == entry["decoded"]


def test_every_golden_vector_is_exercised_by_this_module():
    source = Path(__file__).read_text()
    unused = [k for k in GOLDEN if k != "_meta" and f'"{k}"' not in source]
    assert unused == []


# --- requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("add_minimal_full", minimal_request),
        ("add_sampling", sampling_request),
        ("add_dp_rank", dp_rank_request),
        ("add_stop_string", stop_string_request),
    ],
)
def test_encode_add_is_byte_identical_to_the_engine_full_form(name, make):
    encoded = encode_add(make())
    assert encoded == payload(name)
    assert tree(encoded) == GOLDEN[name]["decoded"]
    assert [ADD, encoded] == frames(name)


@pytest.mark.parametrize(
    ("short", "full"),
    [("add_minimal_short", "add_minimal_full"), ("add_sampling_short", "add_sampling")],
)
def test_short_prefix_forms_decode_to_the_same_request_as_the_full_form(short, full):
    assert decode_add(payload(short)) == decode_add(payload(full))
    assert len(tree(payload(short))) == 11


def test_decode_add_reads_the_engine_full_form_field_by_field():
    req = decode_add(payload("add_sampling"))
    assert req == sampling_request()
    assert req.sampling_params.stop_token_ids == [2]
    assert req.sampling_params.top_k == -1  # no engine-side normalisation here
    assert req.sampling_params.seed == 42


def test_decode_add_keeps_data_parallel_rank():
    assert decode_add(payload("add_dp_rank")).data_parallel_rank == 1


def test_decode_add_ignores_extra_trailing_elements_like_the_engine():
    items = [*tree(payload("add_minimal_full")), None, "future"]
    assert decode_add(msgspec.msgpack.encode(items)) == minimal_request()


def test_decode_add_accepts_the_24_element_aug_layout():
    items = tree(payload("add_minimal_full"))[:-1]
    assert decode_add(msgspec.msgpack.encode(items)) == minimal_request()


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda t: t[:5], id="fewer-than-6-elements"),
        pytest.param(lambda t: ["GenerateReqInput", *t[1:]], id="wrong-tag"),
        pytest.param(lambda t: [t[0], None, *t[2:]], id="nil-rid"),
        pytest.param(lambda t: [t[0], ["a", "b"], *t[2:]], id="list-rid"),
        pytest.param(lambda t: [*t[:5], {}, *t[6:]], id="sampling-params-as-map"),
        pytest.param(lambda t: [*t[:4], [1.5], *t[5:]], id="float-token-id"),
        pytest.param(lambda t: [*t[:10], 1, *t[11:]], id="int-for-bool-stream"),
    ],
)
def test_decode_add_rejects_what_the_engine_drops(mutate):
    bad = msgspec.msgpack.encode(mutate(tree(payload("add_minimal_full"))))
    with pytest.raises(WireDecodeError):
        decode_add(bad)


def test_decode_add_rejects_trailing_bytes_and_foreign_ext_types():
    with pytest.raises(WireDecodeError):
        decode_add(payload("add_minimal_full") + b"\xc0")
    items = tree(payload("add_minimal_full"))
    items[22] = msgspec.msgpack.Ext(5, b"x")
    with pytest.raises(WireDecodeError):
        decode_add(msgspec.msgpack.encode(items))


def test_raw_view_ext_in_multimodal_inputs_round_trips():
    req = msgspec.structs.replace(
        minimal_request(), multimodal_inputs=["float16", [2], msgspec.msgpack.Ext(3, b"\0\1")]
    )
    assert decode_add(encode_add(req)) == req


def test_module_docstring_shows_the_exact_minimal_add_bytes():
    block = re.search(r"payload is::\n\n((?:    [0-9a-f]+\n)+)", request_module.__doc__)
    assert block is not None
    assert "".join(block.group(1).split()) == encode_add(minimal_request()).hex()


def test_golden_stop_string_request_is_refused_by_validation():
    req = decode_add(payload("add_stop_string"))
    with pytest.raises(StopStringsRefused) as info:
        validate_request(req)
    assert info.value.field == "sampling_params.stop"
    assert "stop_token_ids" in info.value.fix


def test_golden_valid_requests_pass_validation():
    for name in ("add_minimal_full", "add_minimal_short", "add_sampling", "add_dp_rank"):
        validate_request(decode_add(payload(name)), max_model_len=32768)


def test_abort_encodes_byte_identical_and_decodes():
    assert [ABORT, encode_abort(["r1", "r2"])] == frames("abort")
    assert decode_abort(payload("abort")) == GOLDEN["abort"]["decoded"] == ["r1", "r2"]
    assert decode_abort(encode_abort([])) == []


# --- outputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "form", "expected"),
    [
        ("output_v14", 14, TWO_ROW_BATCH),
        ("output_v10_aug12", 10, OLD_ENGINE_BATCH),
        ("output_v9_aug3", 9, OLD_ENGINE_BATCH),
    ],
)
def test_outputs_of_every_engine_generation_decode_and_encode_identically(name, form, expected):
    assert decode_output(payload(name)) == expected
    assert decode_output(memoryview(payload(name))) == expected
    assert encode_output(TWO_ROW_BATCH, form=form) == payload(name)


def test_longer_future_output_form_decodes_ignoring_the_extra_elements():
    future = encode_output(TWO_ROW_BATCH, form=17)
    assert tree(future) == [*GOLDEN["output_v14"]["decoded"], None, None, None]
    assert decode_output(future) == TWO_ROW_BATCH
    extended = msgspec.msgpack.encode([*GOLDEN["output_v14"]["decoded"], [1, 2], "new"])
    assert decode_output(extended) == TWO_ROW_BATCH


def test_logprob_output_decodes_values_and_engine_index():
    batch = decode_output(payload("output_v14_logprobs_length"))
    assert isinstance(batch, BatchTokenIDOutSlim)
    assert batch.rids == ["r9"]
    assert batch.output_ids == [[11, 12]]
    assert batch.finished_reasons == ["length"]
    assert batch.output_token_logprobs_val == [[-0.25, -1.5]]
    assert batch.output_token_logprobs_idx == [[11, 12]]
    assert (batch.engine_index, batch.num_running, batch.kv_total_pages) == (3, 1, 1000)
    assert encode_output(batch) == payload("output_v14_logprobs_length")


def test_validation_abort_output_decodes_as_a_terminal_abort_with_no_tokens():
    batch = decode_output(payload("output_validation_abort"))
    assert batch == BatchTokenIDOutSlim(
        ["bad1"], [[]], ["abort"], [3], [0], [0], [[]], [[]], 0, 0, 0, 0, 1000
    )
    assert encode_output(batch) == payload("output_validation_abort")


def test_engine_core_dead_sentinel_is_recognised_before_msgpack():
    assert frames("engine_core_dead") == [ENGINE_CORE_DEAD]
    assert decode_output(payload("engine_core_dead")) is ENGINE_DEAD
    assert decode_output(memoryview(ENGINE_CORE_DEAD)) is ENGINE_DEAD


@pytest.mark.parametrize("column", range(2, 9))
def test_ragged_output_column_is_rejected_naming_the_column(column):
    items = tree(payload("output_v14"))
    items[column] = items[column][:1]
    name = msgspec.structs.fields(BatchTokenIDOutSlim)[column - 1].name
    with pytest.raises(WireDecodeError, match=name):
        decode_output(msgspec.msgpack.encode(items))


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(
            msgspec.msgpack.encode(["BatchStrOut", [], [], [], [], [], [], [], []]), id="tag"
        ),
        pytest.param(payload("output_v9_aug3")[:-1], id="truncated"),
        pytest.param(msgspec.msgpack.encode(tree(payload("output_v9_aug3"))[:8]), id="8-columns"),
        pytest.param(b"ENGINE_CORE_DEAF", id="near-sentinel"),
        pytest.param(b"", id="empty"),
    ],
)
def test_malformed_outputs_raise_wire_decode_error(bad):
    with pytest.raises(WireDecodeError):
        decode_output(bad)


def test_encode_output_refuses_forms_below_nine():
    with pytest.raises(ValueError):
        encode_output(TWO_ROW_BATCH, form=8)


# --- handshake -------------------------------------------------------------------------------


def test_hello_and_ready_are_byte_identical_and_decode_by_name():
    assert encode_hello() == payload("hello")
    assert encode_ready() == payload("ready")
    for name in ("hello", "ready"):
        msg = decode_ready_message(payload(name))
        assert msgspec.structs.asdict(msg) == GOLDEN[name]["decoded"]


def test_ready_message_tolerates_unknown_and_missing_keys():
    msg = decode_ready_message(msgspec.msgpack.encode({"status": "HELLO", "extra": [1]}))
    assert (msg.status, msg.local, msg.parallel_config_hash) == ("HELLO", None, None)


def test_encode_init_is_byte_identical_to_the_minimal_init():
    assert encode_init([IN_ADDR], [OUT_ADDR]) == payload("init_minimal")


@pytest.mark.parametrize("name", ["init_minimal", "init_full"])
def test_init_decodes_addresses(name):
    init = decode_init(payload(name))
    assert init.addresses.inputs == [IN_ADDR]
    assert init.addresses.outputs == [OUT_ADDR]
    assert init.parallel_config == {}


def test_full_init_struct_encodes_like_the_engine_struct():
    assert msgspec.msgpack.encode(decode_init(payload("init_full"))) == payload("init_full")


def test_init_without_addresses_is_a_decode_error():
    with pytest.raises(WireDecodeError):
        decode_init(msgspec.msgpack.encode({"parallel_config": {}}))


@pytest.mark.parametrize("empty", [([], [OUT_ADDR]), ([IN_ADDR], [])])
def test_encode_init_refuses_an_init_that_would_kill_the_engine(empty):
    with pytest.raises(ValueError):
        encode_init(*empty)


@pytest.mark.parametrize(
    ("name", "legacy"),
    [("ready_response", False), ("ready_response_aug22", False), ("ready_response_aug3", True)],
)
def test_registration_variants_decode_and_re_encode_identically(name, legacy):
    reg = decode_registration(payload(name))
    assert reg.prefix_granularity == 64
    assert not hasattr(reg, "block_size")
    assert encode_registration(reg, legacy_block_size=legacy) == payload(name)


def test_registration_fields_match_the_engine_values():
    reg = decode_registration(payload("ready_response"))
    expected = dict(GOLDEN["ready_response"]["decoded"])
    assert msgspec.structs.asdict(reg) == expected
    assert (reg.data_parallel_rank, reg.data_parallel_size, reg.vllm_version) == (
        1,
        2,
        "tokenspeed-0.1.1",
    )


def test_registration_tolerates_unknown_keys_and_defaults_missing_ones():
    reg = decode_registration(msgspec.msgpack.encode({"max_model_len": 4096, "future_key": 1}))
    assert reg == EngineRegistration(max_model_len=4096)


def test_registration_that_is_not_a_map_is_a_decode_error():
    with pytest.raises(WireDecodeError):
        decode_registration(payload("add_minimal_full"))


# --- identities ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "identity"), [(0, b"\0\0"), (1, b"\1\0"), (5, b"\5\0"), (258, b"\2\1")]
)
def test_engine_identity_is_a_little_endian_u16(index, identity):
    assert engine_identity(index) == identity
    assert identity_index(identity) == index


@pytest.mark.parametrize("index", [-1, 65536])
def test_engine_identity_is_range_checked(index):
    with pytest.raises(ValueError):
        engine_identity(index)


@pytest.mark.parametrize("identity", [b"", b"\0", b"\0\0\0"])
def test_identity_index_needs_exactly_two_bytes(identity):
    with pytest.raises(WireDecodeError):
        identity_index(identity)
