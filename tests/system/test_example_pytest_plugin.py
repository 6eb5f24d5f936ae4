"""The pytest plugin's example (examples/pytest_plugin, docs/TESTING.md) runs as a user runs it.

``python -m pytest examples/pytest_plugin`` in a subprocess, with the example's own
``pytest.ini`` (so nothing of tsfront's test configuration helps it): its three tests must
pass (simulated ranks through ``tsfront_engines``, replayed frames through ``tsfront_replay``
under pytest-benchmark, ``tsfront serve`` through ``tsfront_serve``), the benchmark table
must be printed, and the benchmark's JSON must hold a positive cost per token.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pytest_plugin"


def _users_environment() -> dict[str, str]:
    # As a user's shell has it: without what this test run's own pytest put there (under
    # pytest-xdist, PYTEST_XDIST_WORKER makes pytest-benchmark in the child think it is an
    # xdist worker and turn itself off).
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_the_plugin_example_passes_and_prints_its_benchmark(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(EXAMPLE), "-q", f"--benchmark-json={report}"],
        cwd=ROOT,
        env=_users_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"^3 passed", out, re.M), out
    # pytest-benchmark's table: a header and the benchmark's row with its figures.
    assert re.search(r"benchmark: 1 tests", out), out
    row = re.search(r"^test_consumer_cost_per_token\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert row and float(row.group(1)) > 0, out
    (bench,) = json.loads(report.read_text())["benchmarks"]
    assert bench["name"] == "test_consumer_cost_per_token"
    assert bench["stats"]["rounds"] == 5
    assert bench["extra_info"]["tokens_per_round"] == 64 * 32
    assert 0 < bench["extra_info"]["us_per_token"] < 1e6
    print(f"example consumer: {bench['extra_info']['us_per_token']:.2f} us per token")


def test_the_plugin_example_tears_its_rigs_down_without_a_word() -> None:
    # With -s, what the rigs' processes write reaches the terminal: an orderly teardown says
    # nothing (it used to report each simulated rank stopped first as a dead engine).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(EXAMPLE), "-q", "-s", "-k", "not cost_per_token"],
        cwd=ROOT,
        env=_users_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert re.search(r"^2 passed", done.stdout, re.M), out
    for word in ("is dead", "WARNING", "ERROR", "Traceback"):
        assert word not in out, out
