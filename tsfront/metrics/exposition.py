"""Prometheus exposition: a collector that reads the shared region at scrape time.

`RegionCollector` turns one `FrontendMetrics` (read when Prometheus scrapes, in whatever
process serves it: a worker, or the process that started the I/O process and attached) into
metric families named ``tsfront:<name>``, using vLLM's name after the prefix where the meaning
is the same (``tsfront:time_to_first_token_seconds``, ``tsfront:num_requests_running``...).
Nothing is registered in prometheus_client's global registry and no multiprocess directory is
used: the region is already the one place every process writes to.

`asgi_app` embeds it in any ASGI server (one line: mount it at ``/metrics``);
`serve` runs prometheus_client's own HTTP server on a port (``tsfront io --metrics-port``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_asgi_app, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tsfront.errors import ClientClosed
from tsfront.ipc.region import Region
from tsfront.metrics.snapshot import FrontendMetrics, HistogramData, read_metrics

if TYPE_CHECKING:
    from tsfront.client.engine_client import EngineClient

PREFIX = "tsfront:"

# name (after the prefix), type, HELP, unit: the reference table of docs/METRICS.md is this.
IO_COUNTERS = {
    "frames": ("io_output_frames", "Output frames (engine steps) the I/O process decoded."),
    "rows": ("io_output_rows", "Output rows (one request's step) written to slot rings."),
    "tokens": ("io_output_tokens", "Tokens the I/O process wrote to slot rings."),
    "unknown_rows": (
        "io_unknown_rows",
        "Output rows for rids not bound to a slot (aborted or foreign): dropped.",
    ),
    "spilled_tokens": (
        "io_spilled_tokens",
        "Tokens that went through the spill buffer because a reader's ring was full.",
    ),
    "wakes": ("io_wakes", "Eventfd writes waking parked workers."),
    "turns": ("io_turns", "Turns of the I/O loop (a wait and what it woke for)."),
    "native_turns": (
        "io_native_turns",
        "Turns of the I/O loop made wholly in native code (its wait, ring wake-ups, ADDs).",
    ),
}
IO_GAUGES = {
    "in_flight": ("io_requests_in_flight", "Requests bound to a slot in the I/O process."),
    "spilling_slots": ("io_spilling_slots", "Slots whose tokens wait in the spill buffer now."),
}


def _histogram(name: str, doc: str, h: HistogramData) -> HistogramMetricFamily:
    buckets = [(_le(b), n) for b, n in h.cumulative()]
    return HistogramMetricFamily(PREFIX + name, doc, buckets=buckets, sum_value=h.sum)


def _le(bound: float) -> str:
    if math.isinf(bound):
        return "+Inf"
    return repr(float(bound))


def families(m: FrontendMetrics) -> Iterator[Metric]:
    """Every metric family of ``m``, each with HELP text."""
    r = m.requests
    yield _histogram(
        "time_to_first_token_seconds",
        "Time from generate() to the first chunk with a token, in seconds.",
        r.time_to_first_token,
    )
    yield _histogram(
        "inter_token_latency_seconds",
        "Time between a request's chunks, per token: a chunk of k tokens t seconds after the "
        "previous one counts k observations of t/k (sum grows by t); a first chunk's tokens "
        "after its first count 0.",
        r.inter_token_latency,
    )
    yield _histogram(
        "e2e_request_latency_seconds",
        "Time from generate() to the last chunk of requests the engine finished, in seconds.",
        r.e2e_latency,
    )
    yield _histogram(
        "request_prompt_tokens",
        "Prompt tokens of requests the engine finished, as the engine counted them.",
        r.prompt_tokens_per_request,
    )
    yield _histogram(
        "request_generation_tokens",
        "Generated tokens of requests the engine finished.",
        r.generation_tokens_per_request,
    )
    for name, doc, value in (
        ("requests", "Requests generate() submitted.", r.requests),
        ("prompt_tokens", "Prompt tokens of submitted requests, as the engines counted them.",
         r.prompt_tokens),
        ("generation_tokens", "Tokens delivered to streams.", r.generation_tokens),
        ("cached_prompt_tokens", "Prompt tokens the engines served from their prefix cache.",
         r.cached_tokens),
        ("aborts_sent", "Requests the consumer left early (an ABORT was sent for each).",
         r.aborts_sent),
    ):  # fmt: skip
        yield CounterMetricFamily(PREFIX + name, doc, value=value)
    finished = CounterMetricFamily(
        PREFIX + "requests_finished",
        "Requests that ended, by reason: the engine's (stop, length, abort, other), cancelled "
        "(the consumer left early) or the StreamError class the stream raised.",
        labels=["reason"],
    )
    for reason, n in r.finished.items():
        finished.add_metric([reason], n)
    yield finished
    refused = CounterMetricFamily(
        PREFIX + "requests_refused",
        "Requests generate() refused before sending anything, by error class.",
        labels=["error"],
    )
    for error, n in r.refused.items():
        refused.add_metric([error], n)
    yield refused
    open_ = GaugeMetricFamily(
        PREFIX + "worker_requests_open",
        "Requests in flight in each attached worker (a worker that is gone has no series).",
        labels=["worker"],
    )
    for w in m.workers:
        open_.add_metric([str(w.worker)], w.open)
    yield open_
    yield GaugeMetricFamily(
        PREFIX + "workers_attached", "Workers attached to the I/O process.", value=len(m.workers)
    )
    for key, (name, doc) in IO_COUNTERS.items():
        yield CounterMetricFamily(PREFIX + name, doc, value=m.io[key])
    for key, (name, doc) in IO_GAUGES.items():
        yield GaugeMetricFamily(PREFIX + name, doc, value=m.io[key])
    yield from _engine_families(m)


def _engine_families(m: FrontendMetrics) -> Iterator[Metric]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=["engine"])

    def counter(name: str, doc: str) -> CounterMetricFamily:
        return CounterMetricFamily(PREFIX + name, doc, labels=["engine"])

    up = gauge("engine_up", "1 if the engine is live (registered and connected), else 0.")
    stalled = gauge(
        "engine_stalled",
        "1 while the engine is stalled (requests in flight, no output for stall_timeout; "
        "new requests go elsewhere), else 0. Sum it for the engines stalled now.",
    )
    running = gauge("num_requests_running", "Requests the engine's scheduler is running.")
    waiting = gauge("num_requests_waiting", "Requests waiting in the engine's scheduler.")
    usage = gauge("kv_cache_usage_perc", "KV-cache usage of the engine: 1 means 100 percent.")
    used = gauge("kv_cache_pages_used", "KV-cache pages the engine has in use.")
    total = gauge("kv_cache_pages_total", "KV-cache pages of the engine.")
    age = gauge("engine_load_age_seconds", "Seconds since the engine's last load report.")
    in_flight = gauge("engine_requests_in_flight", "Requests tsfront has in flight on it.")
    routed = counter("engine_requests", "Requests tsfront sent to the engine.")
    restarts = counter("engine_restarts", "Times the engine registered again (a new process).")
    deaths = counter("engine_deaths", "Times the engine was declared dead.")
    stalls = counter("engine_stalls", "Times the engine was marked stalled (stall episodes).")
    for e in m.engines:
        label = [str(e.index)]
        up.add_metric(label, 1 if e.alive else 0)
        stalled.add_metric(label, 1 if e.state == "stalled" else 0)
        running.add_metric(label, e.num_running)
        waiting.add_metric(label, e.num_waiting)
        if e.kv_total_pages:
            usage.add_metric(label, e.kv_active_pages / e.kv_total_pages)
        used.add_metric(label, e.kv_active_pages)
        total.add_metric(label, e.kv_total_pages)
        if e.load_age is not None:
            age.add_metric(label, e.load_age)
        in_flight.add_metric(label, e.in_flight)
        routed.add_metric(label, e.requests_total)
        restarts.add_metric(label, e.restarts)
        deaths.add_metric(label, e.deaths)
        stalls.add_metric(label, e.stalls)
    yield from (up, stalled, running, waiting, usage, used, total, age, in_flight, routed)
    yield from (restarts, deaths, stalls)


def _reader(source: Any) -> Callable[[], FrontendMetrics]:
    if isinstance(source, Region):
        return lambda: read_metrics(source)
    if hasattr(source, "metrics") and callable(source.metrics):
        return source.metrics
    if callable(source):
        return source
    raise TypeError(
        f"metrics source must be an EngineClient, a Region or a callable, got {type(source)}"
    )


class RegionCollector:
    """A prometheus_client collector reading the frontend's figures at each scrape."""

    def __init__(self, source: EngineClient | Region | Callable[[], FrontendMetrics]) -> None:
        self._read = _reader(source)

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry must not read shared memory at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The families of one reading (none once the client is closed)."""
        try:
            m = self._read()
        except (ClientClosed, ValueError):  # closed client, or a mapping already unmapped
            return
        yield from families(m)


def registry(source: EngineClient | Region | Callable[[], FrontendMetrics]) -> CollectorRegistry:
    """A fresh registry holding only a `RegionCollector` of ``source``."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RegionCollector(source))
    return reg


def asgi_app(source: EngineClient | Region | Callable[[], FrontendMetrics]) -> Any:
    """An ASGI app serving the Prometheus text exposition of ``source`` (mount at /metrics).

    ``source`` is usually an attached `EngineClient` (any worker's, or one the server's master
    attached); every worker's request metrics and every engine's load are in it.
    """
    return make_asgi_app(registry(source))


def serve(
    port: int,
    source: EngineClient | Region | Callable[[], FrontendMetrics],
    addr: str = "0.0.0.0",
) -> Any:
    """Serve ``GET /metrics`` on ``addr:port`` from a daemon thread; returns the HTTP server
    (``.shutdown()`` stops it)."""
    server, _thread = start_http_server(port, addr, registry(source))
    return server
