"""The responses store's owners (`tsfront.serve.processes.store.Memory`): each owner's objects are
its own, and past a bound the owner holding the most loses its least recently used object, so one
tenant's puts cannot evict another tenant's objects while that tenant holds less."""

from __future__ import annotations

from tsfront.serve.processes.store import Memory


def test_an_object_is_found_replaced_and_deleted_only_by_its_owner() -> None:
    memory = Memory(items=10, size=1000)
    assert memory.put("a", "resp_1", b"mine")
    assert memory.get("b", "resp_1") is None
    assert not memory.delete("b", "resp_1")
    assert memory.put("b", "resp_1", b"theirs")  # the same id under another owner: another object
    assert memory.get("a", "resp_1") == b"mine" and memory.get("b", "resp_1") == b"theirs"
    assert len(memory) == 2 and memory.bytes == len(b"mine") + len(b"theirs")
    assert memory.delete("a", "resp_1") and memory.get("b", "resp_1") == b"theirs"
    assert memory.delete("b", "resp_1") and len(memory) == 0 and memory.bytes == 0


def test_one_owner_filling_the_store_evicts_only_its_own_objects() -> None:
    memory = Memory(items=10, size=1000)
    for i in range(3):
        assert memory.put("victim", f"v{i}", b"v" * 100)
    for i in range(50):  # a flood of puts, by count and by bytes
        memory.put("flood", f"f{i}", b"f" * 150)
        assert memory.bytes <= 1000 and len(memory) <= 10
    assert all(memory.get("victim", f"v{i}") == b"v" * 100 for i in range(3))
    assert memory.get("flood", "f49") is not None  # the flood keeps its newest
    assert memory.get("flood", "f0") is None


def test_the_largest_holder_loses_first_by_count_and_by_bytes() -> None:
    memory = Memory(items=4, size=1000)
    for i in range(3):
        memory.put("big", f"b{i}", b"x")
    memory.put("small", "s0", b"x")
    memory.put("small", "s1", b"x")  # 5 > 4 items: "big" holds 3, loses its oldest
    assert memory.get("big", "b0") is None and memory.get("small", "s0") == b"x"
    assert len(memory) == 4
    by_bytes = Memory(items=100, size=100)
    by_bytes.put("big", "b0", b"x" * 60)
    by_bytes.put("small", "s0", b"x" * 30)
    by_bytes.put("small", "s1", b"x" * 20)  # 110 > 100 bytes: "big" holds 60 and loses
    assert by_bytes.get("big", "b0") is None and by_bytes.bytes == 50


def test_a_put_that_would_make_its_owner_the_largest_evicts_itself_last() -> None:
    memory = Memory(items=100, size=100)
    memory.put("a", "a0", b"x" * 60)
    # b's 70 bytes would leave "a" with less than b: b is the largest holder, so it is b's
    # own object that goes (and it is b's only one): not kept, and "a" keeps its own.
    assert not memory.put("b", "b0", b"x" * 70)
    assert memory.get("b", "b0") is None and memory.get("a", "a0") is not None
    assert memory.bytes == 60 and len(memory) == 1
    # With one owner it is plain LRU: the new object stays and the oldest goes.
    assert memory.put("a", "a1", b"y" * 70)
    assert memory.get("a", "a0") is None and memory.get("a", "a1") is not None
