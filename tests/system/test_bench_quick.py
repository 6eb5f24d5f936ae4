"""`tsfront bench --quick --json` runs end to end and reports every headline figure as a number;
without ``--json`` it prints them grouped, each with its unit and a one-line legend.

Figures are printed (with ``-s``), never judged: the machine running the tests is not the one
the goals are set for, so nothing here passes or fails on time.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.timeout(300)
def test_bench_quick_prints_every_headline_figure_grouped_with_its_unit_and_legend(
    tmp_path: Path,
) -> None:
    # As a user runs it: the summary on stdout, the same report as JSON in a file (--out).
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "--quick", "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    lines = proc.stdout.splitlines()
    print("\n" + proc.stdout)
    titles = [line for line in lines if line and not line.startswith(" ")]
    assert titles[0] == "The run" and "I/O process: CPU per engine step" in titles[1], titles
    assert "Other" not in titles  # every figure the suite reports has its legend
    rows = {}
    for line in lines:
        # A difference of two medians (frame_to_task: less the hop) may read below zero.
        match = re.fullmatch(r"  (\w+) +(n/a|-?[\d,.]+M?) (\S*) +(\S.*)", line)
        if match:
            rows[match.group(1)] = match.groups()[1:]
    headline = {k: v for k, v in report.items() if not isinstance(v, (dict, list))}
    assert set(rows) == set(headline), set(rows) ^ set(headline)
    for key, (shown, _unit, legend) in rows.items():
        value = headline[key]
        assert len(legend) > 10, (key, legend)
        if value is None:
            assert shown == "n/a", (key, shown)
            continue
        number = float(shown.rstrip("M").replace(",", "")) * (1e6 if shown.endswith("M") else 1)
        assert math.isclose(number, value, rel_tol=5e-3, abs_tol=5e-4), (key, shown, value)
    for key in ("io_us_per_step", "frame_to_task_p99_us", "submit_io_us_per_request"):
        assert rows[key][1] == "µs", rows[key]
    assert rows["heap_bytes_per_stream"][1] == "B"
    assert lines[-1].startswith("The whole report") and "--json" in lines[-1]
