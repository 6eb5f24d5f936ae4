"""Writers of the metrics area: `Recorder` in each worker, `IOStats` in the I/O process.

A worker's `Recorder` owns its place's block (`tsfront.metrics.layout`) and writes it in place
with single aligned 8-byte stores, so a scrape in any process sees it at once and a SIGKILLed
worker loses nothing it recorded. What it records, per request:

* **time to first token**: from `EngineClient.generate` being called to the delivery of the
  first chunk that carries a token;
* **inter-token latency**, as SGLang records it: a chunk of ``k`` tokens arriving ``t`` after
  the previous chunk with tokens counts ``k`` observations of ``t / k`` each (``k`` added to
  the bucket of ``t / k``) and adds ``t`` to the sum, so ``_sum / _count`` is the mean time per
  token. A first chunk of ``k`` tokens gives its first token to time-to-first-token and counts
  the other ``k - 1`` as observations of 0 s (they arrived with it), so the ``_count`` is
  exactly every delivered token but each request's first;
* **end-to-end latency** (``generate`` to the last chunk), and the prompt and generation token
  counts as the engine reported them on that last chunk, for requests the engine finished;
* counters: requests submitted, prompt / generation / cached prompt tokens, requests finished
  by reason (each ends in exactly one), ``generate`` refusals by error class, aborts sent.

Chunks are timed once per wake-up (every update of one `Reader.poll` gets the same clock
reading), which is when the worker saw them.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from tsfront.ipc import region as shm
from tsfront.metrics import layout as L

# Local terminal codes → the StreamError class the stream raises (see tsfront.client.stream).
_ERROR_REASON = {
    shm.FIN_ENGINE_DEAD: "EngineDied",
    shm.FIN_SEND_TIMEOUT: "SendTimeout",
    shm.FIN_DUPLICATE: "StreamRejected",
    shm.FIN_NO_ENGINE: "StreamRejected",
    shm.FIN_IO_STOPPING: "IOProcessDied",
    shm.FIN_RID_ABORTED: "StreamRejected",
    shm.FIN_DEADLINE: "DeadlineExceeded",
    shm.FIN_PREFILL_DEAD: "EngineDied",
    shm.FIN_PREFILL_SEND_TIMEOUT: "SendTimeout",
    shm.FIN_PREFILL_ABORTED: "PrefillFailed",
    shm.FIN_ENGINE_STALLED: "EngineStalled",
}
_FIN_LOCAL = min(_ERROR_REASON)  # codes from here on are local ends, below are the engine's
# The engine's finish codes → reason (tsfront.ipc.region.FINISH_REASONS).
_ENGINE_REASON = shm.FINISH_REASONS

_NS = 1_000_000_000


def _bounds_ns(bounds: tuple[float, ...]) -> list[int]:
    # A value v falls in the first bucket whose bound b has v <= b (Prometheus' ``le``):
    # bisect_left over integer-ns bounds gives exactly that index (len(bounds) is +Inf).
    return [round(b * _NS) for b in bounds]


class Recorder:
    """The request metrics of one worker, written into its block of the shared region."""

    def __init__(self, region: shm.Region, worker: int, slots: int) -> None:
        ml = region.metrics_layout
        self.words = region.words(ml.worker_offset(worker), L.WORKER_WORDS)
        n = slots
        self._t0 = [0] * n  # ns at generate() for the request in each local slot
        self._last = [0] * n  # ns of its last chunk with tokens (0: none yet)
        self._open = 0
        self.words[L.W_OPEN] = 0
        self._ttft = _Histogram(self, "ttft")
        self._itl_b, self._itl_s = L.HIST_WORDS["itl"]
        self._itl_bounds = _bounds_ns(L.ITL_BUCKETS)
        self._e2e = _Histogram(self, "e2e")
        self._prompt = _Histogram(self, "prompt_tokens")
        self._gen = _Histogram(self, "generation_tokens")
        self._finished = {r: L.W_FINISHED + i for i, r in enumerate(L.FINISH_REASONS)}
        self._refused = {c: L.W_REFUSED + i for i, c in enumerate(L.REFUSAL_CLASSES)}

    # -- request lifecycle ---------------------------------------------------------------

    def started(self, slot: int, t0_ns: int) -> None:
        """A request was submitted in local ``slot``; ``t0_ns`` is when generate() was called."""
        self._t0[slot] = t0_ns
        self._last[slot] = 0
        w = self.words
        w[L.W_REQUESTS] += 1
        self._open += 1
        w[L.W_OPEN] = self._open

    def refused(self, exc: BaseException) -> None:
        """`generate` refused a request with ``exc`` (counted by its class)."""
        index = self._refused.get(type(exc).__name__, self._refused["Error"])
        self.words[index] += 1

    def updates(self, updates: list[tuple], now: int) -> None:
        """Account one `Reader.poll` batch, seen at ``now`` ns.

        Updates of slots with no recorded request (a stream already ended or dropped) are
        skipped. In steady decoding every stream of a batch got its previous chunk in the same
        earlier wake-up and carries as many tokens, so consecutive updates share ``(last, k)``:
        they are counted as one run, and the histogram bucket is found once per run, not once
        per update. Shared words are stored once per run / per batch.
        """
        t0s = self._t0
        lasts = self._last
        tokens = 0
        run_last = run_k = run_chunks = 0  # the current run: same previous chunk time, same k
        for update in updates:
            slot = update[0]
            if not t0s[slot]:
                continue
            finish = update[4]
            k = len(update[1])
            if k:
                tokens += k
                last = lasts[slot]
                if last == run_last and k == run_k:
                    run_chunks += 1
                elif last:
                    if run_chunks:
                        self._itl_run(now - run_last, run_k, run_chunks)
                    run_last, run_k, run_chunks = last, k, 1
                else:
                    self._first(update, k, now)
                lasts[slot] = now
            if finish >= _FIN_LOCAL:
                # A local end (EngineDied...): the stream delivers this update's tokens (counted
                # above), then raises the error.
                self._end(slot, _ERROR_REASON.get(finish, "StreamError"))
            elif finish:
                self._finish(slot, finish, update, now)
        if run_chunks:
            self._itl_run(now - run_last, run_k, run_chunks)
        if tokens:
            self.words[L.W_GENERATION_TOKENS] += tokens

    def _itl_run(self, t: int, k: int, chunks: int) -> None:
        # ``chunks`` chunks of ``k`` tokens, each ``t`` ns after its previous chunk.
        w = self.words
        w[self._itl_b + bisect_left(self._itl_bounds, t // k)] += k * chunks
        w[self._itl_s] += t * chunks

    def _first(self, update: tuple, k: int, now: int) -> None:
        w = self.words
        self._ttft.observe(now - self._t0[update[0]])
        if k > 1:
            # The first chunk's other tokens arrived with the first: 0 s each.
            w[self._itl_b] += k - 1
        w[L.W_PROMPT_TOKENS] += update[5]
        w[L.W_CACHED_TOKENS] += update[7]

    def _finish(self, slot: int, finish: int, update: tuple, now: int) -> None:
        if not self._last[slot]:
            # Finished without a token (e.g. refused by the engine): the prompt was still
            # counted by the engine; count it here once.
            self.words[L.W_PROMPT_TOKENS] += update[5]
            self.words[L.W_CACHED_TOKENS] += update[7]
        self._e2e.observe(now - self._t0[slot])
        self._prompt.observe(update[5])
        self._gen.observe(update[6])
        self._end(slot, _ENGINE_REASON.get(finish, "other"))

    def failed(self, slot: int, error: BaseException) -> None:
        """The request in ``slot`` ended with ``error`` outside the slot (its I/O process
        died)."""
        name = type(error).__name__
        self._end(slot, name if name in self._finished else "StreamError")

    def closed(self, slot: int) -> None:
        """The client closed with the request in ``slot`` open: an ABORT is sent, the stream
        raised a plain `StreamError`."""
        if self._end(slot, "StreamError"):
            self.words[L.W_ABORTS_SENT] += 1

    def cancelled(self, slot: int, reason: str = "cancelled") -> None:
        """The request in ``slot`` ended early on this side (the consumer left, or its
        deadline passed: ``reason`` ``"DeadlineExceeded"``): an ABORT is sent for it."""
        if self._end(slot, reason):
            self.words[L.W_ABORTS_SENT] += 1

    def _end(self, slot: int, reason: str) -> bool:
        if not self._t0[slot]:
            return False  # ended already: each request is counted once
        self._t0[slot] = 0
        w = self.words
        w[self._finished[reason]] += 1
        self._open -= 1
        w[L.W_OPEN] = self._open
        return True


class _Histogram:
    """One histogram of a worker block (bounds compared in the recorded unit)."""

    __slots__ = ("bounds", "first", "sum", "words")

    def __init__(self, rec: Recorder, name: str) -> None:
        self.words = rec.words
        self.first, self.sum = L.HIST_WORDS[name]
        bounds = L.HISTOGRAMS[name]
        self.bounds = _bounds_ns(bounds) if name in L.SECONDS_HISTOGRAMS else list(bounds)

    def observe(self, value: int) -> None:
        """Add one observation of ``value`` (ns for latencies, a count for tokens)."""
        w = self.words
        w[self.first + bisect_left(self.bounds, value)] += 1
        w[self.sum] += value


#: The clock every recorded latency is measured on (the function itself: no wrapper call on the
#: worker's wake path).
monotonic_ns = time.monotonic_ns


class IOStats:
    """The I/O process's block: which worker places are attached, engine restarts, deaths and
    stalls."""

    def __init__(self, region: shm.Region) -> None:
        ml = region.metrics_layout
        self.layout = ml
        self.words = region.words(ml.io_offset, ml.io_words)

    def worker_attached(self, worker: int, pid: int) -> None:
        """Worker place ``worker`` is held by process ``pid`` (its gauges are shown)."""
        self.words[L.IO_WORKER_PID + worker] = max(1, pid)

    def worker_detached(self, worker: int) -> None:
        """Worker place ``worker`` is free (its gauges go; its counts stay)."""
        self.words[L.IO_WORKER_PID + worker] = 0

    def engine_registered(self, row: int, *, again: bool) -> None:
        """Engine ``row`` registered; ``again``: it had registered before (a restart)."""
        if again:
            self.words[self.layout.io_restarts_word(row)] += 1

    def engine_died(self, row: int) -> None:
        """Engine ``row`` was declared dead."""
        self.words[self.layout.io_deaths_word(row)] += 1

    def engine_stalled(self, row: int) -> None:
        """Engine ``row`` was marked stalled (one more stall episode)."""
        self.words[self.layout.io_stalls_word(row)] += 1
