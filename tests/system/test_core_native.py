"""The native slot region in one process: a `Writer` (the I/O process's side) and a `Reader`
(one worker's side) over the same anonymous shared mapping.

Binding, ingesting and polling; the generation check on a recycled slot; spill and flush;
duplicate binds; malformed frames (which raise `WireDecodeError` and change nothing); park and
wake over a real eventfd; and native ingest cross-checked against `tsfront.wire.decode_output`
on generated batches.
"""

from __future__ import annotations

import mmap
import os
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront import WireDecodeError, _native
from tsfront.wire import ENGINE_CORE_DEAD, BatchTokenIDOutSlim, decode_output, encode_output

WORKERS, SPW, CAP, ENGINES = 2, 8, 8, 4
FIN_DUPLICATE = 18
FINISH_CODES = {
    "": _native.FIN_NONE,
    "stop": _native.FIN_STOP,
    "length": _native.FIN_LENGTH,
    "abort": _native.FIN_ABORT,
}


class Region:
    """A Writer and worker 0's Reader over one mapping."""

    def __init__(self, workers=WORKERS, spw=SPW, cap=CAP, engines=ENGINES) -> None:
        size = _native.layout(
            num_workers=workers, slots_per_worker=spw, ring_capacity=cap, max_engines=engines
        )["total_bytes"]
        self.map = mmap.mmap(-1, size)
        self.writer = _native.Writer(self.map, workers, spw, cap, engines)
        self.reader = _native.Reader(self.map, 0, workers, spw, cap, engines)
        self.ticket = 0

    def bind(self, rid: str, slot: int, *, logprobs: bool = False, engine: int = 0) -> int:
        """Bind as a worker submission does: the reader expects first, then the writer binds
        (the request sent to ``engine``)."""
        self.ticket += 1
        self.reader.expect(slot, self.ticket)
        assert self.writer.bind(rid.encode(), slot, self.ticket, logprobs, FIN_DUPLICATE, engine)
        return self.ticket


def frame(rows: list[tuple], *, engine: int = 1, tail=(1, 0, 2, 100), form: int = 14) -> bytes:
    """An output frame; each row is (rid, ids, finish[, prompt, completion, cached, lpv, lpi])."""
    full = []
    for row in rows:
        rid, ids, finish, *rest = row
        prompt, completion, cached, lpv, lpi = rest or (3, len(ids), 0, [], [])
        full.append((rid, ids, finish, prompt, completion, cached, lpv, lpi))
    cols = list(zip(*full)) if full else [()] * 8
    batch = BatchTokenIDOutSlim(*[list(c) for c in cols], engine, *tail)
    return encode_output(batch, form=form)


def update(local, tokens, finish=0, prompt=3, completion=None, cached=0, engine=1, lp=None):
    completion = len(tokens) if completion is None else completion
    vals, idx = lp if lp is not None else (None, None)
    return (local, tokens, vals, idx, finish, prompt, completion, cached, engine)


# ------------------------------------------------------------------------------ basics


def test_bind_ingest_poll_delivers_tokens_counts_and_finish():
    r = Region()
    r.bind("a", 0)
    r.bind("b", 3)
    result = r.writer.ingest(frame([("a", [10, 11], ""), ("b", [20], "")]))
    assert result == (1, 1, 0, 2, 100, 2, 0, [])
    assert sorted(r.reader.poll()) == [update(0, [10, 11]), update(3, [20])]
    assert r.reader.poll() == []  # nothing new
    result = r.writer.ingest(frame([("a", [12], "length", 3, 3, 1, [], [])]))
    assert result[-1] == [0]  # slot 0 finished
    assert r.reader.poll() == [update(0, [12], _native.FIN_LENGTH, completion=3, cached=1)]
    # Finished: the rid is unbound; later rows for it are unknown (an engine still flushing).
    assert r.writer.ingest(frame([("a", [13], "")]))[6] == 1
    assert r.reader.poll() == []
    assert r.writer.stats()["bound"] == 1


def test_rows_for_unknown_rids_are_counted_and_ignored():
    r = Region()
    r.bind("mine", 1)
    result = r.writer.ingest(frame([("other", [1], ""), ("mine", [2], ""), ("gone", [3], "")]))
    assert result[5:] == (3, 2, [])
    assert r.reader.poll() == [update(1, [2])]


def test_rows_from_another_engines_socket_never_reach_a_stream():
    r = Region()
    r.bind("on0", 0, engine=0)
    r.bind("on1", 1, engine=1)
    # Engine 1's socket names engine 0's rid (its frame even claims to be engine 0): neither
    # its tokens nor its finish reach that stream; the row counts as unknown.
    lie = frame([("on0", [66, 67], "stop"), ("on1", [7], "")], engine=0)
    assert r.writer.ingest(lie, 1)[5:] == (2, 1, [])
    assert r.reader.poll() == [update(1, [7], engine=0)]
    assert r.writer.stats()["unknown_rows"] == 1
    assert r.writer.stats()["bound"] == 2
    # Engine 0's own rows still stream and end it, and engine 1's rid is refused from engine 0.
    result = r.writer.ingest(frame([("on0", [5], "length"), ("on1", [8], "stop")], engine=0), 0)
    assert result[5:] == (2, 1, [0])
    assert r.reader.poll() == [update(0, [5], _native.FIN_LENGTH, engine=0)]


def test_a_rebound_rid_follows_its_new_engine_and_an_unsent_one_takes_no_rows():
    r = Region()
    r.bind("x", 0, engine=0)
    assert r.writer.unbind(0)
    r.bind("x", 0, engine=2)  # the same rid, sent to another engine (e.g. after a restart)
    assert r.writer.ingest(frame([("x", [1], "")]), 0)[6] == 1
    assert r.writer.ingest(frame([("x", [2], "")], engine=2), 2)[6] == 0
    assert r.reader.poll() == [update(0, [2], engine=2)]
    # Bound to no engine (refused before it was sent): no socket's rows reach it.
    r.bind("none", 1, engine=-1)
    for index in (0, 1, 2, 3):
        assert r.writer.ingest(frame([("none", [9], "stop")], engine=index), index)[6] == 1
    assert r.reader.poll() == []


def test_rows_find_their_slots_whatever_the_last_frames_order_and_its_slots_rebinding():
    # The writer first tries the slot row i of the engine's last frame had; the guess is
    # checked against the slot's rid, so a new order, an aborted rid whose slot went to
    # another request, and another engine's frames in between all land where a lookup says.
    r = Region()
    r.bind("a", 0, engine=1)
    r.bind("b", 1, engine=1)
    r.bind("c", 2, engine=1)
    r.bind("z", 5, engine=2)
    r.writer.ingest(frame([("a", [1], ""), ("b", [2], ""), ("c", [3], "")]), 1)
    assert sorted(r.reader.poll()) == [update(0, [1]), update(1, [2]), update(2, [3])]
    r.writer.ingest(frame([("z", [90], ""), ("c", [4], "")], engine=2), 2)  # another engine
    r.writer.ingest(frame([("c", [5], ""), ("a", [6], ""), ("b", [7], "")]), 1)  # reordered
    assert sorted(r.reader.poll()) == [
        update(0, [6]),
        update(1, [7]),
        update(2, [5]),
        update(5, [90], engine=2),
    ]
    assert r.writer.stats()["unknown_rows"] == 1  # c from engine 2's socket
    # a is aborted and its slot given to d: the guess for row 0 (slot 0) no longer holds "a".
    assert r.writer.unbind(0)
    r.bind("d", 0, engine=1)
    result = r.writer.ingest(frame([("a", [8], ""), ("d", [9], ""), ("b", [10], "")]), 1)
    assert result[5:7] == (3, 1)
    assert sorted(r.reader.poll()) == [update(0, [9]), update(1, [10])]
    # Fewer rows, then more than before: positions past the last frame's have no guess.
    r.writer.ingest(frame([("b", [11], "")]), 1)
    r.writer.ingest(frame([("d", [12], ""), ("c", [13], ""), ("b", [14], "stop")]), 1)
    assert sorted(r.reader.poll()) == [
        update(0, [12]),
        update(1, [11, 14], _native.FIN_STOP, completion=1),
        update(2, [13]),
    ]


def test_bind_refuses_an_engine_index_out_of_range():
    r = Region()
    for index in (-2, 65536):
        with pytest.raises(ValueError, match="engine_index"):
            r.writer.bind(b"a", 0, 1, False, FIN_DUPLICATE, index)
    assert r.writer.stats()["bound"] == 0


def test_logprobs_are_delivered_as_float32_with_their_ids():
    r = Region()
    r.bind("lp", 2, logprobs=True)
    r.writer.ingest(frame([("lp", [7, 8], "", 3, 2, 0, [-0.1, -2.5], [7, 8])]))
    [(_, tokens, vals, idx, *_rest)] = r.reader.poll()
    assert tokens == [7, 8] and idx == [7, 8]
    assert vals == [struct.unpack("f", struct.pack("f", v))[0] for v in (-0.1, -2.5)]


def test_a_request_without_logprobs_gets_its_tokens_but_none_of_a_rows_logprobs():
    # Logprobs are stored only for a slot bound with them; one frame may carry both kinds.
    r = Region()
    r.bind("lp", 2, logprobs=True)
    r.bind("plain", 3)
    r.writer.ingest(
        frame(
            [
                ("plain", [5, 6], "", 3, 2, 0, [-1.0, -2.0], [5, 6]),
                ("lp", [7], "", 3, 1, 0, [-0.5], [7]),
            ]
        )
    )
    got = {u[0]: u for u in r.reader.poll()}
    assert got[3] == update(3, [5, 6])
    assert got[2] == update(2, [7], lp=([-0.5], [7]))


def test_engine_core_dead_is_reported_and_changes_nothing():
    r = Region()
    r.bind("a", 0)
    assert r.writer.ingest(ENGINE_CORE_DEAD) is None
    assert r.reader.poll() == []


def test_finish_ends_a_live_slot_with_a_local_code():
    r = Region()
    r.bind("a", 0)
    assert r.writer.finish(0, 16, 2) is True
    assert r.reader.poll() == [update(0, [], 16, prompt=0, completion=0, engine=2)]
    assert r.writer.finish(0, 16, 2) is False  # no longer live


# ------------------------------------------------------------------------------ generations


def test_recycled_slot_never_shows_the_previous_requests_tokens():
    r = Region()
    r.bind("old", 0)
    r.writer.ingest(frame([("old", [1, 2, 3], "")]))
    # The worker drops "old" without reading, and reuses the slot with a new ticket before the
    # I/O process has bound the new request: the old contents must stay invisible.
    r.reader.release(0)
    r.ticket += 1
    r.reader.expect(0, r.ticket)
    assert r.reader.read(0) is None
    assert r.reader.poll() == []  # the old notification names a slot of another generation
    r.writer.unbind(0)
    assert r.writer.bind(b"new", 0, r.ticket, False, FIN_DUPLICATE, 0)
    assert r.reader.read(0) is None  # bound, nothing written yet
    r.writer.ingest(frame([("old", [4], ""), ("new", [9], "")]))
    assert r.reader.poll() == [update(0, [9])]


def test_released_slot_is_not_read():
    r = Region()
    r.bind("a", 0)
    r.writer.ingest(frame([("a", [1], "")]))
    r.reader.release(0)
    assert r.reader.poll() == []
    assert r.reader.read(0) is None


def test_duplicate_bind_finishes_the_second_slot_and_keeps_the_first():
    r = Region()
    r.bind("same", 0)
    r.ticket += 1
    r.reader.expect(4, r.ticket)
    assert r.writer.bind(b"same", 4, r.ticket, False, FIN_DUPLICATE, 0) is False
    assert r.reader.poll() == [update(4, [], FIN_DUPLICATE, prompt=0, completion=0, engine=-1)]
    r.writer.ingest(frame([("same", [5], "")]))
    assert r.reader.poll() == [update(0, [5])]


def test_reset_worker_forgets_its_requests():
    r = Region()
    r.bind("a", 0)
    r.writer.reset_worker(0)
    assert r.writer.stats()["bound"] == 0
    assert r.writer.ingest(frame([("a", [1], "")]))[6] == 1


# ------------------------------------------------------------------------------ spill


def test_tokens_beyond_the_ring_spill_and_flush_in_order():
    r = Region()
    r.bind("big", 0)
    ids = list(range(100, 120))  # 20 tokens, ring of 8
    r.writer.ingest(frame([("big", ids[:12], "", 3, 12, 0, [], [])]))
    assert r.writer.stats()["spilled_tokens"] == 4
    assert r.writer.spilling() == 1
    r.writer.ingest(frame([("big", ids[12:], "length", 3, 20, 0, [], [])]))
    got: list[int] = []
    updates = []
    for _ in range(10):
        for u in r.reader.poll():
            updates.append(u)
            got.extend(u[1])
        if updates and updates[-1][4]:
            break
        r.writer.flush_spills()
    assert got == ids
    # The counts never run ahead of the delivered tokens; the finish comes with the last.
    delivered = 0
    for u in updates:
        delivered += len(u[1])
        assert u[6] <= delivered
    assert [u[4] for u in updates] == [0] * (len(updates) - 1) + [_native.FIN_LENGTH]
    assert updates[-1][6] == 20
    assert r.writer.spilling() == 0
    assert r.writer.flush_spills() == 0


def test_local_finish_waits_for_the_spilled_tokens():
    r = Region()
    r.bind("a", 0)
    r.writer.ingest(frame([("a", list(range(10)), "")]))
    r.writer.finish(0, 16, 1)
    first = r.reader.poll()
    assert [u[4] for u in first] == [0] and first[0][1] == list(range(8))
    r.writer.flush_spills()
    assert r.reader.poll() == [update(0, [8, 9], 16, completion=10)]


# ------------------------------------------------------------------------------ bad frames


def _good() -> bytes:
    return frame([("a", [1, 2], "")])


BAD_FRAMES = {
    "garbage": b"\x00\x01\x02garbage",
    "empty": b"",
    "truncated": _good()[:-3],
    "trailing bytes": _good() + b"\x00",
    "wrong tag": _good().replace(b"BatchTokenIDOutSlim", b"BatchTokenIDOutSlix"),
    "too short": msgspec.msgpack.encode(["BatchTokenIDOutSlim", ["a"], [[1]]]),
    "ragged output_ids": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1], [2]], [""], [3], [1], [0], [[]], [[]], 1]
    ),
    "ragged finish": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [], [3], [1], [0], [[]], [[]], 1]
    ),
    "ragged logprobs": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1, 2]], [""], [3], [2], [0], [[-1.0]], [[1]], 1]
    ),
    "token out of int32": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1 << 40]], [""], [3], [1], [0], [[]], [[]], 1]
    ),
    "negative count": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [""], [-3], [1], [0], [[]], [[]], 1]
    ),
    "count over u32": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [""], [3], [1 << 32], [0], [[]], [[]], 1]
    ),
    "logprob id out of int32": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [""], [3], [1], [0], [[-1.0]], [[-(1 << 31) - 1]], 1]
    ),
    "logprob ids without values": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [""], [3], [1], [0], [[]], [[1]], 1]
    ),
    "engine_index over u16": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", [], [], [], [], [], [], [], [], 65536]
    ),
    "negative engine_index": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [""], [3], [1], [0], [[]], [[]], -1]
    ),
    "negative load tail": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", [], [], [], [], [], [], [], [], 0, -1, 0, 0, 100]
    ),
    "load tail over u32": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [[1]], [""], [3], [1], [0], [[]], [[]], 0, 1, 0, 1 << 32, 9]
    ),
    "more rows than the limit": (
        b"\x9e"
        + msgspec.msgpack.encode("BatchTokenIDOutSlim")
        + b"\xdd"
        + (2**20 + 1).to_bytes(4, "big")
        + b"\xa0" * 64
    ),
    "string token": msgspec.msgpack.encode(
        ["BatchTokenIDOutSlim", ["a"], [["x"]], [""], [3], [1], [0], [[]], [[]], 1]
    ),
    # The first row is valid, the second is not: nothing may be applied (two-pass parse).
    "bad second row": msgspec.msgpack.encode(
        [
            "BatchTokenIDOutSlim",
            ["a", "b"],
            [[1], [2]],
            ["", 5],
            [3, 3],
            [1, 1],
            [0, 0],
            [[], []],
            [[], []],
            1,
        ]
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_malformed_frames_raise_wire_decode_error_and_change_nothing(name):
    r = Region()
    r.bind("a", 0)
    r.bind("b", 1)
    before = r.writer.stats()
    with pytest.raises(WireDecodeError):
        r.writer.ingest(BAD_FRAMES[name])
    assert r.writer.stats() == before
    assert r.reader.poll() == []
    assert r.reader.read(0) is None and r.reader.read(1) is None
    with pytest.raises(WireDecodeError):  # the Python decoder refuses it too
        decode_output(BAD_FRAMES[name])
    # And the slot still works.
    r.writer.ingest(frame([("a", [42], "")]))
    assert r.reader.poll() == [update(0, [42])]


# ------------------------------------------------------------------------------ park / wake


def _eventfd_count(fd: int) -> int:
    try:
        return int.from_bytes(os.read(fd, 8), "little")
    except BlockingIOError:
        return 0


def test_wake_writes_the_eventfd_once_per_wake_and_only_when_parked():
    r = Region()
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        r.writer.set_worker_fd(0, fd)
        r.bind("a", 0)
        # Not parked: news is published, but nobody is woken.
        r.writer.ingest(frame([("a", [1], "")]))
        assert r.writer.wake() == 0
        assert _eventfd_count(fd) == 0
        # Parking with news pending refuses (poll first).
        assert r.reader.park() is False
        assert len(r.reader.poll()) == 1
        assert r.reader.park() is True
        # Parked: a wake with nothing new writes nothing...
        assert r.writer.wake() == 0
        # ...two frames then one wake: exactly one write.
        r.writer.ingest(frame([("a", [2], "")]))
        r.writer.ingest(frame([("a", [3], "")]))
        assert r.writer.wake() == 1
        assert _eventfd_count(fd) == 1
        assert r.reader.wakes() == 1
        # The wake unparked the worker: more news and wakes write nothing until it parks.
        r.writer.ingest(frame([("a", [4], "")]))
        assert r.writer.wake() == 0
        assert _eventfd_count(fd) == 0
        assert [u[1] for u in r.reader.poll()] == [[2, 3, 4]]
        assert r.reader.park() is True
        r.writer.ingest(frame([("a", [5], "")]))
        assert r.writer.wake() == 1
        assert _eventfd_count(fd) == 1
        assert r.reader.wakes() == 2
    finally:
        r.writer.set_worker_fd(0, -1)
        os.close(fd)


def test_wake_touches_only_the_notified_worker():
    r = Region()
    fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(2)]
    other = _native.Reader(r.map, 1, WORKERS, SPW, CAP, ENGINES)
    try:
        for w, fd in enumerate(fds):
            r.writer.set_worker_fd(w, fd)
        assert r.reader.park() and other.park()
        r.bind("w0", 0)
        other.expect(0, 99)
        assert r.writer.bind(b"w1", SPW + 0, 99, False, FIN_DUPLICATE, 0)
        r.writer.ingest(frame([("w1", [1], "")]))
        assert r.writer.wake() == 1
        assert [_eventfd_count(fd) for fd in fds] == [0, 1]
        assert other.poll() == [update(0, [1])]
        assert r.reader.poll() == []
    finally:
        for w, fd in enumerate(fds):
            r.writer.set_worker_fd(w, -1)
            os.close(fd)


# ------------------------------------------------------------------------------ cross-check

_rids = st.lists(st.text(min_size=1, max_size=12), max_size=SPW, unique=True)
_token = st.integers(-(1 << 31), (1 << 31) - 1)
_count = st.integers(0, (1 << 32) - 1)


@st.composite
def batches(draw):
    rids = draw(_rids)
    cols: dict[str, list] = {k: [] for k in BatchTokenIDOutSlim.__struct_fields__[:8]}
    for rid in rids:
        ids = draw(st.lists(_token, max_size=CAP))
        with_lp = draw(st.booleans())
        lpv = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=len(ids),
                            max_size=len(ids))) if with_lp else []  # fmt: skip
        cols["rids"].append(rid)
        cols["output_ids"].append(ids)
        cols["finished_reasons"].append(draw(st.sampled_from(["", "", "stop", "length", "abort"])))
        cols["prompt_tokens"].append(draw(_count))
        cols["completion_tokens"].append(draw(_count))
        cols["cached_tokens"].append(draw(_count))
        cols["output_token_logprobs_val"].append(lpv)
        cols["output_token_logprobs_idx"].append(list(ids) if with_lp else [])
    tail = draw(st.tuples(st.integers(0, 65535), *[st.integers(0, (1 << 32) - 1)] * 4))
    batch = BatchTokenIDOutSlim(**cols, engine_index=tail[0], num_running=tail[1],
                                num_waiting=tail[2], kv_active_pages=tail[3],
                                kv_total_pages=tail[4])  # fmt: skip
    form = draw(st.sampled_from([9, 10, 14, 16]))
    unbound = draw(st.sets(st.sampled_from(rids))) if rids else set()
    return batch, form, unbound


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_native_ingest_agrees_with_decode_output(case):
    batch, form, unbound = case
    data = encode_output(batch, form=form)
    ref = decode_output(data)
    r = Region()
    slots = {}
    for i, rid in enumerate(ref.rids):
        if rid not in unbound:
            slots[rid] = i
            r.bind(rid, i, logprobs=bool(ref.output_token_logprobs_val[i]))
    result = r.writer.ingest(data)
    tail = (
        ref.engine_index,
        ref.num_running,
        ref.num_waiting,
        ref.kv_active_pages,
        ref.kv_total_pages,
    )
    assert result[:5] == tail
    assert result[5] == len(ref.rids)
    assert result[6] == len(unbound)
    finished = [
        slots[rid] for rid, reason in zip(ref.rids, ref.finished_reasons) if reason and rid in slots
    ]
    assert result[7] == finished
    got = {u[0]: u for u in r.reader.poll()}
    for i, rid in enumerate(ref.rids):
        if rid not in slots:
            continue
        ids = ref.output_ids[i]
        code = FINISH_CODES[ref.finished_reasons[i]]
        if not ids and not code:
            assert slots[rid] not in got  # nothing to say
            continue
        _, tokens, vals, idx, finish, prompt, completion, cached, engine = got[slots[rid]]
        assert tokens == ids
        assert finish == code
        assert (prompt, cached, engine) == (
            ref.prompt_tokens[i],
            ref.cached_tokens[i],
            ref.engine_index,
        )
        # While running, the reader never reports more completion tokens than delivered.
        want = ref.completion_tokens[i] if code else min(ref.completion_tokens[i], len(ids))
        assert completion == want
        if ref.output_token_logprobs_val[i]:
            assert vals == [_f32(v) for v in ref.output_token_logprobs_val[i]]
            assert idx == ref.output_token_logprobs_idx[i]
        else:
            assert vals is None and idx is None
