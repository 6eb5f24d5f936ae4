"""Frontend metrics: recorded into the shared region, exposed to Prometheus from it.

Each worker records its request metrics (time to first token, inter-token latency,
end-to-end latency, token counts, finishes by reason, refusals, aborts) into its own block of
the shared region (`tsfront.metrics.recorder`); the I/O process publishes its counters and each
engine's load there already. `EngineClient.metrics()` reads it all as a `FrontendMetrics`;
`asgi_app(client)` serves it as Prometheus text (`tsfront.metrics.exposition`). Layout and
lock-free rules: `tsfront.metrics.layout`; reference table: docs/METRICS.md.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EngineMetrics",
    "FrontendMetrics",
    "HistogramData",
    "RegionCollector",
    "RequestMetrics",
    "WorkerMetrics",
    "asgi_app",
    "registry",
    "serve",
]

_SNAPSHOT = {
    "EngineMetrics",
    "FrontendMetrics",
    "HistogramData",
    "RequestMetrics",
    "WorkerMetrics",
}
_EXPOSITION = {"RegionCollector", "asgi_app", "registry", "serve"}


def __getattr__(name: str) -> Any:
    # Lazy: the worker's hot path imports `tsfront.metrics.recorder` only, and the region
    # module imports the layout; neither should pull in prometheus_client.
    if name in _SNAPSHOT:
        from tsfront.metrics import snapshot

        return getattr(snapshot, name)
    if name in _EXPOSITION:
        from tsfront.metrics import exposition

        return getattr(exposition, name)
    raise AttributeError(f"module 'tsfront.metrics' has no attribute {name!r}")
