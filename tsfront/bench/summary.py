"""The ``tsfront bench`` summary: the report's headline figures, grouped, with units and a
one-line legend each (what ``tsfront bench`` prints without ``--json``).

`GROUPS` says what each headline key of `tsfront.bench.measure.run_suite`'s report means;
``--json`` prints the report itself, unchanged. A key the table does not know is printed
under "Other" (so a new figure is never hidden; `tests/system/test_bench_quick.py` checks that
the table knows every key). docs/PERFORMANCE.md, "How it is measured", says how each is taken.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["GROUPS", "format_value", "summary_lines"]

#: (title, [(key, unit, legend), ...]) in print order.
GROUPS: list[tuple[str, list[tuple[str, str, str]]]] = [
    (
        "The run",
        [
            ("batch", "", "requests per engine step (B) of the headline figures"),
            ("workers", "", "worker processes (W)"),
            ("ranks", "", "engine ranks (R), each stepping B requests"),
            ("elapsed_s", "s", "wall time of the whole suite"),
        ],
    ),
    (
        "I/O process: CPU per engine step ('burst': steps back to back; 'paced': one per 2 ms)",
        [
            ("io_us_per_step", "µs", "the I/O process's CPU per engine step, burst"),
            ("io_us_per_step_paced", "µs", "the same, paced: each step its own loop turn"),
            ("io_request_steps_per_s", "/s", "request-steps one I/O CPU-second carries (burst)"),
            ("io_tokens_per_s", "/s", "tokens per I/O CPU-second (one per request-step)"),
            ("io_cpu_s_per_mtok", "s", "I/O CPU-seconds per million tokens (burst)"),
        ],
    ),
    (
        "Baselines fed the same frames (lower bounds and the designs tsfront replaces)",
        [
            ("floor_recv_us_per_step", "µs", "floor: a pyzmq PULL receiving and dropping a step"),
            ("floor_decode_us_per_step", "µs", "floor + tsfront.wire.decode_output per step"),
            ("floor_recv_us_per_step_paced", "µs", "floor: receive only, paced"),
            (
                "floor_recv_port_us_per_step_paced",
                "µs",
                "floor of tsfront's own output port, paced",
            ),
            ("floor_decode_us_per_step_paced", "µs", "floor + decode, paced"),
            ("forwarding_us_per_step", "µs", "a forwarding I/O process (decode, split, re-encode)"),
            ("forwarding_cpu_s_per_mtok", "s", "its CPU-seconds per million tokens"),
            ("single_process_request_steps_per_s", "/s", "one asyncio process doing it all"),
            ("ratio_vs_decode_floor", "x", "times tsfront's I/O CPU per step: receive + decode"),
            ("ratio_vs_forwarding", "x", "times tsfront's I/O CPU per token: forwarding"),
        ],
    ),
    (
        "Worker: CPU per token and per chunk",
        [
            ("worker_ns_per_token", "ns", "Reader.poll per token (shared memory to Python)"),
            ("worker_ns_per_token_burst", "ns", "the worker's whole CPU per token, burst"),
            ("worker_us_per_chunk", "µs", "the worker's CPU per chunk a task gets, paced"),
            ("worker_us_per_chunk_burst", "µs", "the same, burst (chunks coalesce)"),
            ("worker_ns_per_token_recording", "ns", "delivery + consumer tasks, metrics on"),
            ("worker_ns_per_token_no_recording", "ns", "the same, request metrics off"),
            ("recording_cost_ratio", "x", "metrics on over off (with the consumer tasks)"),
            ("recording_cost_ratio_delivery_only", "x", "metrics on over off, delivery alone"),
            ("wakes_per_worker_step", "", "a worker's wake-ups per engine step, paced"),
            ("wakes_per_worker_step_burst", "", "the same, burst"),
            ("idle_cpu_percent", "%", "the most CPU an idle I/O process or worker takes"),
        ],
    ),
    (
        "Latency: engine send to the task's chunk (one request per step, one step per ms)",
        [
            ("send_to_task_p50_us_busy", "µs", "median, the worker's loop busy"),
            ("send_to_task_p50_us_parked", "µs", "median, the worker parked"),
            ("zmq_hop_p50_us", "µs", "median of the ZMQ hop alone (a bare PULL)"),
            ("frame_to_task_p50_us", "µs", "send to task less the hop: median, busy"),
            ("frame_to_task_p99_us", "µs", "the same, 99th percentile"),
            ("frame_to_task_p999_us", "µs", "the same, 99.9th percentile"),
            ("frame_to_task_p50_us_parked", "µs", "send to task less the hop: median, parked"),
            ("frame_to_task_p99_us_parked", "µs", "the same, 99th percentile"),
            ("frame_to_task_p999_us_parked", "µs", "the same, 99.9th percentile"),
        ],
    ),
    (
        "Submission: generate() to the engine",
        [
            ("submit_io_us_per_request", "µs", "I/O CPU per request, submitted back to back"),
            ("submit_paced_io_us_per_request", "µs", "the same, one request per ms"),
            ("floor_submit_paced_us_per_request", "µs", "floor: be woken, send one message"),
            ("submit_to_engine_p50_us", "µs", "generate() to the engine's receipt, median"),
            ("submit_to_engine_p99_us", "µs", "the same, 99th percentile"),
        ],
    ),
    (
        "Memory per stream in flight",
        [
            ("shm_bytes_per_stream", "B", "shared region per slot (default ClientConfig)"),
            ("heap_bytes_per_stream", "B", "a worker's Python heap per stream (tracemalloc)"),
        ],
    ),
]


def format_value(value: Any) -> str:
    """A figure as the summary prints it: 3 significant digits, thousands separated, M for
    millions; ``n/a`` for a figure the run did not take (null in the JSON)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1e6:
            return f"{value / 1e6:.3g}M"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The summary of ``report`` (its headline keys; the nested details are the JSON's)."""
    flat = {k: v for k, v in report.items() if not isinstance(v, (dict, list))}
    width = max(map(len, flat), default=0)
    lines = []
    known: set[str] = set()
    for title, rows in GROUPS:
        shown = [(key, unit, legend) for key, unit, legend in rows if key in flat]
        known.update(key for key, _, _ in rows)
        if not shown:
            continue
        lines.append(title)
        for key, unit, legend in shown:
            lines.append(f"  {key:<{width}}  {format_value(flat[key]):>8} {unit:<3} {legend}")
        lines.append("")
    other = [key for key in flat if key not in known]
    if other:
        lines.append("Other")
        lines.extend(f"  {key:<{width}}  {format_value(flat[key]):>8}" for key in other)
        lines.append("")
    lines.append(
        "The whole report (per batch size, per worker count, each run's details): --json, or "
        "--out FILE."
    )
    return lines
