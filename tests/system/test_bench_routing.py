"""`tsfront bench routing --quick --json` runs end to end: every policy and the ideal replay the
whole trace (the ranks' own counts of prompt tokens add up to the trace's), and prefix affinity
keeps its conversations' prefixes cached (hit rates are counts, not times, so they are judged;
the routing CPU figures are only printed). About 10 s."""

from __future__ import annotations

import json
import subprocess
import sys

from tsfront.bench.routing import RoutingParams, make_trace


def test_routing_bench_quick_replays_the_trace_and_affinity_keeps_prefixes_cached():
    out = subprocess.run(
        [sys.executable, "-m", "tsfront", "bench", "routing", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout)
    trace = make_trace(RoutingParams.quick())
    tokens = sum(len(ids) for session in trace for ids in session)
    requests = sum(len(session) for session in trace)
    policies = report["policies"]
    assert set(policies) == {
        "least_in_flight",
        "round_robin",
        "prefix_affinity",
        "ideal (session pinned)",
    }
    for name, figures in policies.items():
        assert figures["prompt_tokens"] == tokens, name
        assert sum(figures["requests_per_rank"]) == requests, name
        print(f"\n{name}: {json.dumps(figures)}")
    affinity = policies["prefix_affinity"]
    ideal = policies["ideal (session pinned)"]
    assert affinity["hit_rate"] >= 0.9 * ideal["hit_rate"]
    assert affinity["hit_rate"] > policies["round_robin"]["hit_rate"] + 0.1
    # 24 conversations over 4 ranks: a loose bound here; the full trace's is 1.5.
    assert affinity["load_spread"] < 2.0
    assert affinity["us_per_request"] > 0 and affinity["worker_hash_us_per_request"] > 0
