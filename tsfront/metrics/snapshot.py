"""`FrontendMetrics`: every figure of the frontend, read from the shared region at one moment.

`read_metrics(region)` is what `EngineClient.metrics` returns and what the Prometheus
collector (`tsfront.metrics.exposition`) renders, so both always agree. Each shared value is
read once; request counters and histograms are summed over every worker place (a dead
worker's counts stay), gauges only over the places the I/O process has attached.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from tsfront.ipc import region as shm
from tsfront.metrics import layout as L

_NS = 1_000_000_000


@dataclass(frozen=True)
class HistogramData:
    """A fixed-bucket histogram: ``counts[i]`` observations fell at or below ``bounds[i]``
    and above the bound before it; the last count is the ``+Inf`` bucket."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """Observations in all."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` pairs, ending with ``(inf, count)``."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True)
class RequestMetrics:
    """Request metrics of every worker, summed (see `tsfront.metrics.recorder`).

    Token counts are as the engines reported them; latencies are in seconds.
    """

    requests: int
    open: int
    prompt_tokens: int
    generation_tokens: int
    cached_tokens: int
    aborts_sent: int
    finished: dict[str, int]
    refused: dict[str, int]
    time_to_first_token: HistogramData
    inter_token_latency: HistogramData
    e2e_latency: HistogramData
    prompt_tokens_per_request: HistogramData
    generation_tokens_per_request: HistogramData


@dataclass(frozen=True)
class WorkerMetrics:
    """A worker place the I/O process has attached."""

    worker: int
    pid: int
    open: int  # its requests in flight


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's liveness and load, as the I/O process publishes them.

    ``load_age`` is seconds since its last load report (None: never); ``restarts`` counts its
    registrations after the first, ``deaths`` the times it was declared dead, ``stalls`` the
    times it was marked stalled. ``state`` is ``"stalled"`` while it is (``alive`` stays
    true: it is connected, only silent).
    """

    index: int
    rank: int
    state: str
    alive: bool
    in_flight: int
    num_running: int
    num_waiting: int
    kv_active_pages: int
    kv_total_pages: int
    load_age: float | None
    requests_total: int
    restarts: int
    deaths: int
    stalls: int = 0


class FrontendMetrics(Mapping[str, int]):
    """Every figure of one I/O process and its workers.

    As a mapping: the I/O process's counters (``frames``, ``rows``, ``tokens``,
    ``unknown_rows``, ``spilled_tokens``, ``wakes``, ``in_flight``, ``spilling_slots``).
    Attributes: ``io`` (that mapping as a dict), ``requests`` (`RequestMetrics`), ``engines``
    (`EngineMetrics` by rank), ``workers`` (`WorkerMetrics` of attached places).
    """

    __slots__ = ("engines", "io", "requests", "workers")

    def __init__(
        self,
        io: dict[str, int],
        requests: RequestMetrics,
        engines: list[EngineMetrics],
        workers: list[WorkerMetrics],
    ) -> None:
        self.io = io
        self.requests = requests
        self.engines = engines
        self.workers = workers

    def __getitem__(self, key: str) -> int:
        return self.io[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.io)

    def __len__(self) -> int:
        return len(self.io)

    def __repr__(self) -> str:
        r = self.requests
        return (
            f"FrontendMetrics(io={self.io}, requests={r.requests}, open={r.open}, "
            f"engines={len(self.engines)}, workers={len(self.workers)})"
        )


def _histogram(values: list[int], name: str) -> HistogramData:
    first, sum_word = L.HIST_WORDS[name]
    bounds = L.HISTOGRAMS[name]
    counts = tuple(values[first:sum_word])
    total = values[sum_word]
    return HistogramData(
        tuple(float(b) for b in bounds),
        counts,
        total / _NS if name in L.SECONDS_HISTOGRAMS else float(total),
    )


def read_metrics(region: shm.Region) -> FrontendMetrics:
    """Read every figure from ``region`` (a mapping in any process: worker or observer)."""
    ml = region.metrics_layout
    table = region.engines
    if table is None:  # closed under us (a scrape thread racing the client's close)
        raise ValueError("the region is closed")
    io_counters = region.metrics()
    io_block = region.read_words(ml.io_offset, ml.io_words)
    # Every worker block in one pass of single 8-byte loads, then summed by numpy (exact:
    # object dtype, so no u64 overflow can wrap a sum).
    stride = ml.worker_bytes // 8
    words = region.read_words(ml.offset, ml.num_workers * stride)
    blocks = np.array(words, dtype=np.uint64).reshape(ml.num_workers, stride)[:, : L.WORKER_WORDS]
    totals = [int(v) for v in blocks.astype(object).sum(axis=0)]
    workers: list[WorkerMetrics] = []
    for w in range(ml.num_workers):
        pid = io_block[L.IO_WORKER_PID + w]
        if pid:
            workers.append(WorkerMetrics(w, pid, words[w * stride + L.W_OPEN]))
    requests = RequestMetrics(
        requests=totals[L.W_REQUESTS],
        open=sum(w.open for w in workers),
        prompt_tokens=totals[L.W_PROMPT_TOKENS],
        generation_tokens=totals[L.W_GENERATION_TOKENS],
        cached_tokens=totals[L.W_CACHED_TOKENS],
        aborts_sent=totals[L.W_ABORTS_SENT],
        finished={r: totals[L.W_FINISHED + i] for i, r in enumerate(L.FINISH_REASONS)},
        refused={c: totals[L.W_REFUSED + i] for i, c in enumerate(L.REFUSAL_CLASSES)},
        time_to_first_token=_histogram(totals, "ttft"),
        inter_token_latency=_histogram(totals, "itl"),
        e2e_latency=_histogram(totals, "e2e"),
        prompt_tokens_per_request=_histogram(totals, "prompt_tokens"),
        generation_tokens_per_request=_histogram(totals, "generation_tokens"),
    )
    now_ms = time.monotonic() * 1000.0
    engines = []
    for row in range(ml.max_engines):
        e = [int(v) for v in table[row]]  # each u32 read once
        state = e[shm.E_STATE]
        load_ms = e[shm.E_LOAD_MS_LO] | (e[shm.E_LOAD_MS_HI] << 32)
        engines.append(
            EngineMetrics(
                index=e[shm.E_INDEX],
                rank=row,
                state=_STATE_NAMES.get(state, "unknown"),
                alive=state in shm.SERVING_STATES,
                in_flight=e[shm.E_IN_FLIGHT],
                num_running=e[shm.E_RUNNING],
                num_waiting=e[shm.E_WAITING],
                kv_active_pages=e[shm.E_KV_ACTIVE],
                kv_total_pages=e[shm.E_KV_TOTAL],
                load_age=None if load_ms == 0 else max(0.0, (now_ms - load_ms) / 1000.0),
                requests_total=e[shm.E_REQUESTS_LO] | (e[shm.E_REQUESTS_HI] << 32),
                restarts=io_block[ml.io_restarts_word(row)],
                deaths=io_block[ml.io_deaths_word(row)],
                stalls=io_block[ml.io_stalls_word(row)],
            )
        )
    return FrontendMetrics(io_counters, requests, engines, workers)


_STATE_NAMES = {0: "absent", 1: "handshaking", 2: "live", 3: "dead", 4: "stalled"}
