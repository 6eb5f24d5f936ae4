"""`tsfront bench --quick --json` runs end to end and reports every headline figure as a number.

Figures are printed (with ``-s``), never judged: the machine running the tests is not the one
the goals are set for, so nothing here passes or fails on time.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

KEYS = [
    "io_us_per_step",
    "io_request_steps_per_s",
    "io_cpu_s_per_mtok",
    "floor_recv_us_per_step",
    "floor_decode_us_per_step",
    "io_us_per_step_paced",
    "floor_recv_us_per_step_paced",
    "floor_recv_port_us_per_step_paced",
    "forwarding_us_per_step",
    "forwarding_cpu_s_per_mtok",
    "single_process_request_steps_per_s",
    "worker_ns_per_token",
    "worker_ns_per_token_recording",
    "worker_ns_per_token_no_recording",
    "recording_cost_ratio",
    "recording_cost_ratio_delivery_only",
    "worker_us_per_chunk",
    "wakes_per_worker_step",
    "idle_cpu_percent",
    "frame_to_task_p50_us",
    "frame_to_task_p99_us",
    "submit_io_us_per_request",
    "submit_paced_io_us_per_request",
    "floor_submit_paced_us_per_request",
    "shm_bytes_per_stream",
    "heap_bytes_per_stream",
]


@pytest.mark.timeout(300)
def test_bench_quick_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in KEYS:
        value = report.get(key)
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value), (key, value)
    assert isinstance(report["params"], dict)
    assert report["params"]["batches"] == [256]
    # stderr carries progress only: a phase counter with its percentage on each line, and no
    # warning (the suite's own teardown is not an engine death).
    lines = proc.stderr.splitlines()
    assert lines, "no progress on stderr"
    assert all(re.match(r"tsfront bench: \[\d+/\d+ +\d+% +[\d.]+s\] ", line) for line in lines), (
        lines
    )
    assert "WARNING" not in proc.stderr
    print({k: round(report[k], 3) for k in KEYS})
