"""The simulated rank's step logic, without sockets: cadence, finishing, batching, aborts."""

from __future__ import annotations

import msgspec
import pytest

from tsfront.sim.scheduler import (
    EngineFault,
    LoadTail,
    Scheduler,
    SchedulerConfig,
    StepOutput,
    default_logprob,
    default_token,
)
from tsfront.wire import SamplingParams, SessionParams, TokenizedGenerateReqInput


def make_request(
    rid: str, prompt: int = 4, *, stream: bool = True, **sampling: object
) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=list(range(10, 10 + prompt)),
        sampling_params=SamplingParams(**sampling),
        stream=stream,
    )


def run_to_end(scheduler: Scheduler, limit: int = 10_000) -> list[StepOutput]:
    outputs = []
    for _ in range(limit):
        if not scheduler.busy:
            return outputs
        output = scheduler.step()
        if output is not None:
            outputs.append(output)
    raise AssertionError("scheduler did not drain")


def rows_of(outputs: list[StepOutput], rid: str) -> list:
    return [row for output in outputs for row in output.rows if row.rid == rid]


def test_streams_one_token_per_step_in_order_until_length() -> None:
    scheduler = Scheduler()
    assert scheduler.add(make_request("r1", max_new_tokens=5)) is None
    rows = rows_of(run_to_end(scheduler), "r1")
    assert [row.output_ids for row in rows] == [[default_token("r1", i)] for i in range(5)]
    assert [row.completion_tokens for row in rows] == [1, 2, 3, 4, 5]
    assert [row.finished_reason for row in rows] == ["", "", "", "", "length"]
    assert all(row.prompt_tokens == 4 for row in rows)
    assert all(row.logprob_vals == [] and row.logprob_idx == [] for row in rows)


def test_default_tokens_avoid_eos_and_stay_in_vocab() -> None:
    tokens = [default_token("rid-x", i, 100) for i in range(97)]
    assert len(set(tokens)) == 97
    assert all(3 <= t < 100 for t in tokens)


def test_unset_max_new_tokens_runs_to_the_context_limit() -> None:
    scheduler = Scheduler(SchedulerConfig(max_model_len=16))
    scheduler.add(make_request("r1", prompt=4))
    rows = rows_of(run_to_end(scheduler), "r1")
    assert rows[-1].completion_tokens == 16 - 4 - 2
    assert rows[-1].finished_reason == "length"


def test_explicit_max_new_tokens_is_clamped_to_the_context() -> None:
    scheduler = Scheduler(SchedulerConfig(max_model_len=16))
    scheduler.add(make_request("r1", prompt=4, max_new_tokens=100))
    assert rows_of(run_to_end(scheduler), "r1")[-1].completion_tokens == 10


def test_zero_max_new_tokens_yields_one_token_then_length() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", max_new_tokens=0))
    rows = rows_of(run_to_end(scheduler), "r1")
    assert [(row.output_ids, row.finished_reason) for row in rows] == [
        ([default_token("r1", 0)], "length")
    ]


def test_stop_token_is_included_and_finishes_stop() -> None:
    scheduler = Scheduler()
    stop = default_token("r1", 3)
    scheduler.add(make_request("r1", max_new_tokens=50, stop_token_ids=[stop]))
    rows = rows_of(run_to_end(scheduler), "r1")
    assert rows[-1].output_ids == [stop]
    assert rows[-1].finished_reason == "stop"
    assert rows[-1].completion_tokens == 4


def test_length_wins_over_a_stop_token_on_the_same_step() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", max_new_tokens=1, stop_token_ids=[default_token("r1", 0)]))
    assert rows_of(run_to_end(scheduler), "r1")[-1].finished_reason == "length"


def test_ignore_eos_also_disables_stop_token_ids_as_in_the_engine() -> None:
    scheduler = Scheduler()
    stop = default_token("r1", 1)
    scheduler.add(make_request("r1", max_new_tokens=4, stop_token_ids=[stop], ignore_eos=True))
    rows = rows_of(run_to_end(scheduler), "r1")
    assert (rows[-1].completion_tokens, rows[-1].finished_reason) == (4, "length")


def test_eos_finishes_stop_unless_ignore_eos() -> None:
    scheduler = Scheduler(token_fn=lambda rid, pos: 2 if pos == 2 else 7)
    scheduler.add(make_request("eos", max_new_tokens=10))
    scheduler.add(make_request("ignore", max_new_tokens=10, ignore_eos=True))
    outputs = run_to_end(scheduler)
    assert rows_of(outputs, "eos")[-1].completion_tokens == 3
    assert rows_of(outputs, "eos")[-1].finished_reason == "stop"
    assert rows_of(outputs, "ignore")[-1].completion_tokens == 10
    assert rows_of(outputs, "ignore")[-1].finished_reason == "length"


def test_non_streaming_emits_at_1_every_50_and_at_the_end() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", stream=False, max_new_tokens=120))
    rows = rows_of(run_to_end(scheduler), "r1")
    assert [row.completion_tokens for row in rows] == [1, 50, 100, 120]
    assert [len(row.output_ids) for row in rows] == [1, 49, 50, 20]
    tokens = [t for row in rows for t in row.output_ids]
    assert tokens == [default_token("r1", i) for i in range(120)]


def test_stream_interval_emits_when_completion_mod_interval_is_1() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", max_new_tokens=8, stream_interval=3))
    rows = rows_of(run_to_end(scheduler), "r1")
    assert [row.completion_tokens for row in rows] == [1, 4, 7, 8]
    assert sum(len(row.output_ids) for row in rows) == 8


def test_engine_stream_interval_applies_when_the_request_sets_none() -> None:
    scheduler = Scheduler(SchedulerConfig(stream_interval=2))
    scheduler.add(make_request("r1", max_new_tokens=4))
    assert [row.completion_tokens for row in rows_of(run_to_end(scheduler), "r1")] == [1, 3, 4]


def test_batch_cap_queues_requests_and_the_load_tail_counts_them() -> None:
    scheduler = Scheduler(SchedulerConfig(max_batch=2, page_size=4, kv_total_pages=100))
    for rid in ("a", "b", "c"):
        scheduler.add(make_request(rid, prompt=6, max_new_tokens=2))
    first = scheduler.step()
    assert first is not None
    assert [row.rid for row in first.rows] == ["a", "b"]
    # Sampled after admission, before decoding: a and b hold ceil(6/4) = 2 pages each.
    assert first.load == LoadTail(
        num_running=3, num_waiting=1, kv_active_pages=4, kv_total_pages=100
    )
    second = scheduler.step()
    assert second is not None
    assert [row.finished_reason for row in second.rows] == ["length", "length"]
    # The frame that finishes a and b still counts them.
    assert second.load.num_running == 3
    third = scheduler.step()
    assert third is not None
    assert [row.rid for row in third.rows] == ["c"]
    assert third.load == LoadTail(
        num_running=1, num_waiting=0, kv_active_pages=2, kv_total_pages=100
    )


def test_kv_pages_gate_admission() -> None:
    scheduler = Scheduler(SchedulerConfig(page_size=4, kv_total_pages=3))
    scheduler.add(make_request("a", prompt=8, max_new_tokens=3))
    scheduler.add(make_request("b", prompt=8, max_new_tokens=3))
    first = scheduler.step()
    assert first is not None
    assert [row.rid for row in first.rows] == ["a"]
    assert first.load.num_waiting == 1


@pytest.mark.parametrize(
    ("rid", "changes"),
    [
        ("n2", {"sampling_params": SamplingParams(n=2)}),
        ("top_p", {"sampling_params": SamplingParams(top_p=0.0)}),
        ("verr", {"validation_error": "bad"}),
        ("session", {"session_params": SessionParams(id="s1")}),
        ("topk_lp", {"return_logprob": True, "top_logprobs_num": 2}),
        ("prompt_lp", {"return_logprob": True, "logprob_start_len": 0}),
    ],
)
def test_rejected_request_gets_one_terminal_abort(rid: str, changes: dict) -> None:
    scheduler = Scheduler()
    request = msgspec.structs.replace(make_request(rid, prompt=3), **changes)
    output = scheduler.add(request)
    assert output is not None
    [row] = output.rows
    assert (row.rid, row.output_ids, row.finished_reason) == (rid, [], "abort")
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == (3, 0, 0)
    assert not scheduler.busy


def test_logprobs_rejected_without_enable_output_logprobs() -> None:
    scheduler = Scheduler(SchedulerConfig(enable_output_logprobs=False))
    request = TokenizedGenerateReqInput(
        rid="lp", input_ids=[1, 2], sampling_params=SamplingParams(), return_logprob=True
    )
    output = scheduler.add(request)
    assert output is not None and output.rows[0].finished_reason == "abort"


def test_stop_strings_are_accepted_like_the_engine_does() -> None:
    scheduler = Scheduler()
    assert scheduler.add(make_request("s", max_new_tokens=2, stop=["\n\n"])) is None
    assert rows_of(run_to_end(scheduler), "s")[-1].finished_reason == "length"


def test_admission_abort_carries_the_previous_load_tail() -> None:
    scheduler = Scheduler(SchedulerConfig(kv_total_pages=77))
    first = scheduler.add(make_request("bad0", n=2))
    assert first is not None and first.load == LoadTail()
    scheduler.add(make_request("ok", max_new_tokens=5))
    scheduler.step()
    later = scheduler.add(make_request("bad1", n=2))
    assert later is not None and later.load.kv_total_pages == 77
    assert later.load.num_running == 1


def test_abort_of_a_live_request_is_silent() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", max_new_tokens=10))
    scheduler.add(make_request("r2", max_new_tokens=3))
    scheduler.step()
    assert scheduler.abort(["r1"]) == ["r1"]
    outputs = run_to_end(scheduler)
    assert rows_of(outputs, "r1") == []
    assert rows_of(outputs, "r2")[-1].finished_reason == "length"


def test_abort_of_a_waiting_request_is_silent() -> None:
    scheduler = Scheduler(SchedulerConfig(max_batch=1))
    scheduler.add(make_request("a", max_new_tokens=2))
    scheduler.add(make_request("b", max_new_tokens=2))
    scheduler.step()
    assert scheduler.abort(["b"]) == ["b"]
    assert rows_of(run_to_end(scheduler), "b") == []


def test_abort_before_add_drops_the_later_add_within_the_memory() -> None:
    scheduler = Scheduler()
    assert scheduler.abort(["early"], now=100.0) == []
    assert scheduler.add(make_request("early", max_new_tokens=2), now=150.0) is None
    assert not scheduler.busy
    # Consumed: the same rid may be served afterwards.
    scheduler.add(make_request("early", max_new_tokens=1), now=151.0)
    assert scheduler.busy


def test_abort_memory_expires() -> None:
    scheduler = Scheduler(SchedulerConfig(abort_memory_s=300.0))
    scheduler.abort(["old"], now=0.0)
    scheduler.add(make_request("old", max_new_tokens=1), now=301.0)
    assert scheduler.live_rids() == ["old"]


def test_add_then_abort_before_a_step_yields_nothing() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", max_new_tokens=3))
    scheduler.abort(["r1"])
    assert run_to_end(scheduler) == []


def test_duplicate_live_rid_is_dropped() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("r1", max_new_tokens=3))
    assert scheduler.add(make_request("r1", max_new_tokens=30)) is None
    assert rows_of(run_to_end(scheduler), "r1")[-1].completion_tokens == 3


def test_logprob_columns_follow_the_tokens() -> None:
    scheduler = Scheduler()
    request = TokenizedGenerateReqInput(
        rid="lp",
        input_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_new_tokens=3),
        return_logprob=True,
        stream=False,
    )
    scheduler.add(request)
    rows = rows_of(run_to_end(scheduler), "lp")
    assert [row.completion_tokens for row in rows] == [1, 3]
    tokens = [default_token("lp", i) for i in range(3)]
    assert [t for row in rows for t in row.logprob_idx] == tokens
    values = [v for row in rows for v in row.logprob_vals]
    assert values == [default_logprob(t) for t in tokens]
    assert all(v < 0 for v in values)


def test_prefix_cache_reports_page_aligned_hits() -> None:
    scheduler = Scheduler(SchedulerConfig(page_size=4))
    prompt = list(range(100, 110))
    for rid in ("first", "second"):
        scheduler.add(
            TokenizedGenerateReqInput(
                rid=rid, input_ids=prompt, sampling_params=SamplingParams(max_new_tokens=1)
            )
        )
    outputs = run_to_end(scheduler)
    assert rows_of(outputs, "first")[-1].cached_tokens == 0
    assert rows_of(outputs, "second")[-1].cached_tokens == 8


def test_prefix_cache_is_finite_and_evicts_leaves_first() -> None:
    # Capacity 3 pages of 4 tokens. A's 3 pages fill it; B (2 new pages) evicts A's deepest
    # pages, never A's first page before the pages that extend it.
    scheduler = Scheduler(SchedulerConfig(page_size=4, prefix_cache_pages=3))

    def cached(rid: str, prompt: list[int]) -> int:
        scheduler.add(
            TokenizedGenerateReqInput(
                rid=rid, input_ids=prompt, sampling_params=SamplingParams(max_new_tokens=1)
            )
        )
        return rows_of(run_to_end(scheduler), rid)[-1].cached_tokens

    a = list(range(100, 113))  # 3 full pages before the last token
    b = list(range(200, 209))  # 2 full pages
    assert cached("a1", a) == 0
    assert cached("a2", a) == 12
    assert cached("b1", b) == 0
    assert len(scheduler._prefixes) == 3
    # A keeps only its first page (the two deeper ones went first).
    assert cached("a3", a) == 4


def test_prefix_cache_can_be_disabled() -> None:
    scheduler = Scheduler(SchedulerConfig(page_size=4, prefix_cache=False))
    for rid in ("first", "second"):
        scheduler.add(make_request(rid, prompt=10, max_new_tokens=1))
    assert rows_of(run_to_end(scheduler), "second")[-1].cached_tokens == 0


def test_nil_input_ids_kill_the_engine() -> None:
    scheduler = Scheduler()
    request = TokenizedGenerateReqInput(rid="nil", sampling_params=SamplingParams())
    with pytest.raises(EngineFault):
        scheduler.add(request)


def test_one_frame_batches_every_row_of_a_step() -> None:
    scheduler = Scheduler()
    scheduler.add(make_request("a", max_new_tokens=2))
    scheduler.add(make_request("b", max_new_tokens=1))
    first = scheduler.step()
    assert first is not None
    assert [(row.rid, row.finished_reason) for row in first.rows] == [("a", ""), ("b", "length")]
    second = scheduler.step()
    assert second is not None and [row.rid for row in second.rows] == ["a"]
    assert scheduler.step() is None


def test_stream_interval_zero_kills_a_streaming_request_only() -> None:
    scheduler = Scheduler()
    assert scheduler.add(make_request("quiet", stream=False, stream_interval=0)) is None
    with pytest.raises(EngineFault):
        scheduler.add(make_request("loud", stream=True, stream_interval=0))
