"""One simulated TokenSpeed rank: its three sockets, the handshake, and the serving loop.

The rank dials a frontend exactly as a headless TokenSpeed scheduler does (CONTRACT §1): a
handshake DEALER sends HELLO, waits for INIT, sends READY; an input DEALER with the same
identity sends the registration map; an output PUSH carries one ``BatchTokenIDOutSlim`` frame
per step. The step logic lives in :mod:`tsfront.sim.scheduler`; this module moves bytes, owns
time, injects faults and records what arrived so tests can wait for events with deadlines.
Each rank has its own ``zmq.Context`` and runs on its own thread (or as a process's main
thread, see :mod:`tsfront.sim.group`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from tsfront.sim.endpoint import EngineEndpoint, HandshakeFailed, HandshakeTimeout
from tsfront.sim.scheduler import (
    EngineFault,
    OutputRow,
    Scheduler,
    SchedulerConfig,
    ScriptFn,
    StepOutput,
    TokenFn,
)
from tsfront.wire import (
    ABORT,
    ADD,
    ENGINE_CORE_DEAD,
    BatchTokenIDOutSlim,
    EngineRegistration,
    decode_abort,
    decode_add,
    encode_output,
    engine_identity,
)

__all__ = ["EngineOptions", "Received", "SimEngine"]

log = logging.getLogger("tsfront.sim")

_POLL_SLICE_S = 0.02
"""Longest a rank blocks in one poll, so :meth:`SimEngine.stop` is honoured promptly."""

_OUTPUT_LINGER_MS = 200
"""How long closing the output socket may wait to flush queued frames and the sentinel."""


@dataclass(frozen=True)
class EngineOptions:
    """Everything configurable about one simulated rank (all have engine-like defaults).

    Timing and model: ``step_ms`` (time per decode step), ``max_batch`` (requests decoded per
    step; ``None`` → ``max_num_seqs // data_parallel_size``), ``max_model_len``,
    ``vocab_size``, ``eos_token_id``, ``page_size`` (KV page and prefix granularity),
    ``kv_total_pages``, ``stream_interval`` (``--stream-interval``), ``chunk_tokens`` (streamed
    chunks of 1 to N tokens, sizes drawn per request and position; see
    :class:`tsfront.sim.scheduler.SchedulerConfig`), ``prefix_cache``,
    ``prefix_cache_pages`` (the cache's capacity in pages; ``None`` → 65,536),
    ``enable_output_logprobs``, ``token_fn`` (see :func:`tsfront.sim.scheduler.default_token`;
    must be a module-level function in process mode), ``script`` (scripted answers, see
    :mod:`tsfront.sim.script`; picklable for process mode).

    Wire generation: ``output_form`` is the output array length (9, 10, 14, or more for a
    future engine); ``legacy_registration`` sends Aug3's 18-key map with ``block_size``.

    Registration: ``max_num_seqs``, ``max_num_batched_tokens``, ``dtype``, ``instance_id``,
    ``vllm_version``, ``tensor_parallel_size``, ``world_size`` (``None`` → data-parallel size
    * TP), ``kv_cache_size_tokens`` (``None`` → ``kv_total_pages * page_size``).

    Faults (``None`` = never; counted in steps that decoded at least one request):
    ``dead_after_steps`` sends the raw ``ENGINE_CORE_DEAD`` frame then stops;
    ``exit_after_steps`` vanishes without it (the rank closes its sockets, then
    ``os._exit(1)`` when ``hard_exit``, as in process mode and ``tsfront sim``);
    ``silent_after_steps`` stops emitting and stepping but keeps its sockets open and keeps
    receiving. A rank that is stuck for a while and then recovers is `SimEngine.stall` /
    `SimEngine.resume` (a control of the running rank, not an option).
    ``handshake_timeout_s`` is how long to wait for INIT (the engine's 600 s).

    Disaggregated serving (CONTRACT §6): ``disaggregation_mode`` ``"prefill"`` makes the rank
    finish every request after one token (its bootstrap token, ``"length"``), as a prefill
    engine does once the KV transfer is done; ``"decode"`` makes it a decode rank, whose first
    output token is that same bootstrap token (both compute position 0 with the same
    ``token_fn``). Either refuses (terminal ``"abort"``) an ADD without a ``bootstrap_room``.
    ``prefill_abort`` makes a prefill rank end every request with ``"abort"`` instead (a
    failed KV transfer).
    ``input_reconnect_ms`` sets the input DEALER's reconnect interval (``ZMQ_RECONNECT_IVL``;
    ``None``: ZeroMQ's 100 ms, as the engine), so that after a frontend restart the input
    can come back well after the output PUSH (which keeps the default).
    """

    step_ms: float = 2.0
    max_batch: int | None = None
    max_model_len: int = 32768
    vocab_size: int = 32000
    eos_token_id: int = 2
    page_size: int = 64
    kv_total_pages: int = 4095
    stream_interval: int = 1
    chunk_tokens: int = 1
    prefix_cache: bool = True
    prefix_cache_pages: int | None = None
    enable_output_logprobs: bool = True
    token_fn: TokenFn | None = None
    script: ScriptFn | None = None
    output_form: int = 14
    legacy_registration: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    dtype: str = "bfloat16"
    instance_id: str = "tsfront-sim"
    vllm_version: str = "tokenspeed-0.1.1"
    tensor_parallel_size: int = 1
    world_size: int | None = None
    kv_cache_size_tokens: int | None = None
    dead_after_steps: int | None = None
    exit_after_steps: int | None = None
    silent_after_steps: int | None = None
    handshake_timeout_s: float = 600.0
    input_reconnect_ms: int | None = None
    hard_exit: bool = False
    disaggregation_mode: str | None = None
    prefill_abort: bool = False

    def __post_init__(self) -> None:
        # Refuse what no engine could be configured with, before a rank dials anything.
        if self.disaggregation_mode not in (None, "prefill", "decode"):
            raise ValueError(
                f"disaggregation_mode={self.disaggregation_mode!r}: None, 'prefill' or 'decode'"
            )
        if not (isinstance(self.step_ms, (int, float)) and self.step_ms >= 0):
            raise ValueError(f"step_ms={self.step_ms!r}: must be a number >= 0")
        if not isinstance(self.output_form, int) or self.output_form < 9:
            raise ValueError(
                f"output_form={self.output_form!r}: the output array has 9 (Aug3), 10 (Aug12), "
                "14 (0.1.1) or more elements"
            )
        positive = ("max_model_len", "vocab_size", "page_size", "kv_total_pages")
        counts = ("stream_interval", "chunk_tokens", "max_num_seqs", "max_num_batched_tokens")
        for name in (*positive, *counts):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if self.max_batch is not None and (
            not isinstance(self.max_batch, int) or self.max_batch < 1
        ):
            raise ValueError(f"max_batch={self.max_batch!r}: must be an integer >= 1")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(
                f"eos_token_id={self.eos_token_id!r}: must be in 0..{self.vocab_size - 1} "
                "(below vocab_size)"
            )
        for name in ("dead_after_steps", "exit_after_steps", "silent_after_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}={value!r}: must be an integer >= 0")
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"handshake_timeout_s={self.handshake_timeout_s!r}: must be > 0")

    def replace(self, **changes: Any) -> EngineOptions:
        """Return a copy with ``changes`` applied (unknown names raise ``TypeError``)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Received:
    """One entry of a rank's input log.

    ``kind`` is ``"add"`` (``request`` is the decoded request), ``"abort"`` (one per rid) or
    ``"dropped"`` (a malformed message; ``detail`` says why, as the engine logs it).
    """

    kind: str
    rid: str | None = None
    request: Any = None
    detail: str = ""


class _Stop(Exception):
    """Unwinds the serving loop when the rank is told to stop."""


class SimEngine:
    """One simulated rank with identity ``engine_identity(engine_index)``.

    Run it with :meth:`start` (a daemon thread) / :meth:`stop`, or call :meth:`run` on the
    current thread. Hooks for tests: :meth:`log`, :meth:`requests`, :meth:`aborts`,
    :meth:`counters`, :meth:`wait_registered`, :meth:`wait_request`, :meth:`wait_abort`,
    :meth:`wait_stopped`; ``outcome`` says how the rank ended (``"stopped"``, ``"dead"``,
    ``"exited"``, ``"handshake_failed"``, ``"timeout"``, ``"crashed"``). ``condition`` lets
    several ranks share one condition variable, so a group can wait for an event on any rank.
    """

    def __init__(
        self,
        handshake_address: str,
        engine_index: int,
        *,
        data_parallel_rank: int = 0,
        data_parallel_size: int = 1,
        options: EngineOptions | None = None,
        condition: threading.Condition | None = None,
    ) -> None:
        self.handshake_address = handshake_address
        self.engine_index = engine_index
        self.identity = engine_identity(engine_index)
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.options = opts = options or EngineOptions()
        max_batch = opts.max_batch or max(1, opts.max_num_seqs // data_parallel_size)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_batch=max_batch,
                max_model_len=opts.max_model_len,
                vocab_size=opts.vocab_size,
                eos_token_id=opts.eos_token_id,
                page_size=opts.page_size,
                kv_total_pages=opts.kv_total_pages,
                stream_interval=opts.stream_interval,
                chunk_tokens=opts.chunk_tokens,
                prefix_cache=opts.prefix_cache,
                prefix_cache_pages=opts.prefix_cache_pages,
                enable_output_logprobs=opts.enable_output_logprobs,
            ),
            token_fn=opts.token_fn,
            script=opts.script,
        )
        self.outcome: str | None = None
        self.init_addresses: tuple[str, str] | None = None
        self._stop = threading.Event()
        self._registered = threading.Event()
        self._ended = threading.Event()
        self._cond = condition or threading.Condition()
        self._log: list[Received] = []
        self._counters = dict.fromkeys(
            ("adds", "aborts", "dropped", "rejected", "steps", "frames", "tokens", "finished"), 0
        )
        # Summed over finished requests: what the prefix cache saved (``cached_tokens``).
        self._counters.update(prompt_tokens=0, cached_tokens=0)
        self._silent = False
        # stall(): the serving loop freezes (sets _frozen) until resume() clears _stall.
        self._stall = threading.Event()
        self._frozen = threading.Event()
        self._sentinel_on_stop = True
        self._thread: threading.Thread | None = None
        self._out: zmq.Socket | None = None
        self._frontend: zmq.Socket | None = None  # monitor of the input connection
        #: Whether the input connection to the frontend is up (None before the first connect).
        self.frontend_connected: bool | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Run the rank on a new daemon thread."""
        self._thread = threading.Thread(
            target=self.run, name=f"tsfront-sim-engine-{self.engine_index}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0, *, sentinel: bool = True) -> bool:
        """Ask the rank to shut down and join its thread; returns whether it ended in time.

        With ``sentinel`` (the default) a rank that is serving sends ``ENGINE_CORE_DEAD`` on
        the way out, as the engine's ``close()`` does on SIGTERM.
        """
        self.request_stop(sentinel=sentinel)
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return self._ended.wait(timeout)

    def request_stop(self, *, sentinel: bool = True) -> None:
        """Tell the rank to shut down without waiting (safe from a signal handler)."""
        self._sentinel_on_stop = sentinel
        self._stop.set()

    def stall(self, timeout: float = 5.0) -> None:
        """Freeze the rank as a stuck engine is frozen (a hung kernel, a wedged scheduler):
        from now on it reads no input, steps no request and sends nothing, while its sockets
        stay connected and libzmq's I/O thread keeps answering the frontend's heartbeats, so
        nothing at the connection level says it is stuck. Returns once the serving loop has
        frozen (no frame leaves after that); raises ``TimeoutError`` if it does not within
        ``timeout``. `resume` lets it go on where it stopped."""
        self._stall.set()
        if not self._frozen.wait(timeout):
            raise TimeoutError(f"engine {self.engine_index} did not freeze in {timeout}s")

    def resume(self) -> None:
        """End a `stall`: the rank reads what queued meanwhile and steps again."""
        self._stall.clear()

    @property
    def stalled(self) -> bool:
        """Whether the rank is frozen by `stall`."""
        return self._frozen.is_set()

    @property
    def alive(self) -> bool:
        """Whether the serving thread is still running."""
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> str:
        """Handshake and serve on the current thread until stopped or a fault; returns outcome."""
        context = zmq.Context()
        endpoint = EngineEndpoint(context, self.handshake_address, self.engine_index)
        try:
            self.outcome = self._run(endpoint)
        except _Stop:
            self.outcome = "stopped"
        except Exception:
            log.exception("engine %d: serving loop crashed", self.engine_index)
            self.outcome = "crashed"
            self._send_sentinel()
        finally:
            if self.outcome == "stopped" and self._sentinel_on_stop:
                self._send_sentinel()
            if self._frontend is not None:
                self._frontend.close(linger=0)
            endpoint.close(output_linger_ms=_OUTPUT_LINGER_MS)
            context.term()
            if self.outcome == "exited" and self.options.hard_exit:
                os._exit(1)
            with self._cond:
                self._ended.set()
                self._cond.notify_all()
        return self.outcome

    # -- hooks --------------------------------------------------------------------------------

    def log(self) -> list[Received]:
        """A copy of everything received so far, in arrival order."""
        with self._cond:
            return list(self._log)

    def requests(self) -> list[Any]:
        """The decoded ADD requests received so far."""
        return [entry.request for entry in self.log() if entry.kind == "add"]

    def aborts(self) -> list[str]:
        """The rids of every ABORT received so far (one entry per rid)."""
        # An abort entry always has its rid.
        return [cast(str, entry.rid) for entry in self.log() if entry.kind == "abort"]

    def counters(self) -> dict[str, int]:
        """A snapshot of ``adds``, ``aborts``, ``dropped``, ``rejected``, ``steps``,
        ``frames``, ``tokens`` (generated tokens sent), ``finished`` (terminal rows), and
        ``prompt_tokens`` / ``cached_tokens`` summed over those terminal rows."""
        with self._cond:
            return dict(self._counters)

    def wait_registered(self, timeout: float | None) -> bool:
        """Wait until the registration frame was sent (``timeout`` None: for as long as it
        takes); raises ``TimeoutError`` otherwise."""
        if not self._registered.wait(timeout):
            raise TimeoutError(f"engine {self.engine_index} did not register in {timeout}s")
        return True

    def wait_request(self, rid: str, timeout: float) -> Any:
        """Wait for an ADD with ``rid`` and return the decoded request."""
        entry = self._wait_for(lambda e: e.kind == "add" and e.rid == rid, timeout, rid)
        return entry.request

    def wait_abort(self, rid: str, timeout: float) -> bool:
        """Wait for an ABORT naming ``rid``."""
        self._wait_for(lambda e: e.kind == "abort" and e.rid == rid, timeout, rid)
        return True

    def wait_stopped(self, timeout: float) -> str:
        """Wait until the rank has ended (any outcome) and return ``outcome``."""
        if not self._ended.wait(timeout):
            raise TimeoutError(f"engine {self.engine_index} still running after {timeout}s")
        assert self.outcome is not None
        return self.outcome

    def _wait_for(self, match: Callable[[Received], bool], timeout: float, rid: str) -> Received:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for entry in self._log:
                    if match(entry):
                        return entry
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"engine {self.engine_index}: no event for {rid!r}")
                self._cond.wait(remaining)

    def _record(self, entry: Received, counter: str) -> None:
        with self._cond:
            self._log.append(entry)
            self._counters[counter] += 1
            self._cond.notify_all()

    def _count(self, **deltas: int) -> None:
        with self._cond:
            for name, delta in deltas.items():
                self._counters[name] += delta

    # -- handshake ----------------------------------------------------------------------------

    def _run(self, endpoint: EngineEndpoint) -> str:
        opts = self.options

        def configure_input(inp: zmq.Socket) -> None:
            # Watch the input connection so the rank can say when its frontend goes away.
            self._frontend = inp.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            if opts.input_reconnect_ms is not None:
                inp.setsockopt(zmq.RECONNECT_IVL, opts.input_reconnect_ms)

        try:
            inp = endpoint.dial(
                self._registration(),
                timeout_s=opts.handshake_timeout_s,
                should_stop=self._check_stop,
                legacy_block_size=opts.legacy_registration,
                configure_input=configure_input,
                output_linger_ms=_OUTPUT_LINGER_MS,
            )
        except HandshakeTimeout:
            log.error(
                "engine %d: no INIT within %gs from %s: is a frontend bound there (tsfront "
                "serve, io and generate print 'handshake: ADDR')? Frontends handshake each "
                "rank once: one that already took this identity waits for a restarted rank",
                self.engine_index,
                opts.handshake_timeout_s,
                endpoint.handshake_address,
            )
            return "timeout"
        except HandshakeFailed as exc:
            log.error("engine %d: %s, exiting", self.engine_index, exc)
            return "handshake_failed"
        self.init_addresses = endpoint.addresses
        self._out = endpoint.output
        self._registered.set()
        log.info("engine %d registered (dp rank %d)", self.engine_index, self.data_parallel_rank)
        return self._serve(inp)

    def _registration(self) -> EngineRegistration:
        opts = self.options
        tp = opts.tensor_parallel_size
        return EngineRegistration(
            max_model_len=opts.max_model_len,
            num_gpu_blocks=opts.kv_total_pages + 1,
            prefix_granularity=opts.page_size,
            dp_stats_address=None,
            dtype=opts.dtype,
            multimodal_encoder_dtype=None,
            vllm_version=opts.vllm_version,
            world_size=opts.world_size or self.data_parallel_size * tp,
            data_parallel_size=self.data_parallel_size,
            tensor_parallel_size=tp,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=self.data_parallel_rank,
            max_num_seqs=opts.max_num_seqs,
            max_num_batched_tokens=opts.max_num_batched_tokens,
            instance_id=opts.instance_id,
            kv_cache_size_tokens=(
                opts.kv_cache_size_tokens
                if opts.kv_cache_size_tokens is not None
                else opts.kv_total_pages * opts.page_size
            ),
            kv_cache_max_concurrency=None,
            kv_events_config=None,
        )

    # -- serving ------------------------------------------------------------------------------

    def _serve(self, inp: zmq.Socket) -> str:
        opts = self.options
        step_s = opts.step_ms / 1000.0
        if opts.dead_after_steps == 0:
            return self._die_with_sentinel()
        if opts.exit_after_steps == 0:
            return self._exit()
        self._silent = opts.silent_after_steps == 0
        next_step = time.monotonic()
        while True:
            self._check_stop()
            if self._stall.is_set():
                self._frozen.set()
                while self._stall.is_set():
                    self._check_stop()
                    self._stop.wait(_POLL_SLICE_S)
                self._frozen.clear()
                next_step = time.monotonic()
                continue
            self._watch_frontend()
            if self.scheduler.busy and not self._silent:
                timeout = max(0.0, min(next_step - time.monotonic(), _POLL_SLICE_S))
            else:
                timeout = _POLL_SLICE_S
            # Round up: a 0 ms poll before the step is due would spin.
            if inp.poll(math.ceil(timeout * 1000)) and self._drain(inp):
                return self._die_with_sentinel()
            if not self.scheduler.busy or self._silent:
                # Idle: the first step after a request arrives runs at once.
                next_step = time.monotonic()
                continue
            if time.monotonic() < next_step:
                continue
            output = self.scheduler.step()
            steps = self.scheduler.steps
            self._count(steps=1)
            if output is not None:
                self._publish(output)
            next_step = max(next_step + step_s, time.monotonic())
            if opts.dead_after_steps is not None and steps >= opts.dead_after_steps:
                return self._die_with_sentinel()
            if opts.exit_after_steps is not None and steps >= opts.exit_after_steps:
                return self._exit()
            if opts.silent_after_steps is not None and steps >= opts.silent_after_steps:
                log.warning("engine %d: going silent after %d steps", self.engine_index, steps)
                self._silent = True

    def _watch_frontend(self) -> None:
        """Log when the frontend's input ROUTER goes away (and when ZMQ redials it)."""
        while True:
            try:
                # Set in _run before _serve, whose loop calls this.
                event = recv_monitor_message(cast(zmq.Socket, self._frontend), zmq.NOBLOCK)
            except zmq.Again:
                return
            address = self.init_addresses[0] if self.init_addresses else "?"
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.frontend_connected = False
                # INFO: `tsfront sim` shows it; a demo or test tearing down its own frontend
                # first does not print it.
                log.info(
                    "engine %d: the frontend went away (input connection to %s closed); an "
                    "engine handshakes once per start, so a new frontend needs this rank "
                    "restarted",
                    self.engine_index,
                    address,
                )
            elif event["event"] == zmq.EVENT_CONNECTED:
                if self.frontend_connected is False:
                    log.info("engine %d: reconnected to %s", self.engine_index, address)
                self.frontend_connected = True

    def _drain(self, inp: zmq.Socket) -> bool:
        """Handle every queued input message; returns True if one killed the engine."""
        while True:
            try:
                frames = inp.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            if self._handle(frames):
                return True

    def _handle(self, frames: list[bytes]) -> bool:
        sizes = [len(f) for f in frames]
        if len(frames) < 2 or frames[0] not in (ADD, ABORT):
            return self._drop(f"bad framing ({len(frames)} frames, sizes={sizes})")
        now = time.monotonic()
        if frames[0] == ABORT:
            try:
                rids = decode_abort(frames[1])
            except Exception as exc:
                return self._drop(f"undecodable ABORT: {exc}")
            self.scheduler.abort(rids, now)
            for rid in rids:
                self._record(Received("abort", rid), "aborts")
            return False
        try:
            request = decode_add(frames[1])
        except Exception as exc:
            return self._drop(f"undecodable ADD: {exc}")
        if not isinstance(request.rid, str):
            return self._drop(f"ADD with rid {request.rid!r}")
        self._record(Received("add", request.rid, request), "adds")
        mode = self.options.disaggregation_mode
        if mode is not None:
            if request.bootstrap_room is None or (mode == "prefill" and self.options.prefill_abort):
                # No room to transfer the KV cache under (or a failed transfer): abort.
                prompt = len(request.input_ids or ())
                row = OutputRow(request.rid, [], "abort", prompt, 0, 0, [], [])
                self._count(rejected=1)
                self._publish(StepOutput([row], self.scheduler.last_load))
                return False
            if mode == "prefill":
                # The prefill engine computes the bootstrap token and finishes.
                sp = msgspec.structs.replace(request.sampling_params, max_new_tokens=1)
                request = msgspec.structs.replace(request, sampling_params=sp)
        try:
            output = self.scheduler.add(request, now)
        except EngineFault as exc:
            log.error("engine %d: scheduler loop died: %s", self.engine_index, exc)
            return True
        if output is not None:
            self._count(rejected=1)
            self._publish(output)
        return False

    def _drop(self, why: str) -> bool:
        log.warning(
            "engine %d: msgpack input: dropping malformed message: %s", self.engine_index, why
        )
        self._record(Received("dropped", detail=why), "dropped")
        return False

    def _publish(self, output: StepOutput) -> None:
        if self._silent:
            return
        rows, load = output.rows, output.load
        batch = BatchTokenIDOutSlim(
            rids=[r.rid for r in rows],
            output_ids=[r.output_ids for r in rows],
            finished_reasons=[r.finished_reason for r in rows],
            prompt_tokens=[r.prompt_tokens for r in rows],
            completion_tokens=[r.completion_tokens for r in rows],
            cached_tokens=[r.cached_tokens for r in rows],
            output_token_logprobs_val=[r.logprob_vals for r in rows],
            output_token_logprobs_idx=[r.logprob_idx for r in rows],
            engine_index=self.engine_index,
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            kv_active_pages=load.kv_active_pages,
            kv_total_pages=load.kv_total_pages,
        )
        self._send(encode_output(batch, form=self.options.output_form))
        self._count(
            frames=1,
            tokens=sum(len(r.output_ids) for r in rows),
            finished=sum(1 for r in rows if r.finished_reason),
            prompt_tokens=sum(r.prompt_tokens for r in rows if r.finished_reason),
            cached_tokens=sum(r.cached_tokens for r in rows if r.finished_reason),
        )

    def _send(self, frame: bytes) -> None:
        """Blocking send as the engine does (it stalls at the HWM), but still stoppable."""
        assert self._out is not None
        while True:
            try:
                self._out.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:
                self._check_stop()
                self._out.poll(int(_POLL_SLICE_S * 1000), zmq.POLLOUT)

    def _send_sentinel(self) -> None:
        if self._out is None:
            return
        try:
            self._out.send(ENGINE_CORE_DEAD, zmq.NOBLOCK)
        except zmq.ZMQError:
            log.warning("engine %d: could not queue ENGINE_CORE_DEAD", self.engine_index)

    def _die_with_sentinel(self) -> str:
        log.error("engine %d: sending ENGINE_CORE_DEAD and stopping", self.engine_index)
        self._send_sentinel()
        return "dead"

    def _exit(self) -> str:
        # No sentinel; frames of earlier steps still flush, as they would have left a real
        # process long before it died. With hard_exit, run() then ends the process.
        log.error("engine %d: exiting without ENGINE_CORE_DEAD", self.engine_index)
        return "exited"

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Stop
