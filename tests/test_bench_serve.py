"""``tsfront bench serve`` runs end to end and reports its figures as numbers.

A short run (one worker, 64 requests of 64 tokens, SMG left out): every target's CPU per
token, tokens/s and TTFT are finite and positive, every requested token was streamed, and the
CPU is split over the server's process roles, and the send floor is measured before and after
the targets. Figures are never judged (the machine running
the tests is not the one the goals are set for). About 10 s.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys


def test_bench_serve_reports_every_figure() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "serve", "--quick", "--json", "--workers",
         "1", "--requests", "64", "--no-smg"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    (target,) = report["targets"]
    assert target["target"] == "tsfront serve W=1"
    assert target["errors"] == 0
    assert target["tokens"] == 64 * 64
    for key in ("cpu_us_per_token", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms"):
        assert math.isfinite(target[key]) and target[key] > 0, key
    roles = target["extra"]["us_per_token_by_process"]
    assert {"I/O process", "worker", "master"} <= set(roles)
    assert report["skipped"] == ["SMG: --no-smg"]
    floor = report["floor"]
    assert len(floor["runs"]) == 2  # before and after the targets
    assert math.isfinite(floor["us_per_event"]) and floor["us_per_event"] > 0
    assert all(run["events"] > 0 and run["connections"] == 64 for run in floor["runs"])
