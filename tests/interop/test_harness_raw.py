"""The interop harness (TokenSpeed 0.1.1's real transport) against a hand-rolled raw frontend.

These pin down what the engine's own code puts on the wire, independent of
tsfront's client: identities, registration maps, streamed 14-element output
frames, validation aborts, silent client aborts, older output forms and the
ENGINE_CORE_DEAD sentinel.
"""

from __future__ import annotations

import zlib

import msgspec
import pytest
import zmq
from harness_process import spawn_harness
from raw_frontend import (
    ENGINE_CORE_DEAD,
    ENGINE_INDEX,
    OUTPUT_TAG,
    RawFrontend,
    add_payload,
    identity,
    sampling_array,
)
from sim_rules import expected_tokens, logprob_of

REGISTRATION_KEYS = {
    "max_model_len", "num_gpu_blocks", "prefix_granularity", "dp_stats_address", "dtype",
    "multimodal_encoder_dtype", "vllm_version", "world_size", "data_parallel_size",
    "tensor_parallel_size", "pipeline_parallel_size", "decode_context_parallel_size",
    "data_parallel_rank", "max_num_seqs", "max_num_batched_tokens", "instance_id",
    "kv_cache_size_tokens", "kv_cache_max_concurrency", "kv_events_config",
}  # fmt: skip


def _tokens(rows: list[list]) -> list[int]:
    return [t for row in rows for t in row[0]]


def test_single_rank_handshakes_with_hello_ready_and_19_key_registration(frontend, start_harness):
    start_harness(1, 0)
    regs = frontend.register(1)
    assert list(regs) == [identity(0)]
    reg = regs[identity(0)]
    hello = {"status": "HELLO", "local": True, "headless": True, "parallel_config_hash": None}
    assert reg.hello == hello
    assert reg.ready["status"] == "READY"
    assert set(reg.response) == REGISTRATION_KEYS
    assert reg.response["vllm_version"] == "tokenspeed-0.1.1"
    assert (reg.response["data_parallel_rank"], reg.response["data_parallel_size"]) == (0, 1)


def test_add_streams_one_token_per_frame_until_length(frontend, start_harness):
    harness = start_harness(1, 0)
    frontend.register(1)
    frontend.send_add(0, add_payload("r1", [1, 2, 3], sampling_array(max_new_tokens=5)))
    rows = frontend.collect({"r1"})["r1"]
    want, reason = expected_tokens(3, 5)
    assert [row[0] for row in rows] == [[t] for t in want]  # deltas, one per step
    assert [row[1] for row in rows] == ["", "", "", "", reason] == ["", "", "", "", "length"]
    assert [row[3] for row in rows] == [1, 2, 3, 4, 5]  # completion_tokens is cumulative
    assert all(row[2] == 3 for row in rows)
    frame = rows[-1][-1]
    assert len(frame) == 14 and frame[0] == OUTPUT_TAG and frame[ENGINE_INDEX] == 0
    assert frame[13] == 1000  # kv_total_pages = num_gpu_blocks - 1
    [logged] = harness.events("request")
    assert logged["rid"] == "r1" and logged["input_ids"] == [1, 2, 3] and logged["stream"]
    sp = logged["sampling_params"]
    # The engine's own decode ran: top_k=-1 rewritten, seed derived from the rid.
    assert sp["top_k"] == 1 << 30 and sp["seed"] == zlib.crc32(b"r1") and sp["max_new_tokens"] == 5


def test_four_ranks_from_index_3_register_and_answer_on_their_own_identity(frontend, start_harness):
    harness = start_harness(4, 3)
    regs = frontend.register(4)
    assert set(regs) == {identity(i) for i in (3, 4, 5, 6)}
    for index in (3, 4, 5, 6):
        response = regs[identity(index)].response
        assert response["data_parallel_rank"] == index - 3
        assert response["data_parallel_size"] == 4
        frontend.send_add(
            index, add_payload(f"q{index}", [7] * index, sampling_array(max_new_tokens=2))
        )
    rows = frontend.collect({f"q{i}" for i in (3, 4, 5, 6)})
    for index in (3, 4, 5, 6):
        assert {row[-1][ENGINE_INDEX] for row in rows[f"q{index}"]} == {index}
        assert _tokens(rows[f"q{index}"]) == expected_tokens(index, 2)[0]
    logged = {r["rid"]: r["engine_index"] for r in harness.events("request")}
    assert logged == {f"q{i}": i for i in (3, 4, 5, 6)}


def test_abort_stops_a_live_request_silently_and_is_logged(frontend, start_harness):
    harness = start_harness(1, 0)
    frontend.register(1)
    frontend.send_add(0, add_payload("long", [1, 2], sampling_array(max_new_tokens=100000)))
    raw = frontend.recv_output()
    assert msgspec.msgpack.decode(raw)[1] == ["long"]
    frontend.send_abort(0, ["long"])
    # A sentinel request behind the ABORT: once it finishes, the ABORT was processed.
    frontend.send_add(0, add_payload("after", [5], sampling_array(max_new_tokens=1)))
    rows = frontend.collect({"after"})
    assert all(row[1] == "" for row in rows.get("long", []))  # no terminal frame for "long"
    [abort] = harness.events("abort")
    assert abort["rid"] == "long" and abort["live"] is True and abort["engine_index"] == 0


def test_stop_token_finishes_with_stop_unless_ignore_eos(frontend, start_harness):
    start_harness(1, 0)
    frontend.register(1)
    stop_at = expected_tokens(4, 10)[0][2]  # the third token this prompt will produce
    frontend.send_add(
        0, add_payload("s", [1] * 4, sampling_array(max_new_tokens=10, stop_token_ids=[stop_at]))
    )
    frontend.send_add(0, add_payload("i", [1] * 4, sampling_array(
        max_new_tokens=10, stop_token_ids=[stop_at], ignore_eos=True)))  # fmt: skip
    rows = frontend.collect({"s", "i"})
    assert _tokens(rows["s"])[-1] == stop_at and rows["s"][-1][1] == "stop"
    assert len(_tokens(rows["s"])) == 3
    assert len(_tokens(rows["i"])) == 10 and rows["i"][-1][1] == "length"


def test_non_stream_request_gets_first_token_frame_then_terminal(frontend, start_harness):
    start_harness(1, 0)
    frontend.register(1)
    frontend.send_add(0, add_payload("ns", [1, 2], sampling_array(max_new_tokens=6), stream=False))
    rows = frontend.collect({"ns"})["ns"]
    assert [len(row[0]) for row in rows] == [1, 5]
    assert _tokens(rows) == expected_tokens(2, 6)[0]


@pytest.mark.parametrize(
    ("sampling", "why"),
    [
        (sampling_array(max_new_tokens=4, n=2), "n != 1 (zmq_wire)"),
        (sampling_array(max_new_tokens=4, top_p=0.0), "verify(): top_p out of range"),
    ],
)
def test_request_the_engine_rejects_gets_one_terminal_abort_frame(
    frontend, start_harness, sampling, why
):
    harness = start_harness(1, 0)
    frontend.register(1)
    frontend.send_add(0, add_payload("bad", [1, 2, 3], sampling))
    [row] = frontend.collect({"bad"})["bad"]
    assert row[-1][1:9] == [["bad"], [[]], ["abort"], [3], [0], [0], [[]], [[]]], why
    [logged] = harness.events("request")
    assert logged["validation_error"]


def test_logprobs_without_server_flag_abort_and_with_it_stream_values(frontend, start_harness):
    start_harness(1, 0)
    frontend.register(1)
    frontend.send_add(
        0, add_payload("lp", [1], sampling_array(max_new_tokens=2), return_logprob=True)
    )
    assert frontend.collect({"lp"})["lp"][-1][1] == "abort"


def test_logprobs_columns_follow_tokens_with_enable_output_logprobs(frontend, start_harness):
    start_harness(1, 0, "--enable-output-logprobs")
    frontend.register(1)
    frontend.send_add(
        0, add_payload("lp", [1], sampling_array(max_new_tokens=3), return_logprob=True)
    )
    rows = frontend.collect({"lp"})["lp"]
    for ids, _, _, _, lp_val, lp_idx, _ in rows:
        assert lp_idx == ids and lp_val == [logprob_of(t) for t in ids]


@pytest.mark.parametrize("form", [10, 9])
def test_older_output_forms_are_prefixes_of_the_14_element_frame(frontend, start_harness, form):
    start_harness(1, 2, "--output-form", str(form))
    frontend.register(1)
    frontend.send_add(2, add_payload("old", [1, 2], sampling_array(max_new_tokens=2)))
    rows = frontend.collect({"old"})["old"]
    assert {len(row[-1]) for row in rows} == {form}
    assert _tokens(rows) == expected_tokens(2, 2)[0]


def test_dead_rank_sends_engine_core_dead_after_n_steps(frontend, start_harness):
    start_harness(2, 0, "--dead-after-steps", "2", "--dead-rank", "1")
    frontend.register(2)
    frontend.send_add(1, add_payload("d", [1], sampling_array(max_new_tokens=100)))
    frames = [frontend.recv_output() for _ in range(3)]
    assert frames[2] == ENGINE_CORE_DEAD
    assert [msgspec.msgpack.decode(f)[1] for f in frames[:2]] == [["d"], ["d"]]
    # The other rank still serves.
    frontend.send_add(0, add_payload("alive", [1], sampling_array(max_new_tokens=1)))
    assert frontend.collect({"alive"})["alive"][-1][1] == "length"


def test_sigterm_sends_engine_core_dead_and_exits_zero(frontend, start_harness):
    harness = start_harness(1, 0)
    frontend.register(1)
    # A served request proves the rank left the handshake (a SIGTERM inside it, as in the
    # real engine, sends nothing: there is no output socket yet).
    frontend.send_add(0, add_payload("warm", [1], sampling_array(max_new_tokens=1)))
    frontend.collect({"warm"})
    assert harness.stop() == 0
    assert frontend.recv_output() == ENGINE_CORE_DEAD


def test_harness_started_before_the_frontend_binds_still_registers(interop_python, tmp_path):
    # The engine's DEALER queues HELLO while nobody listens, so start order is free.
    probe = zmq.Context.instance().socket(zmq.ROUTER)
    port = probe.bind_to_random_port("tcp://127.0.0.1")
    probe.close(linger=0)
    handshake = f"tcp://127.0.0.1:{port}"
    harness = spawn_harness(interop_python, handshake, tmp_path / "log.jsonl", 1, 9)
    fe = RawFrontend(handshake)
    try:
        assert list(fe.register(1)) == [identity(9)]
    finally:
        harness.stop()
        fe.close()
