"""Interop peer: TokenSpeed 0.1.1's own engine-side transport around a simulated scheduler.

Run inside ``.interop-venv`` (see ``scripts/interop-venv``)::

    .interop-venv/bin/python tests/interop/harness.py --handshake tcp://127.0.0.1:PORT \
        --num-engines N --first-engine-index K [--log FILE.jsonl] [options]

Every byte on the wire is made by the engine package: each rank (a thread)
dials the frontend with the engine's real ``connect_msgpack_engine`` and then
serves through the real ``MsgpackRecvSocket`` (decode, ``n``/logprob/
``verify()`` validation) and ``MsgpackSendSocket`` (``BatchTokenIDOut`` →
14-element ``BatchTokenIDOutSlim`` with ``engine_index`` and load tail, and the
``ENGINE_CORE_DEAD`` sentinel). Only the model is simulated: every step each
running request gets the token ``sim_rules.token_at(len(prompt), i)``, or, with
``--replies FILE`` (a JSON list of ``{"when": [ids], "emit": [ids]}``), the next of
the ``emit`` ids of the first rule whose ``when`` ids stand in its prompt (a
scripted answer: a tool call, say; end it with the ``--eos-token-id``).

Behaviour mirrored from the engine (see tests/interop/sim_rules.py):

* finish order ``length`` (``max_new_tokens`` clamped by the context) →
  ``stop`` (``stop_token_ids`` / ``--eos-token-id``, both off under ``ignore_eos``);
* stream cadence (``stream_interval`` / ``--stream-interval``; non-stream on the
  first token and every 50th), terminal frame exactly once;
* a request the transport marked with ``validation_error`` (or carrying a
  session id) gets one terminal ``"abort"`` frame, like
  ``publish_finished_at_admission``;
* an ABORT stops a live request silently; an ABORT for an unknown rid is
  remembered (300 s) and silently kills a later ADD with that rid;
* on SIGTERM (and ``--dead-after-steps``) a serving rank sends the real
  ENGINE_CORE_DEAD through ``MsgpackSendSocket.send_engine_dead``, as
  ``EventLoop.close`` does.

Stdout carries one line, ``HARNESS READY``, once every rank has started dialling.
``--log`` gets one JSON object per line (flushed per line), each with ``event``
(``registered`` | ``request`` | ``abort`` | ``finish`` | ``engine_dead``),
``engine_index`` and ``t`` (unix seconds); ``request`` lines hold every field of
the decoded ``TokenizedGenerateReqInput`` (sampling params as the engine
decoded them: ``top_k`` rewritten, ``seed`` resolved, ``stop_token_ids`` as a
sorted list), ``abort`` lines the rid and whether it was live.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import msgspec
import sim_rules
import zmq
from engine_outputs import OutputRow, build_batch
from tokenspeed.runtime.engine import zmq_wire
from tokenspeed.runtime.engine.io_struct import AbortReq, BatchTokenIDOut, TokenizedGenerateReqInput
from tokenspeed.runtime.engine.request_types import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_TOKEN,
)
from tokenspeed.runtime.engine.zmq_msgpack import (
    MsgpackRecvSocket,
    MsgpackSendSocket,
    connect_msgpack_engine,
)
from tokenspeed.version import __version__ as ENGINE_VERSION

#: How long the engine remembers an ABORT for a rid it has not seen (``_PENDING_ABORT_TTL_S``).
PENDING_ABORT_TTL_S = 300.0


# --------------------------------------------------------------------------- log


class JsonLog:
    """Thread-safe JSON-lines event log, flushed per line (a no-op without a path)."""

    def __init__(self, path: str | None) -> None:
        self._file: TextIO | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, event: str, engine_index: int, **fields: Any) -> None:
        """Append one event line."""
        if self._file is None:
            return
        record = {"event": event, "engine_index": engine_index, "t": time.time(), **fields}
        line = json.dumps(record, default=_jsonable, sort_keys=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def _jsonable(value: Any) -> Any:
    """JSON fallback for what the engine's decoded structs contain."""
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, msgspec.Struct):
        return struct_to_dict(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return repr(value)


def struct_to_dict(obj: msgspec.Struct) -> dict[str, Any]:
    """Every field of a msgspec struct by name (``to_builtins`` would give an array)."""
    out: dict[str, Any] = {}
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = struct_to_dict(value) if isinstance(value, msgspec.Struct) else value
    return out


# ----------------------------------------------------------------- output forms


class TruncatingSocket:
    """Wraps the engine's PUSH socket to cut each output to an older wire form.

    ``MsgpackSendSocket`` always encodes the 0.1.1 14-element array; older
    engines sent its 9/10-element prefix, so re-encoding the prefix gives the
    exact older bytes. Raw sends (``ENGINE_CORE_DEAD``) pass through untouched.
    """

    def __init__(self, socket: zmq.Socket, length: int) -> None:
        self._socket = socket
        self._length = length

    def send_multipart(self, frames: list[Any], *args: Any, **kwargs: Any) -> Any:
        """Re-encode frame 0 as its first ``length`` array elements, then send."""
        head = msgspec.msgpack.decode(bytes(frames[0]))
        cut = msgspec.msgpack.encode(head[: self._length])
        return self._socket.send_multipart([cut, *frames[1:]], *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)


# -------------------------------------------------------------------- scheduler


@dataclass
class Options:
    """Harness configuration (see ``parse_args``)."""

    handshake: str
    num_engines: int
    first_engine_index: int
    log: str | None
    step_ms: float
    output_form: int
    dead_after_steps: int | None
    dead_rank: int
    enable_output_logprobs: bool
    vocab_size: int
    eos_token_id: int | None
    stream_interval: int
    max_model_len: int
    num_gpu_blocks: int
    page_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    replies: str | None = None


@dataclass
class SimRequest:
    """One admitted request: the engine's decoded input plus generation state."""

    req: TokenizedGenerateReqInput
    max_new: int
    #: The scripted answer (``--replies``), or None: ``sim_rules.token_at``.
    reply: list[int] | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sent_offset: int = 0


class SimRank:
    """One DP rank: engine handshake, then a step loop around the engine's sockets."""

    def __init__(self, opts: Options, rank: int, log: JsonLog) -> None:
        self.opts = opts
        self.rank = rank
        self.engine_index = opts.first_engine_index + rank
        # One context per rank, as each engine rank is its own process with its own
        # context: terminating it on shutdown flushes ENGINE_CORE_DEAD (bounded by linger).
        self.ctx = zmq.Context()
        self.log = log
        self.running: dict[str, SimRequest] = {}
        self.replies = _load_replies(opts.replies)
        self.pending_aborts: dict[str, float] = {}
        self.recv: MsgpackRecvSocket | None = None
        self.send: MsgpackSendSocket | None = None
        self.steps = 0
        #: Set once the handshake finished; only serving ranks are joined at exit.
        self.serving = threading.Event()

    def ready_response(self) -> zmq_wire.WireEngineCoreReadyResponse:
        """The registration map the engine class sends, filled with simulated geometry."""
        o = self.opts
        return zmq_wire.WireEngineCoreReadyResponse(
            max_model_len=o.max_model_len,
            num_gpu_blocks=o.num_gpu_blocks,
            prefix_granularity=o.page_size,
            dtype=zmq_wire.wire_dtype("bfloat16"),
            multimodal_encoder_dtype=None,
            vllm_version=f"tokenspeed-{ENGINE_VERSION}",
            world_size=o.num_engines,
            data_parallel_size=o.num_engines,
            tensor_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=self.rank,
            max_num_seqs=o.max_num_seqs,
            max_num_batched_tokens=o.max_num_batched_tokens,
            instance_id=o.instance_id,
            kv_cache_size_tokens=(o.num_gpu_blocks - 1) * o.page_size,
        )

    def run(self, dialling: threading.Event, stop: threading.Event) -> None:
        """Handshake (blocks until the frontend answers), then serve until ``stop``."""
        dialling.set()
        self.recv, self.send = connect_msgpack_engine(
            self.ctx,
            self.opts.handshake,
            self.engine_index,
            self.ready_response(),
            self.opts.vocab_size,
            enable_output_logprobs=self.opts.enable_output_logprobs,
            supports_prompt_logprobs=False,
        )
        self.serving.set()
        if self.opts.output_form != 14:
            # The adapter owns its PUSH socket privately; swapping in the
            # wrapper is the only way to cut frames the engine class encoded.
            self.send._socket = TruncatingSocket(self.send._socket, self.opts.output_form)
        self.log.write("registered", self.engine_index, dp_rank=self.rank)
        try:
            while not stop.is_set():
                if self._dead_now():
                    break
                self.step()
                stop.wait(self.opts.step_ms / 1000.0)
        finally:
            self.shutdown()

    def _dead_now(self) -> bool:
        o = self.opts
        return (
            o.dead_after_steps is not None
            and self.rank == o.dead_rank
            and self.steps >= o.dead_after_steps
        )

    def shutdown(self) -> None:
        """What ``EventLoop.close`` does for this wire: best-effort ENGINE_CORE_DEAD."""
        assert self.send is not None and self.recv is not None
        self.send.send_engine_dead()
        self.log.write("engine_dead", self.engine_index, steps=self.steps)
        self.send._socket.close(linger=1000)
        self.recv._socket.close(linger=0)
        self.ctx.term()

    # -- one scheduler round -------------------------------------------------

    def step(self) -> None:
        """Drain input, latch the load tail, generate one token per request, publish."""
        for obj in self._drain():
            if isinstance(obj, TokenizedGenerateReqInput):
                self._admit(obj)
            elif isinstance(obj, AbortReq):
                self._abort(obj.rid)
        if not self.running:
            return
        self._latch_load()
        self.steps += 1
        batch: list[tuple[str, SimRequest, Any]] = []
        for rid, sim in list(self.running.items()):
            reason = self._generate(sim)
            output_length = len(sim.output_ids)
            if reason is not None:
                del self.running[rid]
                self.log.write(
                    "finish",
                    self.engine_index,
                    rid=rid,
                    reason=reason.to_json()["type"],
                    completion_tokens=output_length,
                )
                batch.append((rid, sim, reason))
            elif sim_rules.should_emit(sim.req.stream, output_length, self._interval(sim)):
                batch.append((rid, sim, None))
        if batch:
            self.send.send_pyobj(self._batch(batch))

    def _drain(self) -> list[Any]:
        """Everything the engine's input adapter has, non-blocking (one drain per round)."""
        out: list[Any] = []
        while True:
            try:
                out.append(self.recv.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                return out

    def _admit(self, req: TokenizedGenerateReqInput) -> None:
        self.log.write("request", self.engine_index, **struct_to_dict(req))
        if self.pending_aborts.pop(req.rid, None) is not None:
            return  # aborted before it arrived: the engine drops it without output
        reason = req.validation_error
        if reason is None and req.session_params is not None and req.session_params.id:
            reason = f"session id {req.session_params.id} does not exist"
        if reason is not None:
            self._publish_admission_abort(req, reason)
            return
        prompt_len = len(req.input_ids or [])
        max_new = sim_rules.effective_max_new(
            req.sampling_params.max_new_tokens, prompt_len, self.opts.max_model_len
        )
        self.running[req.rid] = SimRequest(
            req=req, max_new=max_new, reply=_reply_for(self.replies, list(req.input_ids or []))
        )

    def _abort(self, rid: str) -> None:
        live = self.running.pop(rid, None) is not None
        self.log.write("abort", self.engine_index, rid=rid, live=live)
        if not live:
            cutoff = time.monotonic() - PENDING_ABORT_TTL_S
            self.pending_aborts = {r: t for r, t in self.pending_aborts.items() if t >= cutoff}
            self.pending_aborts[rid] = time.monotonic()

    def _publish_admission_abort(self, req: TokenizedGenerateReqInput, reason: str) -> None:
        """One terminal abort frame, as ``publish_finished_at_admission`` sends it."""
        self.log.write("finish", self.engine_index, rid=req.rid, reason="abort", error=reason)
        sim = SimRequest(req=req, max_new=0)
        self.send.send_pyobj(
            self._batch([(req.rid, sim, FINISH_ABORT(f"Invalid request: {reason}"))])
        )

    def _generate(self, sim: SimRequest) -> Any:
        """Append one token; return the engine finish-reason object, or None."""
        req, sp = sim.req, sim.req.sampling_params
        prompt_len = len(req.input_ids or [])
        index = len(sim.output_ids)
        if sim.reply is not None and index < len(sim.reply):
            token = sim.reply[index]
        else:
            token = sim_rules.token_at(prompt_len, index, self.opts.vocab_size)
        sim.output_ids.append(token)
        if req.return_logprob:
            sim.logprobs.append(sim_rules.logprob_of(token))
        if len(sim.output_ids) >= sim.max_new:
            return FINISH_LENGTH(length=sim.max_new)
        if not sp.ignore_eos:
            if sp.stop_token_ids and token in sp.stop_token_ids:
                return FINISH_MATCHED_TOKEN(matched=token)
            if self.opts.eos_token_id is not None and token == self.opts.eos_token_id:
                return FINISH_MATCHED_TOKEN(matched=token)
        return None

    def _interval(self, sim: SimRequest) -> int:
        interval = sim.req.sampling_params.stream_interval
        return self.opts.stream_interval if interval is None else interval

    def _latch_load(self) -> None:
        pages = sum(
            math.ceil((len(s.req.input_ids or []) + len(s.output_ids) + 1) / self.opts.page_size)
            for s in self.running.values()
        )
        self.send.set_load_snapshot(len(self.running), 0, pages, self.opts.num_gpu_blocks - 1)

    def _batch(self, items: list[tuple[str, SimRequest, Any]]) -> BatchTokenIDOut:
        """One frame's ``BatchTokenIDOut``: each request's not-yet-sent token slice."""
        rows = []
        for rid, sim, reason in items:
            new_ids = sim.output_ids[sim.sent_offset :]
            new_lps = sim.logprobs[sim.sent_offset :]
            sim.sent_offset = len(sim.output_ids)
            sp = sim.req.sampling_params
            rows.append(
                OutputRow(
                    rid=rid,
                    new_ids=new_ids,
                    finished_reason=reason.to_json() if reason is not None else None,
                    prompt_tokens=len(sim.req.input_ids or []),
                    completion_tokens=len(sim.output_ids),
                    logprob_vals=new_lps if sim.req.return_logprob else [],
                    logprob_idx=new_ids if sim.req.return_logprob else [],
                    skip_special_tokens=sp.skip_special_tokens,
                    spaces_between_special_tokens=sp.spaces_between_special_tokens,
                    no_stop_trim=sp.no_stop_trim,
                )
            )
        return build_batch(rows)


def _load_replies(path: str | None) -> list[tuple[list[int], list[int]]]:
    """The ``--replies`` rules: ``(when, emit)`` id lists, first match wins."""
    if path is None:
        return []
    with open(path, encoding="utf-8") as f:
        return [(list(rule["when"]), list(rule["emit"])) for rule in json.load(f)]


def _reply_for(rules: list[tuple[list[int], list[int]]], prompt: list[int]) -> list[int] | None:
    for when, emit in rules:
        n = len(when)
        if any(prompt[i : i + n] == when for i in range(len(prompt) - n + 1)):
            return emit
    return None


# ------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> Options:
    """Parse the command line into :class:`Options`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--handshake", required=True, help="frontend handshake ROUTER, tcp://host:port")
    p.add_argument("--num-engines", type=int, default=1, help="DP ranks to play")
    p.add_argument("--first-engine-index", type=int, default=0, help="--zmq-engine-index")
    p.add_argument("--log", default=None, help="JSON-lines event log")
    p.add_argument("--step-ms", type=float, default=2.0, help="pause between scheduler rounds")
    p.add_argument("--output-form", type=int, choices=(14, 10, 9), default=14)
    p.add_argument("--dead-after-steps", type=int, default=None, help="generation rounds")
    p.add_argument("--dead-rank", type=int, default=0)
    p.add_argument("--enable-output-logprobs", action="store_true")
    p.add_argument("--vocab-size", type=int, default=sim_rules.DEFAULT_VOCAB_SIZE)
    p.add_argument("--eos-token-id", type=int, default=None)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--num-gpu-blocks", type=int, default=1001)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--instance-id", default="tsfront-interop-harness")
    p.add_argument("--replies", default=None, help="scripted answers (JSON, see the doc)")
    return Options(**vars(p.parse_args(argv)))


def _die_with_parent() -> Callable[[], bool]:
    """Ask Linux to SIGTERM us when the parent dies; return a fallback check."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    parent = os.getppid()
    return lambda: os.getppid() != parent


def main(argv: list[str] | None = None) -> int:
    """Start every rank, print ``HARNESS READY``, run until SIGTERM or parent death."""
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parent_gone = _die_with_parent()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log = JsonLog(opts.log)
    ranks: list[tuple[SimRank, threading.Thread]] = []
    for rank in range(opts.num_engines):
        dialling = threading.Event()
        sim = SimRank(opts, rank, log)
        thread = threading.Thread(target=sim.run, args=(dialling, stop), daemon=True)
        thread.start()
        dialling.wait()
        ranks.append((sim, thread))
    print("HARNESS READY", flush=True)
    while not stop.wait(0.2):
        if parent_gone():
            stop.set()
    deadline = time.monotonic() + 2.0
    for sim, thread in ranks:
        if sim.serving.is_set():  # serving ranks send ENGINE_CORE_DEAD on the way out
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    sys.stdout.flush()
    # Ranks still inside the engine's handshake block in a 600 s poll: leave
    # without interpreter teardown (which could wait on their sockets).
    os._exit(0)


if __name__ == "__main__":
    main()
