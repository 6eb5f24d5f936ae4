"""The submission ring between a worker's native Submitter and the I/O process's Intake.

Pins: in two processes at full occupancy (the producer retries every record that finds the
ring full, and pauses now and then so that the consumer parks), every record arrives exactly
once, in order, byte for byte, and no wake-up is lost (the consumer blocks on its eventfd with
a deadline; a record found after a wait that no eventfd write ended is a lost wake-up), with a
doorbell per record and with deferred ringing (records published in bursts, one
`Submitter.ring` a burst, as a worker rings once at the end of a loop turn, and the ring at
once when a quarter of the ring is published unannounced); the
codes of a full ring, a record too large for it and a ZMQ submission not yet handled (the
ordering rule of DESIGN.md "The submission rings"); and a ring a peer controls: random bytes,
lying tails and each kind of corrupt record are dropped and counted, never read out of bounds,
and honest records after a reset arrive again.
"""

from __future__ import annotations

import json
import os
import random
import select
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.submit_region import SubmitRegion
from support.subring_records import record

from tsfront import _native

GEOMETRY = (1, 4, 16, 1)  # workers, slots per worker, ring capacity, engines
WRITER = Path(__file__).parents[1] / "support" / "subring_writer.py"
# Offsets in a worker's control block (native/subring.h), from submit_off + 64.
CTL_HEAD, CTL_APPLIED, CTL_TAIL = 0, 8, 64


class Region(SubmitRegion):
    """A region with submission rings: the Intake here, optionally a Submitter here too."""

    def __init__(self, ring: int, workers: int = 1) -> None:
        super().__init__((workers, *GEOMETRY[1:]), ring, "tsfront-subring-test")

    def ctl(self, worker: int) -> int:
        return self.layout["submit_off"] + 64 + worker * self.layout["submit_stride"]

    def ring_at(self, worker: int) -> int:
        return self.ctl(worker) + 128

    def set_tail(self, worker: int, tail: int) -> None:
        struct.pack_into("<Q", self.map, self.ctl(worker) + CTL_TAIL, tail)


@pytest.fixture
def region():
    made: list[Region] = []

    def make(ring: int = 8192, workers: int = 1) -> Region:
        made.append(Region(ring, workers))
        return made[-1]

    yield make
    for r in made:
        r.close()


# ---------------------------------------------------------------- two processes, ring kept full


def _hammer(r: Region, burst: int, max_record: int, gap: int = 0) -> dict:
    """Run the writer process against the Intake here until it ends; its last line. Checks
    every record once, in order, byte for byte, and no lost wake-up."""
    intake = r.intake
    args = (r.memfd, r.efd, r.ring, 3_000_000, 3, burst, max_record, gap)
    child = subprocess.Popen(
        [sys.executable, str(WRITER), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(r.memfd, r.efd),
    )
    received, done, waits, lost = 0, None, 0, 0
    try:
        while True:
            recs = intake.take(1 << 30)
            for rec in recs:
                assert rec == (0, *record(received, max_record)), f"record {received}"
                received += 1
            if recs:
                continue
            if done is not None:
                break
            if not intake.park():
                continue
            ready, _, _ = select.select([r.efd, child.stdout], [], [], 30)
            assert ready, "the consumer waited 30 s: a lost wake-up (or a stuck producer)"
            waits += 1
            if r.efd in ready:
                os.read(r.efd, 8)
                continue
            # Only the producer's last line: it ended after its last ring. A record found now
            # that no eventfd write announced was published before a ring that missed the park.
            done = json.loads(child.stdout.readline())
            try:
                woken = os.read(r.efd, 8)
            except BlockingIOError:
                woken = b""
            if not woken and intake.take(1, 0):
                lost += 1
                break
    finally:
        child.wait(30)
    assert child.returncode == 0
    assert lost == 0, "a record was published while the consumer was parked and it was not woken"
    assert done is not None and received == done["written"]
    assert done["records"] == received
    # One ring per burst, and one more before each retry of a full ring; a write per ring at most.
    assert done["rings"] == done["bursts"] + done["full_rings"]
    assert done["wakes"] <= done["rings"] + done["early_rings"]
    assert done["wakes"] > 0 and waits > 0, "the consumer never parked and was woken"
    stats = intake.stats()
    assert stats["bad_records"] == 0 and stats["records"] == received
    print(
        f"{received} records in {done['bursts']} bursts, {done['full']} full, "
        f"{done['rings']} rings, {done['wakes']} wakes, {waits} waits"
    )
    return done


def test_two_process_hammer_every_record_once_in_order_no_lost_wakeup(region) -> None:
    # A ring per record, the ring kept full (a record of ~1.5 KB on average, 8 KiB of ring).
    done = _hammer(region(8192), burst=1, max_record=4096)
    assert done["written"] >= 20_000, f"only {done['written']} records in 3 s"
    assert done["full"] > 0, "the ring was never full"


def test_two_process_hammer_deferred_ringing_one_ring_per_burst(region) -> None:
    # Bursts of 1-32 records published before one ring (a worker's loop turn), in a ring that
    # holds ~75 of them (~830 bytes each), the bursts a little apart: the consumer parks between
    # bursts and one ring wakes it for the whole burst; a burst that fills the ring rings before
    # it waits for room.
    done = _hammer(region(65536), burst=32, max_record=2048, gap=20000)
    assert done["written"] >= 20_000, f"only {done['written']} records in 3 s"
    assert done["bursts"] >= 1000 and done["written"] >= 8 * done["bursts"]
    assert done["wakes"] >= 100, "the consumer seldom parked between bursts"
    assert done["early_rings"] > 0, "no burst reached a quarter of the ring"
    assert done["wakes"] < done["written"] // 4, "not several records per wake-up"


# ---------------------------------------------------------------- codes and the ordering rule


def test_full_too_big_and_zmq_pending_codes(region) -> None:
    r = region(4096)
    sub = r.submitter()
    assert sub.stats()["max_record"] == 2048
    assert sub.add(b"h" * 24, b"p" * 2000) == _native.SUB_OK  # 24 + 24 + 2000 -> 2048
    assert sub.add(b"h" * 24, b"p" * 2001) == _native.SUB_TOO_BIG
    assert sub.add(b"h" * 24, b"p" * 1950) == _native.SUB_OK
    assert sub.abort(b"x" * 12) == _native.SUB_FULL  # 4096 bytes in use
    recs = r.intake.take()
    assert [(k, len(a), len(b or b"")) for _, k, a, b, _ in recs] == [
        (65, 24, 2000),
        (65, 24, 1950),
    ]
    assert sub.abort(b"x" * 12) == _native.SUB_OK  # room again once taken
    # A ZMQ submission not handled yet: everything goes over ZMQ until it is.
    sub.zmq_sent()
    assert sub.add(b"h", b"p") == _native.SUB_ZMQ_PENDING
    assert sub.abort(b"x" * 12) == _native.SUB_ZMQ_PENDING
    r.intake.applied(0)
    assert sub.add(b"h", b"p", b"hashes") == _native.SUB_OK
    assert [rec[1:] for rec in r.intake.take()] == [
        (88, b"x" * 12, None, None),
        (65, b"h", b"p", b"hashes"),
    ]


def test_park_refuses_while_a_record_waits_and_the_record_wakes_a_parked_intake(region) -> None:
    r = region(4096)
    sub = r.submitter()
    assert r.intake.park() is True
    assert sub.add(b"h", b"p") == _native.SUB_OK
    with pytest.raises(BlockingIOError):
        os.read(r.efd, 8)  # published, not announced: add never writes the eventfd
    assert sub.add(b"h", b"p") == _native.SUB_OK
    assert sub.ring() is True
    assert os.read(r.efd, 8) == (1).to_bytes(8, "little")  # parked: woken once for both
    assert sub.ring() is False
    with pytest.raises(BlockingIOError):
        os.read(r.efd, 8)  # the waker cleared parked: no second write
    assert sub.stats()["rings"] == 2 and sub.stats()["wakes"] == 1
    assert r.intake.park() is False  # records wait: do not block
    assert len(r.intake.take()) == 2
    assert r.intake.park() is True


def test_a_quarter_of_the_ring_published_unannounced_rings_at_once(region) -> None:
    r = region(8192)  # a quarter: 2,048 bytes
    sub = r.submitter()
    assert r.intake.park() is True
    assert sub.add(b"h" * 24, b"p" * 976) == _native.SUB_OK  # 1,024 bytes with its head
    with pytest.raises(BlockingIOError):
        os.read(r.efd, 8)  # below a quarter: left for the end of the turn
    assert sub.add(b"h" * 24, b"p" * 976) == _native.SUB_OK  # 2,048 unannounced: rings now
    assert os.read(r.efd, 8) == (1).to_bytes(8, "little")
    assert sub.stats()["early_rings"] == 1 and sub.stats()["rings"] == 0
    assert len(r.intake.take()) == 2
    # Counted from the last doorbell, whichever rang it: a ring resets it.
    assert r.intake.park() is True
    assert sub.add(b"h" * 24, b"p" * 976) == _native.SUB_OK
    assert sub.ring() is True
    assert os.read(r.efd, 8) == (1).to_bytes(8, "little")
    assert len(r.intake.take()) == 1 and r.intake.park() is True
    assert sub.add(b"h" * 24, b"p" * 976) == _native.SUB_OK
    with pytest.raises(BlockingIOError):
        os.read(r.efd, 8)
    assert sub.stats()["early_rings"] == 1


def test_open_resets_what_the_last_worker_left(region) -> None:
    r = region(4096)
    sub = r.submitter()
    assert sub.add(b"old", b"p") == _native.SUB_OK
    r.set_tail(0, 4096 + 64 * 3)  # and a dead worker's garbage tail
    r.intake.close(0)
    assert r.intake.take() == []  # a detached place is not read
    r.intake.open(0)
    assert r.intake.take() == []
    sub = r.submitter()
    assert sub.add(b"new", b"p") == _native.SUB_OK
    assert [rec[2] for rec in r.intake.take()] == [b"new"]


# ---------------------------------------------------------------- a peer that lies


def corrupt_head(r: Region, **fields: int) -> None:
    """Write one record head at the ring's start and publish 128 bytes."""
    head = {"size": 64, "kind": 65, "a": 0, "b": 0, "c": 0, "flags": 0, **fields}
    struct.pack_into(
        "<6I",
        r.map,
        r.ring_at(0),
        head["size"],
        head["kind"],
        head["a"],
        head["b"],
        head["c"],
        head["flags"],
    )
    r.set_tail(0, 128)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"kind": 7}, "unknown kind"),
        ({"size": 0}, "size out of range"),
        ({"size": 65}, "size out of range"),
        ({"size": 4096 + 64}, "size out of range"),
        ({"size": 192}, "size out of range"),  # past the tail
        ({"a": 30, "b": 20}, "lengths beyond the record"),
        ({"a": 0xFFFFFFFF, "b": 0xFFFFFFFF, "c": 0xFFFFFFFF}, "lengths beyond the record"),
        ({"kind": 87, "size": 64}, "wrap record of the wrong size"),
    ],
)
def test_each_corrupt_record_is_dropped_counted_and_the_ring_recovers(region, fields, why) -> None:
    r = region(4096)
    corrupt_head(r, **fields)
    recs = r.intake.take()
    assert len(recs) == 1 and recs[0][1] == 0 and why in recs[0][2]
    assert r.intake.stats()["bad_records"] == 1
    assert r.intake.take() == []  # dropped, not read again
    r.intake.open(0)  # the next worker at this place
    sub = r.submitter()
    assert sub.add(b"ok", b"p") == _native.SUB_OK
    assert [rec[1:3] for rec in r.intake.take()] == [(65, b"ok")]


@pytest.mark.parametrize("tail", [1, 63, 4096 + 64, 1 << 63, (1 << 64) - 64])
def test_a_tail_out_of_range_reads_as_empty_and_is_reported_once(region, tail) -> None:
    r = region(4096)
    r.set_tail(0, tail)
    recs = r.intake.take()
    assert len(recs) == 1 and recs[0][1] == 0 and "tail" in recs[0][2]
    assert r.intake.take() == []  # the same lie is reported once
    assert r.intake.park() is True  # and never keeps the I/O process awake


def test_random_ring_contents_never_crash_or_read_out_of_bounds(region) -> None:
    r = region(4096, workers=2)
    rng = random.Random(1)
    ring_at = r.ring_at(0)
    for trial in range(3000):
        r.map[ring_at : ring_at + 4096] = rng.randbytes(4096)
        if trial % 3 == 0:  # plausible heads: small sizes and lengths
            for off in range(0, 4096, 64):
                size = rng.choice([64, 128, 192, 4096 - off, rng.randrange(0, 1 << 13)])
                kind = rng.choice([65, 88, 87, 0])
                struct.pack_into(
                    "<6I",
                    r.map,
                    ring_at + off,
                    size,
                    kind,
                    rng.randrange(64),
                    rng.randrange(64),
                    rng.randrange(64),
                    rng.randrange(2),
                )
        head = struct.unpack_from("<Q", r.map, r.ctl(0) + CTL_HEAD)[0]
        r.set_tail(0, head + rng.choice([64, 128, 4096, rng.randrange(0, 8192), 1 << 40]))
        for rec in r.intake.take(rng.randrange(1, 64)):
            worker, kind, a, b, c = rec
            assert worker == 0 and kind in (0, 65, 88)
            if kind == 65:
                assert isinstance(a, bytes) and isinstance(b, bytes) and len(a) + len(b) < 4096
            elif kind == 88:
                assert isinstance(a, bytes) and b is None and c is None
        r.intake.park()
    assert r.intake.stats()["bad_records"] > 0
    r.intake.open(0)
    sub = r.submitter()
    assert sub.add(b"after", b"fuzz") == _native.SUB_OK
    assert [rec[2] for rec in r.intake.take()] == [b"after"]
