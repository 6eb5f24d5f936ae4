"""Output frames a peer controls, against the native decoder and Writer.

Pins: a frame that names one bound rid in many rows is applied row by row in order (tokens
appended in order, rows after that rid's finish ignored and counted unknown) and notifies the
slot once, without writing past any buffer (it used to overflow the Writer's notify list and
kill the I/O process); every integer a frame carries is range-checked before it leaves the
decoder, and a frame with one out of range is refused with `WireDecodeError` and changes
nothing; a frame may carry at most 1,048,576 rows.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import textwrap

import msgspec
import pytest

from tsfront import WireDecodeError, _native
from tsfront.wire import BatchTokenIDOutSlim, decode_output, encode_output

WORKERS, SPW, CAP, ENGINES = 2, 8, 8, 4
FIN_DUPLICATE = 18


def frame(rows, *, engine=1, tail=(1, 0, 2, 100), form=14) -> bytes:
    """An output frame; each row is (rid, ids, finish)."""
    n = len(rows)
    batch = BatchTokenIDOutSlim(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [3] * n,
        [len(r[1]) for r in rows],
        [0] * n,
        [[] for _ in rows],
        [[] for _ in rows],
        engine,
        *tail,
    )
    return encode_output(batch, form=form)


class Region:
    def __init__(self, cap: int = CAP) -> None:
        size = _native.layout(
            num_workers=WORKERS, slots_per_worker=SPW, ring_capacity=cap, max_engines=ENGINES
        )["total_bytes"]
        self.map = mmap.mmap(-1, size)
        self.writer = _native.Writer(self.map, WORKERS, SPW, cap, ENGINES)
        self.reader = _native.Reader(self.map, 0, WORKERS, SPW, cap, ENGINES)

    def bind(self, rid: str, slot: int, ticket: int) -> None:
        self.reader.expect(slot, ticket)
        assert self.writer.bind(rid.encode(), slot, ticket, False, FIN_DUPLICATE, 0)

    def drain(self) -> tuple[list[int], int, int]:
        """Poll and flush until nothing moves: (tokens, finish, updates) of local slot 0."""
        tokens, finish, updates = [], 0, 0
        while True:
            got = self.reader.poll()
            for local, toks, _v, _i, fin, *_ in got:
                assert local == 0
                tokens.extend(toks)
                finish = fin or finish
                updates += 1
            left = self.writer.flush_spills()
            if not got and not left:
                return tokens, finish, updates


# The repeated-rid frame runs in a child: before the fix it wrote past a heap buffer and the
# process died (SIGSEGV or a glibc abort), which must fail this test, not end the run.
REPEATED_RID_CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {here!r})
    from test_native_frames import Region, frame
    r = Region(cap=16384)  # room for every row's token: each row writes to the ring
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    r.writer.set_worker_fd(0, efd)
    r.bind("a", 0, 1)
    r.writer.ingest(frame([("a", [-1], "")]))
    first = r.reader.poll()[0][1]
    assert r.reader.park()
    rows = [("a", [i], "") for i in range({n})]
    result = r.writer.ingest(frame(rows))
    woken = r.writer.wake()
    try:
        eventfd = int.from_bytes(os.read(efd, 8), "little")
    except BlockingIOError:
        eventfd = 0
    polled = r.reader.poll()
    tokens, finish, updates = r.drain()
    tokens = first + polled[0][1] + tokens
    print(json.dumps({{"rows": result[5], "unknown": result[6], "first_updates": len(polled),
                      "woken": woken, "eventfd": eventfd, "tokens": tokens, "finish": finish}}))
    """
)


def test_a_frame_naming_one_rid_in_10000_rows_applies_them_in_order():
    n = 10_000
    here = str(__import__("pathlib").Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-P", "-c", REPEATED_RID_CHILD.format(here=here, n=n)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}: {proc.stderr[:3000]}"
    out = json.loads(proc.stdout)
    assert out["rows"] == n and out["unknown"] == 0
    assert out["first_updates"] == 1  # one notification for the slot, not one per row
    # The parked worker is woken through its own eventfd, once (the Writer's state next to its
    # notify list is intact).
    assert (out["woken"], out["eventfd"]) == (1, 1)
    assert out["tokens"] == [-1, *range(n)]
    assert out["finish"] == 0


def test_rows_after_a_rids_finish_in_the_same_frame_are_unknown():
    r = Region()
    r.bind("a", 0, 1)
    rows = [("a", [1], ""), ("a", [2], "stop"), ("a", [3], ""), ("a", [4], "length")]
    result = r.writer.ingest(frame(rows))
    assert result[5:] == (4, 2, [0])
    tokens, finish, updates = r.drain()
    assert (tokens, finish, updates) == ([1, 2], _native.FIN_STOP, 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_running", -1),
        ("num_running", 2**40),
        ("num_waiting", -5),
        ("kv_active_pages", 2**32),
        ("kv_total_pages", -(2**63)),
        ("engine_index", -1),
        ("engine_index", 65536),
    ],
)
def test_an_out_of_range_load_tail_is_refused_by_the_decoder(field, value):
    r = Region()
    r.bind("a", 0, 1)
    fields = {"engine_index": 1, "num_running": 1, "num_waiting": 0}
    fields |= {"kv_active_pages": 2, "kv_total_pages": 100, field: value}
    engine = fields.pop("engine_index")
    names = ("num_running", "num_waiting", "kv_active_pages", "kv_total_pages")
    tail = tuple(fields[k] for k in names)
    # A 0-row frame (the shape that used to reach the I/O loop), and one with a live row.
    for rows in ([], [("a", [5], "stop")]):
        with pytest.raises(WireDecodeError, match=field):
            r.writer.ingest(frame(rows, engine=engine, tail=tail))
    assert r.reader.poll() == []
    assert r.writer.stats()["frames"] == 0


def test_in_range_extremes_are_accepted():
    r = Region()
    top = 2**32 - 1
    result = r.writer.ingest(frame([], engine=65535, tail=(top, top, top, top)))
    assert result[:5] == (65535, top, top, top, top)


def test_ingest_refuses_an_engine_index_argument_out_of_range():
    r = Region()
    with pytest.raises(ValueError, match="engine_index"):
        r.writer.ingest(frame([], form=9), 70_000)


def test_a_frame_with_more_than_the_row_limit_is_refused():
    # Header only: [tag, rids(2**20 + 1 entries)...]; refused before anything is allocated.
    head = msgspec.msgpack.encode("BatchTokenIDOutSlim")
    data = b"\x9e" + head + b"\xdd" + (2**20 + 1).to_bytes(4, "big") + b"\xa0" * 64
    r = Region()
    with pytest.raises(WireDecodeError, match="more rows than a frame may carry"):
        r.writer.ingest(data)


def test_a_whole_frame_of_one_row_more_than_the_limit_is_refused_by_both_decoders():
    # Every column as long as rids (8 MiB), so that only the row limit can refuse it.
    n = 2**20 + 1
    cols = [[""] * n, [[]] * n, [""] * n, [0] * n, [0] * n, [0] * n, [[]] * n, [[]] * n]
    data = msgspec.msgpack.encode(["BatchTokenIDOutSlim", *cols, 0])
    with pytest.raises(WireDecodeError, match="more rows than a frame may carry"):
        Region().writer.ingest(data)
    with pytest.raises(WireDecodeError, match="length <= 1048576"):
        decode_output(data)


def test_every_slot_draining_its_spill_and_its_end_in_one_flush():
    """Every slot of the region spills, its end deferred behind the spill; one flush drains the
    tokens and publishes each end. Each slot is queued for notification once per flush (its
    tokens and its end used to take two places each in a list sized for one per slot)."""
    r = Region()
    total = WORKERS * SPW
    readers = [r.reader, _native.Reader(r.map, 1, WORKERS, SPW, CAP, ENGINES)]
    for slot in range(total):
        readers[slot // SPW].expect(slot % SPW, slot + 1)
        assert r.writer.bind(f"s{slot}".encode(), slot, slot + 1, False, FIN_DUPLICATE, 0)
    r.writer.ingest(frame([(f"s{slot}", list(range(CAP + 3)), "stop") for slot in range(total)]))
    assert r.writer.spilling() == total
    got = {slot: [] for slot in range(total)}
    ends = {}
    for _ in range(4):
        for w, reader in enumerate(readers):
            for local, toks, _v, _i, fin, *_ in reader.poll():
                got[w * SPW + local].extend(toks)
                if fin:
                    ends[w * SPW + local] = fin
        if r.writer.flush_spills() == 0 and len(ends) == total:
            break
    assert ends == {slot: _native.FIN_STOP for slot in range(total)}
    assert all(toks == list(range(CAP + 3)) for toks in got.values())
