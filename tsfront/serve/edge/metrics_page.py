"""``GET /metrics`` of ``tsfront serve``: the whole frontend as Prometheus text, for any worker.

One scrape shows every process: the frontend's figures read from the shared region (every
worker's request metrics, the I/O process's counters, every engine's load:
`tsfront.metrics.exposition.families`) and the server's own (`ServeCounters`: every worker's
HTTP responses by route and status, the workers the master replaced). `MetricsPage.render` reads
and formats all of it; it is blocking work on shared memory, so the worker calls it in a thread
(``asyncio.to_thread``), never on its event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from tsfront.errors import ClientClosed
from tsfront.metrics.exposition import PREFIX, families

if TYPE_CHECKING:
    from tsfront.client.engine_client import EngineClient
    from tsfront.serve.processes.counters import ServeCounters

__all__ = ["CONTENT_TYPE", "MetricsPage"]

CONTENT_TYPE = CONTENT_TYPE_LATEST.encode()


class MetricsPage:
    """The exposition of one worker's view: its client's region and the server's counters.

    Args:
        client: returns the worker's current `EngineClient` (it changes when the worker
            attaches to a restarted I/O process).
        counters: the server's shared counters, or None (the HTTP families are then left out).
    """

    def __init__(self, client: Callable[[], EngineClient], counters: ServeCounters | None) -> None:
        self._client = client
        self._counters = counters
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    def describe(self) -> list[Metric]:
        """Nothing up front (a registry must not read shared memory at registration)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The families of one reading."""
        counters = self._counters
        if counters is not None:
            http = CounterMetricFamily(
                PREFIX + "http_requests",
                "HTTP responses of every worker, by route and status (status 'none': the client "
                "left before any response).",
                labels=["route", "status"],
            )
            for (route, status), n in sorted(counters.requests().items()):
                http.add_metric([route, status], n)
            yield http
            edge = CounterMetricFamily(
                PREFIX + "http_edge_events",
                "Connections and requests the HTTP edge of every worker refused or cut: "
                "'refused' at the connection cap, 'evicted' (an idle connection closed for a new "
                "one), 'header_timeout', 'body_timeout', 'too_large' (431). Published with each "
                "worker heartbeat.",
                labels=["event"],
            )
            for event, n in counters.edge_totals().items():
                edge.add_metric([event], n)
            yield edge
            yield CounterMetricFamily(
                PREFIX + "worker_restarts",
                "Worker processes the server's master replaced (died, or missed heartbeats).",
                value=counters.restarts,
            )
        try:
            m = self._client().metrics()
        except (ClientClosed, ValueError):  # between I/O processes, or closing
            return
        yield from families(m)

    def render(self) -> bytes:
        """The Prometheus text of everything, now (blocking: call it in a thread)."""
        return generate_latest(self._registry)
