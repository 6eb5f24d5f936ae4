"""Replay engines: handshake like a TokenSpeed rank, then push PRE-ENCODED output frames.

The engine side of a throughput run must never be the bottleneck, so nothing is encoded while
a run is timed: :func:`build_frames` encodes a short cycle of ``BatchTokenIDOutSlim`` frames
(one new token per request per step, as a decode step emits) plus the finishing frame once,
and a burst sends them back to back from the cycle. The same bytes go to the baselines
(:mod:`tsfront.bench.baselines`), so every design is measured on identical frames.

Latency runs use *stamped* frames: every request's token is a placeholder whose 4-byte
msgpack payload is patched, right before the send, with the send time (CLOCK_MONOTONIC in
100 ns units, modulo 2**30, with bit 30 set so the int keeps its ``0xce`` uint32 encoding).
The consumer compares it with its own ``time.monotonic_ns()`` (the clock is system-wide).

:func:`engine_main` is the body of one engine process, driven over a `multiprocessing` pipe:
it handshakes (HELLO / INIT / READY, registration on the input DEALER, output PUSH) with
:class:`tsfront.sim.endpoint.EngineEndpoint`, as the simulator does, records when each ADD
arrives, and runs the bursts and paced sends the driver asks for, to its output PUSH or to a
baseline receiver's PULL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import zmq

from tsfront.sim.endpoint import EngineEndpoint
from tsfront.wire import ADD, BatchTokenIDOutSlim, EngineRegistration, decode_add, encode_output

STAMP_MASK = (1 << 30) - 1
STAMP_BIT = 1 << 30
PLACEHOLDER = 0x7FFFFFF0
_PLACEHOLDER_BYTES = b"\xce" + PLACEHOLDER.to_bytes(4, "big")
CYCLE = 8
PROMPT_TOKENS = 1024
CACHED_TOKENS = 512


def stamp_now() -> int:
    """The current CLOCK_MONOTONIC time as a stamp token (100 ns units, 30 bits, bit 30 set)."""
    return ((time.monotonic_ns() // 100) & STAMP_MASK) | STAMP_BIT


def stamp_age_ns(stamp: int, now_ns: int | None = None) -> int:
    """Nanoseconds since ``stamp`` was taken (correct across the 107 s wrap)."""
    if now_ns is None:
        now_ns = time.monotonic_ns()
    return (((now_ns // 100) - stamp) & STAMP_MASK) * 100


def make_rids(prefix: str, n: int) -> list[str]:
    """``n`` distinct rids of 32 characters (the length of a uuid4 hex, as servers use)."""
    return [f"{prefix}-{i:08d}".rjust(32, "0") for i in range(n)]


def batch_of(
    rids: list[str], tokens: list[int], completion: int, finished: str, engine_index: int
) -> BatchTokenIDOutSlim:
    n = len(rids)
    return BatchTokenIDOutSlim(
        rids=list(rids),
        output_ids=[[t] for t in tokens],
        finished_reasons=[finished] * n,
        prompt_tokens=[PROMPT_TOKENS] * n,
        completion_tokens=[completion] * n,
        cached_tokens=[CACHED_TOKENS] * n,
        output_token_logprobs_val=[[] for _ in range(n)],
        output_token_logprobs_idx=[[] for _ in range(n)],
        engine_index=engine_index,
        num_running=n,
        num_waiting=0,
        kv_active_pages=n * 17,
        kv_total_pages=65536,
    )


@dataclass
class FrameSet:
    """Pre-encoded frames of one engine for one set of requests."""

    running: list[bytes]  # CYCLE decode steps, one token per request each
    final: bytes  # the step that finishes every request ("length")
    rows: int

    def burst(self, k: int) -> list[bytes]:
        """The ``k`` frames of a burst: ``k - 1`` running steps then the finishing one."""
        return [self.running[i % len(self.running)] for i in range(k - 1)] + [self.final]


def build_frames(rids: list[str], engine_index: int) -> FrameSet:
    """Encode the cycle of running frames and the finishing frame for ``rids`` (form 14)."""
    running = []
    for c in range(CYCLE):
        tokens = [1000 + (i * 7919 + c * 131) % 59000 for i in range(len(rids))]
        running.append(encode_output(batch_of(rids, tokens, c + 1, "", engine_index)))
    tokens = [2] * len(rids)
    final = encode_output(batch_of(rids, tokens, CYCLE + 1, "length", engine_index))
    return FrameSet(running, final, len(rids))


class StampedFrame:
    """A frame template whose every token is patched with the send time before each send."""

    def __init__(self, rids: list[str], engine_index: int, finished: str) -> None:
        tmpl = encode_output(batch_of(rids, [PLACEHOLDER] * len(rids), 1, finished, engine_index))
        self.buf = bytearray(tmpl)
        self.offsets = []
        at = tmpl.find(_PLACEHOLDER_BYTES)
        while at >= 0:
            self.offsets.append(at + 1)
            at = tmpl.find(_PLACEHOLDER_BYTES, at + 5)
        if len(self.offsets) != len(rids):
            raise RuntimeError("placeholder search found the wrong number of tokens")

    def stamped(self) -> bytearray:
        """Stamp the template with the current time; returns the (reused) buffer."""
        b = stamp_now().to_bytes(4, "big")
        buf = self.buf
        for o in self.offsets:
            buf[o : o + 4] = b
        return buf

    @property
    def first_offset(self) -> int:
        """Byte offset of the first stamp slot in the frame."""
        return self.offsets[0]


def registration(rank: int, size: int) -> EngineRegistration:
    """A registration like :class:`tsfront.sim.SimEngine`'s defaults."""
    return EngineRegistration(
        max_model_len=32768,
        num_gpu_blocks=65537,
        prefix_granularity=64,
        dp_stats_address=None,
        dtype="bfloat16",
        multimodal_encoder_dtype=None,
        vllm_version="tokenspeed-0.1.1",
        world_size=size,
        data_parallel_size=size,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        data_parallel_rank=rank,
        max_num_seqs=65536,
        max_num_batched_tokens=8192,
        instance_id="tsfront-bench",
        kv_cache_size_tokens=65536 * 64,
        kv_cache_max_concurrency=None,
        kv_events_config=None,
    )


class ReplayEngine:
    """One engine rank (handshaking) or a plain pusher (baselines), in the current process."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.ctx = zmq.Context(1)
        self.endpoint: EngineEndpoint | None = None
        self.inp: zmq.Socket | None = None
        self.out: zmq.Socket | None = None
        self.frames: dict[str, FrameSet] = {}
        self.stamped: dict[str, tuple[StampedFrame, StampedFrame]] = {}
        self.arrivals: dict[str, int] = {}
        self.targets: dict[str, zmq.Socket] = {}

    def handshake(self, address: str, engine_index: int, rank: int, size: int) -> None:
        """Dial the frontend as engine ``engine_index`` and register, like a TokenSpeed rank."""
        endpoint = EngineEndpoint(self.ctx, address, engine_index)
        self.endpoint = endpoint
        self.inp = endpoint.dial(registration(rank, size), timeout_s=30.0, output_linger_ms=1000)
        self.out = endpoint.output

    def _target(self, address: str | None) -> zmq.Socket:
        if address is None:
            assert self.out is not None
            return self.out
        sock = self.targets.get(address)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            self.targets[address] = sock
        return sock

    def _drain_input(self) -> None:
        if self.inp is None:
            return
        while True:
            try:
                frames = self.inp.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            now = time.monotonic_ns()
            if len(frames) >= 2 and frames[0] == ADD:
                self.arrivals[decode_add(frames[1]).rid] = now

    def serve(self) -> None:
        """Replay frames on command until told to stop."""
        poller = zmq.Poller()
        if self.inp is not None:
            poller.register(self.inp, zmq.POLLIN)
        poller.register(self.conn.fileno(), zmq.POLLIN)
        waiting_for = None
        while True:
            events = dict(poller.poll(1000))
            if self.inp is not None and self.inp in events:
                self._drain_input()
            if waiting_for is not None and len(self.arrivals) >= waiting_for:
                self.conn.send(("got", self.arrivals))
                self.arrivals = {}
                waiting_for = None
            if self.conn.fileno() not in events:
                continue
            cmd, *args = self.conn.recv()
            if cmd == "exit":
                break
            if cmd == "build":
                name, rids, engine_index = args
                self.frames[name] = build_frames(rids, engine_index)
                self.stamped[name] = (
                    StampedFrame(rids, engine_index, ""),
                    StampedFrame(rids, engine_index, "length"),
                )
                self.conn.send(("built", self.stamped[name][0].first_offset))
            elif cmd == "expect":
                waiting_for = args[0]
                if len(self.arrivals) >= waiting_for:
                    self.conn.send(("got", self.arrivals))
                    self.arrivals = {}
                    waiting_for = None
            elif cmd == "burst":
                name, k, address = args
                frames = self.frames[name].burst(k)
                send = self._target(address).send
                t0 = time.monotonic()
                for f in frames:
                    send(f)
                self.conn.send(("sent", time.monotonic() - t0))
            elif cmd == "paced":
                name, k, interval, address = args
                sock = self._target(address)
                running, final = self.stamped[name]
                nxt = time.monotonic()
                for i in range(k):
                    nxt += interval
                    pause = nxt - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    self._drain_input()
                    sock.send(final.stamped() if i == k - 1 else running.stamped())
                self.conn.send(("sent", k))
            else:
                raise RuntimeError(f"unknown command {cmd!r}")

    def close(self) -> None:
        """Close every socket and the ZMQ context."""
        if self.endpoint is not None:
            self.endpoint.close()
        for s in self.targets.values():
            s.close()
        self.ctx.term()


def engine_main(conn: Connection, handshake: tuple[str, int, int, int] | None) -> None:
    """Process body: handshake (if ``handshake`` = (address, index, rank, size)), then serve."""
    engine = ReplayEngine(conn)
    try:
        if handshake is not None:
            engine.handshake(*handshake)
        conn.send(("ready",))
        engine.serve()
    finally:
        engine.close()
