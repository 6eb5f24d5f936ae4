"""The metrics area of the shared region: where each figure lives, and the histogram buckets.

The area follows the native layout (``tsfront._native.layout``'s ``total_bytes``), starting at
the next page boundary, so the native code neither knows nor cares about it. It holds one
block per worker place and one block for the I/O process; every value is a little-endian u64
at an 8-byte aligned offset, and every block starts on its own 64-byte cache line.

Rules that make it lock-free (see docs/METRICS.md):

* **one writer per block** — worker ``w`` writes only block ``w``, the I/O process only its
  own block. A writer updates a value with one plain aligned 8-byte store (a read-modify-write
  of a value nobody else writes), which no supported CPU (x86-64, AArch64) can tear;
* **the reader reads each value once**, with one 8-byte load (``memoryview.tolist``), and
  derives everything it shows from that one copy (a histogram's ``_count`` is the sum of the
  bucket counts it read, so ``+Inf == _count`` holds in every scrape);
* **counters only grow**: a worker place that is reused continues from the counts its previous
  holder left (nobody ever zeroes them), so a dead worker's counts stay in the totals and a
  scrape never sees a counter go back. Gauges are the one exception: they are shown only for
  workers the I/O process has attached (its block says so).

Sums of latencies are kept in integer nanoseconds, so no float is ever stored.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

# --------------------------------------------------------------------------- buckets

# Latency buckets are vLLM's (vllm/v1/metrics/loggers.py, PrometheusStatLogger), in seconds:
# ``vllm:time_to_first_token_seconds``.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# ``vllm:time_per_output_token_seconds`` (the same buckets vLLM uses for its inter-token
# latency histogram).
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
# ``request_latency_buckets`` (``vllm:e2e_request_latency_seconds``).
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``, used for
    ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens``)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


# vLLM bounds these by the model's length; the area is laid out before any engine registers,
# so a fixed top of one million tokens (beyond any served context today) is used instead.
TOKEN_BUCKETS = buckets_1_2_5(1_000_000)

# --------------------------------------------------------------------------- names

#: Why a request of a worker ended: the engine's finish reasons, ``cancelled`` (the consumer
#: left early: an ABORT was sent), and each `StreamError` class.
FINISH_REASONS = (
    "stop",
    "length",
    "abort",
    "other",
    "cancelled",
    "EngineDied",
    "IOProcessDied",
    "SendTimeout",
    "StreamRejected",
    "DeadlineExceeded",
    "PrefillFailed",
    "EngineStalled",
    "StreamError",
)

#: Error classes `EngineClient.generate` refuses with (``Error``: anything else). A closed
#: client has no block to count in, so `ClientClosed` is not among them.
REFUSAL_CLASSES = (
    "InvalidRequest",
    "StopStringsRefused",
    "DuplicateRequest",
    "RidRecentlyAborted",
    "PromptTooLong",
    "Busy",
    "EngineUnavailable",
    "Error",
)

#: The worker block's histograms: name → upper bounds (the +Inf bucket follows them).
HISTOGRAMS = {
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "e2e": E2E_BUCKETS,
    "prompt_tokens": TOKEN_BUCKETS,
    "generation_tokens": TOKEN_BUCKETS,
}

#: Histograms of seconds; their bounds are compared, and their sums kept, in nanoseconds.
SECONDS_HISTOGRAMS = ("ttft", "itl", "e2e")

# Worker block, in u64 words.
W_OPEN = 0  # gauge: requests of this worker in flight
W_REQUESTS = 1  # generate() calls that submitted a request
W_PROMPT_TOKENS = 2
W_GENERATION_TOKENS = 3
W_CACHED_TOKENS = 4
W_ABORTS_SENT = 5
W_FINISHED = 6  # + FINISH_REASONS.index(reason)
W_REFUSED = W_FINISHED + len(FINISH_REASONS)  # + REFUSAL_CLASSES.index(name)
W_HIST = W_REFUSED + len(REFUSAL_CLASSES)  # histograms follow, in HISTOGRAMS order


def _hist_offsets() -> dict[str, tuple[int, int]]:
    # name → (first bucket word, sum word); a histogram is len(bounds) + 1 buckets, then sum.
    out = {}
    word = W_HIST
    for name, bounds in HISTOGRAMS.items():
        out[name] = (word, word + len(bounds) + 1)
        word += len(bounds) + 2
    return out


HIST_WORDS = _hist_offsets()
WORKER_WORDS = max(s for _, s in HIST_WORDS.values()) + 1

# I/O process block, in u64 words: per worker place its attached pid (0: none), then per
# engine its registrations after the first (restarts), then per engine its deaths, then per
# engine its stall episodes (each time it was marked stalled).
IO_WORKER_PID = 0
#: Per-engine counters of the I/O block: restarts, deaths, stalls (one array of each).
IO_ENGINE_WORDS = 3


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


@dataclass(frozen=True)
class MetricsLayout:
    """Offsets of the metrics area for one geometry (computed the same on every side)."""

    offset: int  # start of the area: the native layout's end, page aligned
    num_workers: int
    max_engines: int
    worker_bytes: int
    io_offset: int
    total_bytes: int  # the whole region: native part, then this area

    @classmethod
    def after(cls, native_total: int, num_workers: int, max_engines: int) -> MetricsLayout:
        """The area that follows a native layout of ``native_total`` bytes."""
        offset = _align(native_total, mmap.PAGESIZE)
        worker_bytes = _align(WORKER_WORDS * 8, 64)
        io_offset = offset + num_workers * worker_bytes
        io_bytes = _align((num_workers + IO_ENGINE_WORDS * max_engines) * 8, 64)
        total = _align(io_offset + io_bytes, mmap.PAGESIZE)
        return cls(offset, num_workers, max_engines, worker_bytes, io_offset, total)

    def worker_offset(self, worker: int) -> int:
        """Byte offset of worker place ``worker``'s block."""
        return self.offset + worker * self.worker_bytes

    @property
    def io_words(self) -> int:
        """u64 words of the I/O process's block."""
        return self.num_workers + IO_ENGINE_WORDS * self.max_engines

    def io_restarts_word(self, row: int) -> int:
        """Word of engine row ``row``'s restart count in the I/O block."""
        return self.num_workers + row

    def io_deaths_word(self, row: int) -> int:
        """Word of engine row ``row``'s death count in the I/O block."""
        return self.num_workers + self.max_engines + row

    def io_stalls_word(self, row: int) -> int:
        """Word of engine row ``row``'s stall count in the I/O block."""
        return self.num_workers + 2 * self.max_engines + row
