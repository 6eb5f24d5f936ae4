"""`RecentAborts`: the bounded memory of aborted rids behind the refusal of their reuse."""

from __future__ import annotations

from tsfront.ipc.aborts import RecentAborts
from tsfront.wire.request import ENGINE_ABORT_MEMORY_S


def test_a_rid_is_refused_for_the_engines_abort_memory_and_no_longer():
    memory = RecentAborts(capacity=10)
    assert memory.window == ENGINE_ABORT_MEMORY_S == 300.0
    memory.add("r", now=1000.0)
    assert memory.age("r", now=1000.0) == 0.0
    assert memory.age("r", now=1299.0) == 299.0
    assert memory.age("r", now=1300.0) is None
    assert memory.age("other", now=1000.0) is None


def test_the_memory_is_bounded_and_forgets_the_oldest_first():
    memory = RecentAborts(capacity=3, window=60.0)
    for i in range(5):
        memory.add(f"r{i}", now=float(i))
    assert len(memory) == 3
    assert [memory.age(f"r{i}", now=5.0) is not None for i in range(5)] == [False] * 2 + [True] * 3
    # Expired entries go when a new one comes, whatever the bound.
    memory.add("late", now=100.0)
    assert len(memory) == 1
    # Aborting the same rid again restarts its window.
    memory.add("late", now=150.0)
    assert memory.age("late", now=200.0) == 50.0
    memory.clear()
    assert not memory
