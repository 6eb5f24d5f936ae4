"""Simulated ranks over real sockets, driven by a small raw pyzmq frontend in the test.

The frontend binds a handshake ROUTER, an input ROUTER and an output PULL on 127.0.0.1 (port
0), answers HELLO with INIT, and decodes outputs with :mod:`tsfront.wire`. Every wait is a
poll with a deadline.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from tsfront.sim import EngineOptions, SimEngine, SimGroup, default_logprob, default_token
from tsfront.wire import (
    ABORT,
    ADD,
    ENGINE_DEAD,
    BatchTokenIDOutSlim,
    EngineRegistration,
    SamplingParams,
    TokenizedGenerateReqInput,
    decode_output,
    decode_ready_message,
    decode_registration,
    encode_abort,
    encode_add,
    encode_init,
    engine_identity,
)

DEADLINE_S = 5.0


def _bind(sock: zmq.Socket) -> str:
    sock.bind("tcp://127.0.0.1:0")
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


class Frontend:
    """The frontend side of the wire, raw: three bound sockets and a handshake responder."""

    def __init__(self, *, outputs_per_engine: int = 0) -> None:
        self.ctx = zmq.Context()
        self.handshake = self.ctx.socket(zmq.ROUTER)
        self.handshake_address = _bind(self.handshake)
        self.input = self.ctx.socket(zmq.ROUTER)
        self.input.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.input_address = _bind(self.input)
        self.output = self.ctx.socket(zmq.PULL)
        self.output_address = _bind(self.output)
        self.extra_outputs = [self.ctx.socket(zmq.PULL) for _ in range(outputs_per_engine)]
        self.extra_addresses = [_bind(sock) for sock in self.extra_outputs]
        self.registrations: dict[bytes, EngineRegistration] = {}
        self.hello_order: list[bytes] = []

    def accept(self, count: int, *, init: bytes | None = None) -> dict[bytes, EngineRegistration]:
        """Answer ``count`` HELLOs and collect the registrations that follow."""
        deadline = time.monotonic() + DEADLINE_S
        answered = 0
        while answered < count or len(self.registrations) < answered:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(self.registrations)} of {count} registered"
            poller = zmq.Poller()
            poller.register(self.handshake, zmq.POLLIN)
            poller.register(self.input, zmq.POLLIN)
            events = dict(poller.poll(int(remaining * 1000)))
            if self.handshake in events:
                ident, frame = self.handshake.recv_multipart()
                status = decode_ready_message(frame).status
                if status == "HELLO":
                    self.hello_order.append(ident)
                    self.handshake.send_multipart([ident, init or self._init_for(answered)])
                    answered += 1
                else:
                    assert status == "READY"
            if self.input in events:
                ident, frame = self.input.recv_multipart()
                self.registrations[ident] = decode_registration(frame)
        return self.registrations

    def _init_for(self, nth: int) -> bytes:
        output = self.extra_addresses[nth] if self.extra_outputs else self.output_address
        return encode_init([self.input_address], [output])

    def add(self, index: int, req: TokenizedGenerateReqInput) -> None:
        self.input.send_multipart([engine_identity(index), ADD, encode_add(req)])

    def abort(self, index: int, rids: list[str]) -> None:
        self.input.send_multipart([engine_identity(index), ABORT, encode_abort(rids)])

    def recv(self, timeout: float = DEADLINE_S, sock: zmq.Socket | None = None) -> Any:
        sock = sock or self.output
        assert sock.poll(int(timeout * 1000)), "no output frame before the deadline"
        return decode_output(sock.recv())

    def collect(self, rids: set[str], sock: zmq.Socket | None = None) -> list[BatchTokenIDOutSlim]:
        """Receive frames until every rid in ``rids`` had its terminal row."""
        frames, pending = [], set(rids)
        deadline = time.monotonic() + DEADLINE_S
        while pending:
            batch = self.recv(max(0.0, deadline - time.monotonic()), sock)
            assert batch is not ENGINE_DEAD, "engine died while collecting"
            frames.append(batch)
            for rid, reason in zip(batch.rids, batch.finished_reasons):
                if reason:
                    pending.discard(rid)
        return frames

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def request(rid: str, *, stream: bool = True, **sampling: Any) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid=rid, input_ids=[5, 6, 7], sampling_params=SamplingParams(**sampling), stream=stream
    )


def rows(frames: list[BatchTokenIDOutSlim], rid: str) -> list[dict[str, Any]]:
    out = []
    for batch in frames:
        for i, frame_rid in enumerate(batch.rids):
            if frame_rid == rid:
                out.append(
                    {
                        "ids": batch.output_ids[i],
                        "reason": batch.finished_reasons[i],
                        "completion": batch.completion_tokens[i],
                        "prompt": batch.prompt_tokens[i],
                        "lp_val": batch.output_token_logprobs_val[i],
                        "lp_idx": batch.output_token_logprobs_idx[i],
                        "engine": batch.engine_index,
                    }
                )
    return out


@pytest.fixture
def frontend() -> Iterator[Frontend]:
    fe = Frontend()
    yield fe
    fe.close()


def started(fe: Frontend, num_engines: int, first: int = 0, **options: Any) -> SimGroup:
    options.setdefault("step_ms", 1.0)
    group = SimGroup(fe.handshake_address, num_engines, first, **options).start()
    fe.accept(num_engines)
    group.wait_registered(DEADLINE_S)
    return group


def test_one_rank_registers_and_streams_tokens_in_order_until_length(frontend: Frontend) -> None:
    with started(frontend, 1) as group:
        [(ident, reg)] = frontend.registrations.items()
        assert ident == b"\x00\x00"
        assert (reg.data_parallel_rank, reg.data_parallel_size) == (0, 1)
        assert (reg.max_model_len, reg.prefix_granularity, reg.num_gpu_blocks) == (32768, 64, 4096)
        frontend.add(0, request("r1", max_new_tokens=6))
        got = rows(frontend.collect({"r1"}), "r1")
        assert [r["ids"] for r in got] == [[default_token("r1", i)] for i in range(6)]
        assert [r["completion"] for r in got] == [1, 2, 3, 4, 5, 6]
        assert [r["reason"] for r in got][-2:] == ["", "length"]
        assert group.engine(0).wait_request("r1", 0).sampling_params.max_new_tokens == 6


def test_four_ranks_from_index_2_register_and_serve_only_their_own_requests(
    frontend: Frontend,
) -> None:
    with started(frontend, 4, first=2, max_num_seqs=64) as group:
        regs = frontend.registrations
        assert sorted(regs) == [engine_identity(i) for i in (2, 3, 4, 5)]
        for index in (2, 3, 4, 5):
            reg = regs[engine_identity(index)]
            assert (reg.data_parallel_rank, reg.data_parallel_size) == (index - 2, 4)
            assert reg.max_num_seqs == 64
        for index in (2, 3, 4, 5):
            frontend.add(index, request(f"q{index}", max_new_tokens=3))
        frames = frontend.collect({f"q{i}" for i in (2, 3, 4, 5)})
        for index in (2, 3, 4, 5):
            assert {r["engine"] for r in rows(frames, f"q{index}")} == {index}
            assert [r.rid for r in group.engine(index).requests()] == [f"q{index}"]
        batch = frames[0]
        assert batch.kv_total_pages == 4095 and batch.num_running >= 1
        assert group.wait_request("q4", DEADLINE_S)[0] == 4


def test_each_rank_uses_the_addresses_its_own_init_gave() -> None:
    fe = Frontend(outputs_per_engine=2)
    try:
        with started(fe, 2, first=7):
            # The n-th HELLO answered got the n-th output address.
            owners = [int.from_bytes(ident, "little") for ident in fe.hello_order]
            for index in owners:
                fe.add(index, request(f"p{index}", max_new_tokens=2))
            for index, sock in zip(owners, fe.extra_outputs):
                frames = fe.collect({f"p{index}"}, sock)
                assert {b.engine_index for b in frames} == {index}
    finally:
        fe.close()


def test_stop_token_ids_end_with_the_stop_token(frontend: Frontend) -> None:
    with started(frontend, 1):
        stop = default_token("s1", 2)
        frontend.add(0, request("s1", max_new_tokens=50, stop_token_ids=[stop]))
        got = rows(frontend.collect({"s1"}), "s1")
        assert got[-1]["ids"] == [stop] and got[-1]["reason"] == "stop"
        assert got[-1]["completion"] == 3


def test_non_streaming_request_emits_at_1_50_and_the_end(frontend: Frontend) -> None:
    with started(frontend, 1, step_ms=0.2):
        frontend.add(0, request("ns", stream=False, max_new_tokens=60))
        got = rows(frontend.collect({"ns"}), "ns")
        assert [r["completion"] for r in got] == [1, 50, 60]
        assert [t for r in got for t in r["ids"]] == [default_token("ns", i) for i in range(60)]


def test_logprob_columns_are_filled_when_requested(frontend: Frontend) -> None:
    with started(frontend, 1):
        req = request("lp", max_new_tokens=2)
        req.return_logprob = True
        frontend.add(0, req)
        got = rows(frontend.collect({"lp"}), "lp")
        tokens = [default_token("lp", i) for i in range(2)]
        assert [t for r in got for t in r["lp_idx"]] == tokens
        assert [v for r in got for v in r["lp_val"]] == [default_logprob(t) for t in tokens]


def test_rejected_request_gets_exactly_one_terminal_abort(frontend: Frontend) -> None:
    with started(frontend, 1) as group:
        frontend.add(0, request("bad", n=2))
        frontend.add(0, request("good", max_new_tokens=3))
        frames = frontend.collect({"bad", "good"})
        bad = rows(frames, "bad")
        assert bad == [
            {
                "ids": [],
                "reason": "abort",
                "completion": 0,
                "prompt": 3,
                "lp_val": [],
                "lp_idx": [],
                "engine": 0,
            }
        ]
        assert group.engine(0).counters()["rejected"] == 1


def test_abort_of_a_live_request_is_silent(frontend: Frontend) -> None:
    with started(frontend, 1) as group:
        frontend.add(0, request("long", max_new_tokens=100_000))
        first = frontend.recv()
        assert first.rids == ["long"]
        frontend.abort(0, ["long"])
        group.engine(0).wait_abort("long", DEADLINE_S)
        frontend.add(0, request("after", max_new_tokens=2))
        frames = frontend.collect({"after"})
        assert all(r["reason"] == "" for r in rows(frames, "long"))
        assert group.engine(0).scheduler.live_rids() == []


def test_abort_before_add_makes_the_engine_drop_that_rid(frontend: Frontend) -> None:
    with started(frontend, 1) as group:
        frontend.abort(0, ["ghost"])
        group.engine(0).wait_abort("ghost", DEADLINE_S)
        frontend.add(0, request("ghost", max_new_tokens=2))
        frontend.add(0, request("follow", max_new_tokens=2))
        assert rows(frontend.collect({"follow"}), "ghost") == []
        assert group.engine(0).wait_request("ghost", 0).rid == "ghost"


def test_malformed_input_is_dropped_and_the_rank_keeps_serving(frontend: Frontend) -> None:
    with started(frontend, 1) as group:
        ident = engine_identity(0)
        frontend.input.send_multipart([ident, b"", ADD, encode_add(request("x"))])
        frontend.input.send_multipart([ident, b"\x00\x00", b"junk"])
        frontend.input.send_multipart([ident, ADD, b"\xc1"])
        frontend.input.send_multipart([ident, ADD])
        frontend.add(0, request("ok", max_new_tokens=1))
        assert rows(frontend.collect({"ok"}), "ok")[-1]["reason"] == "length"
        assert group.engine(0).counters()["dropped"] == 4


def test_engine_core_dead_after_n_steps(frontend: Frontend) -> None:
    with started(frontend, 1, dead_after_steps=3) as group:
        frontend.add(0, request("d", max_new_tokens=100))
        got = [frontend.recv() for _ in range(4)]
        assert [b.completion_tokens for b in got[:3]] == [[1], [2], [3]]
        assert got[3] is ENGINE_DEAD
        assert group.engine(0).wait_stopped(DEADLINE_S) == "dead"


def test_exit_without_sentinel_in_thread_mode(frontend: Frontend) -> None:
    with started(frontend, 1, exit_after_steps=2) as group:
        frontend.add(0, request("e", max_new_tokens=100))
        assert group.engine(0).wait_stopped(DEADLINE_S) == "exited"
        seen = []
        while frontend.output.poll(200):
            seen.append(decode_output(frontend.output.recv()))
        assert ENGINE_DEAD not in seen


def test_silent_rank_stops_emitting_but_keeps_receiving(frontend: Frontend) -> None:
    with started(frontend, 1, silent_after_steps=2) as group:
        frontend.add(0, request("quiet", max_new_tokens=100))
        assert [frontend.recv().completion_tokens for _ in range(2)] == [[1], [2]]
        frontend.add(0, request("later", max_new_tokens=1))
        group.engine(0).wait_request("later", DEADLINE_S)
        assert not frontend.output.poll(100)
        assert group.engine(0).alive


@pytest.mark.parametrize("form", [9, 10, 14, 16])
def test_each_output_form_decodes(frontend: Frontend, form: int) -> None:
    with started(frontend, 1, first=3, output_form=form):
        frontend.add(3, request("f", max_new_tokens=2))
        [first, last] = frontend.collect({"f"})
        assert last.finished_reasons == ["length"]
        assert first.engine_index == (3 if form >= 10 else 0)
        assert first.kv_total_pages == (4095 if form >= 14 else 0)


def test_empty_init_addresses_still_get_ready_then_the_rank_dies(frontend: Frontend) -> None:
    group = SimGroup(frontend.handshake_address, 1).start()
    try:
        assert frontend.handshake.poll(int(DEADLINE_S * 1000))
        ident, _hello = frontend.handshake.recv_multipart()
        frontend.handshake.send_multipart([ident, b"\x81\xa9addresses\x80"])
        assert frontend.handshake.poll(int(DEADLINE_S * 1000))
        assert decode_ready_message(frontend.handshake.recv_multipart()[-1]).status == "READY"
        assert group.engine(0).wait_stopped(DEADLINE_S) == "handshake_failed"
    finally:
        group.stop()


def test_stop_joins_every_thread_and_sends_the_sentinel(frontend: Frontend) -> None:
    before = set(threading.enumerate())
    group = started(frontend, 4, first=2)
    assert all(group.threads_alive())
    assert group.stop(DEADLINE_S)
    assert not any(group.threads_alive())
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leftover == []
    assert [frontend.recv() for _ in range(4)] == [ENGINE_DEAD] * 4


def test_stop_is_prompt_while_the_handshake_waits() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    address = _bind(router)
    try:
        engine = SimEngine(address, 9, options=EngineOptions())
        engine.start()
        assert router.poll(int(DEADLINE_S * 1000))
        assert engine.stop(1.0)
        assert engine.outcome == "stopped"
    finally:
        ctx.destroy(linger=0)


def test_process_group_serves_and_sends_the_sentinel_on_sigterm(frontend: Frontend) -> None:
    group = SimGroup(frontend.handshake_address, 2, first_engine_index=4, processes=True)
    group.start()
    try:
        frontend.accept(2)
        group.wait_registered(DEADLINE_S * 2)
        frontend.add(5, request("pp", max_new_tokens=2))
        assert {r["engine"] for r in rows(frontend.collect({"pp"}), "pp")} == {5}
    finally:
        assert group.stop(DEADLINE_S)
    assert group.exitcodes() == [0, 0]
    assert [frontend.recv() for _ in range(2)] == [ENGINE_DEAD] * 2


def test_process_rank_exits_without_sentinel(frontend: Frontend) -> None:
    group = SimGroup(frontend.handshake_address, 1, processes=True, exit_after_steps=1)
    group.start()
    try:
        frontend.accept(1)
        frontend.add(0, request("pe", max_new_tokens=50))
        assert frontend.recv().completion_tokens == [1]
        assert group.wait_exited(DEADLINE_S) == [1]
        assert not frontend.output.poll(100)
    finally:
        group.stop(DEADLINE_S)


def test_cli_runs_ranks_and_exits_1_when_one_dies(frontend: Frontend) -> None:
    cmd = [sys.executable, "-m", "tsfront.sim", "--handshake", frontend.handshake_address]
    cmd += ["--num-engines", "2", "--first-engine-index", "1", "--step-ms", "1"]
    cmd += ["--dead-after-steps", "1", "--fault-ranks", "1", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        frontend.accept(2)
        frontend.add(2, request("c", max_new_tokens=5))
        assert frontend.recv().engine_index == 2
        assert frontend.recv() is ENGINE_DEAD
        assert proc.wait(DEADLINE_S) == 1
        # The surviving rank was stopped as by SIGTERM: it sent its own sentinel.
        assert frontend.recv() is ENGINE_DEAD
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
