"""The serve master's supervision policy and shared words, without processes.

`RestartPolicy` is pure (every call is given the time), so its budget, sliding window and
backoff are checked with made-up times; `Place` follows `TRANSITIONS` and nothing else;
`ServeCounters` is checked over a real ``multiprocessing`` shared array, read back in a spawned
process as a worker's /metrics would.
"""

from __future__ import annotations

import multiprocessing

import pytest

from tsfront.serve.processes.counters import STATUSES, ServeCounters, heartbeat_interval
from tsfront.serve.processes.supervisor import TRANSITIONS, Place, RestartPolicy


def test_the_first_restart_in_a_window_is_immediate_then_the_backoff_doubles_to_its_cap() -> None:
    policy = RestartPolicy(max_restarts=10, window=1000.0, base_delay=0.25, max_delay=2.0)
    delays = [policy.admit(float(t)) for t in range(7)]
    assert delays == [0.0, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_the_budget_refuses_one_more_restart_within_the_window() -> None:
    policy = RestartPolicy(max_restarts=3, window=60.0)
    assert [policy.admit(t) is not None for t in (0.0, 10.0, 20.0)] == [True, True, True]
    assert policy.admit(59.9) is None  # a fourth within 60 s of the first
    assert policy.recent(59.9) == 3
    # The window slides: once the first restart is 60 s old, one more is allowed ...
    assert policy.admit(60.0) is not None
    # ... but not two (the ones at 10 and 20 are still in it).
    assert policy.admit(61.0) is None
    assert policy.admit(70.0) is not None


def test_a_refused_death_does_not_use_up_the_budget() -> None:
    policy = RestartPolicy(max_restarts=1, window=10.0)
    assert policy.admit(0.0) == 0.0
    assert policy.admit(1.0) is None
    assert policy.admit(2.0) is None
    assert policy.admit(10.0) == 0.0  # alone in the window again: at once


def test_no_restarts_allowed_means_the_first_death_stops() -> None:
    assert RestartPolicy(max_restarts=0, window=60.0).admit(0.0) is None


def test_backoff_resets_when_the_window_empties() -> None:
    policy = RestartPolicy(max_restarts=5, window=5.0, base_delay=0.25, max_delay=5.0)
    assert policy.admit(0.0) == 0.0
    assert policy.admit(1.0) == 0.25
    assert policy.admit(100.0) == 0.0


def test_a_place_moves_only_along_the_table() -> None:
    place = Place(0)
    assert place.state == "starting"
    assert not place.move("silent", 1.0)  # heartbeats are not watched before it serves
    assert place.state == "starting"
    assert place.move("ready", 1.0) and place.state == "serving"
    assert not place.move("ready", 2.0) and not place.move("due", 2.0)
    assert place.move("silent", 3.0) and place.state == "killed" and place.since == 3.0
    assert not place.move("silent", 4.0)  # killed once
    assert place.move("exited", 4.0) and place.state == "waiting"
    assert place.move("due", 5.0) and place.state == "starting"
    assert place.move("late", 6.0) and place.state == "killed"
    # Every state but the start can be reached, and every transition leads somewhere known.
    states = {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values())
    assert states == {"starting", "serving", "killed", "waiting"}


def test_heartbeat_interval_is_a_quarter_of_the_timeout_at_most_a_second() -> None:
    assert heartbeat_interval(2.0) == 0.5
    assert heartbeat_interval(30.0) == 1.0


def _read_back(counters: ServeCounters, out: multiprocessing.Queue) -> None:
    counters.count(1, "chat", 200)  # the child writes its own place
    out.put((counters.requests(), counters.restarts, counters.last_beat(0)))


def test_counters_are_shared_with_spawned_workers_and_keep_a_dead_workers_counts() -> None:
    ctx = multiprocessing.get_context("spawn")
    counters = ServeCounters(ctx.RawArray("Q", ServeCounters.words_for(2)), 2)
    counters.count(0, "completions", 200)
    counters.count(0, "completions", 200)
    counters.count(0, "completions", 400)
    counters.count(0, "other", 404)
    counters.count(0, "health", 299)  # no word of its own: "other"
    counters.count(0, "nonsense", None)  # client left before any response, unknown route
    counters.beat(0)
    counters.add_restart()
    out = ctx.Queue()
    child = ctx.Process(target=_read_back, args=(counters, out))
    child.start()
    requests, restarts, beat = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert requests == {
        ("completions", "200"): 2,
        ("completions", "400"): 1,
        ("other", "404"): 1,
        ("health", "other"): 1,
        ("other", "none"): 1,
        ("chat", "200"): 1,  # the child's, in place 1
    }
    assert restarts == 1
    assert beat == counters.last_beat(0) > 0
    # The child's count is in the parent's view after it is gone.
    assert counters.requests()[("chat", "200")] == 1
    assert "none" in STATUSES and "other" in STATUSES


def test_counters_refuse_a_buffer_too_small() -> None:
    with pytest.raises(ValueError, match="needed"):
        ServeCounters(bytearray(8 * ServeCounters.words_for(2)), 3)
