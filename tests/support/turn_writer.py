"""A worker's side of the native-turn hammer (test_native_turn.py), in its own process.

Run as ``python tests/support/turn_writer.py MEMFD EVENTFD WORKER WORKERS SPW RING COUNT
SECONDS``: maps the region (the rig's geometry for WORKERS places of SPW slots), then, as worker
WORKER, writes records 0, 1, ... as fast as it can: ADDs (slot ``seq % SPW``, a ticket of its
attach, the rid ``w<WORKER>-<seq>``, a payload carrying the worker, the seq and the
CLOCK_MONOTONIC ns it was published at, padded to a length from the seq), and every 401st an ABORT
of the slot the last ADD took. Records go in bursts of 1-16 published without a doorbell, then
one `Submitter.ring`, as a worker rings once at the end of a loop turn; a record that finds the
ring full is retried after one ring (the ring is kept full), until STUCK seconds past its end.
Every few hundred records it stops for a random short while (a busy wait, no sleep) so the
consumer parks and the next burst's ring must wake it. It stops after COUNT records or
SECONDS, rings, waits two seconds (records not announced by then would be found only after its
last line: a lost wake-up) and prints one JSON line: the records written, and its
`Submitter.stats()`.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support.turn_rig import abort_entries, add_header, ticket
from tsfront import _native

#: A payload's head: worker, seq, the CLOCK_MONOTONIC ns it was published at.
STAMP = struct.Struct("<IQQ")
ABORT_EVERY = 401
#: Seconds past its end a writer waits for room in a full ring before it gives up (the
#: consumer stopped taking: the test fails instead of this process spinning on).
STUCK = 10.0


def payload(worker: int, seq: int, published_ns: int) -> bytes:
    """Record ``seq``'s ADD payload: its stamp, padded (some longer than a short frame)."""
    pad = (seq * 2654435761) % 700
    return STAMP.pack(worker, seq, published_ns) + bytes(pad)


def main(
    memfd: int,
    efd: int,
    worker: int,
    workers: int,
    spw: int,
    ring: int,
    count: int,
    seconds: float,
) -> None:
    geometry = (workers, spw, 16, 1)
    size = _native.layout(*geometry, submit_ring_bytes=ring)["total_bytes"]
    region = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    sub = _native.Submitter(region, worker, *geometry, ring, efd)
    rng = random.Random(worker)
    ok, full = _native.SUB_OK, _native.SUB_FULL
    end = time.monotonic() + seconds
    seq = 0
    pause_at = rng.randrange(20, 200)

    def put(seq: int) -> int:
        if seq % ABORT_EVERY == ABORT_EVERY - 1:
            last = seq - 1  # the ADD just before it
            return sub.abort(abort_entries((last % spw, ticket(worker, last))))
        head = add_header(seq % spw, ticket(worker, seq), b"w%d-%d" % (worker, seq))
        return sub.add(head, payload(worker, seq, time.monotonic_ns()))

    while seq < count and time.monotonic() < end:
        for _ in range(rng.randrange(1, 17)):
            rang = False
            while (rc := put(seq)) == full:
                if not rang:  # announce what is published, then retry at once
                    sub.ring()
                    rang = True
                elif time.monotonic() > end + STUCK:
                    raise SystemExit(f"record {seq}: the ring stayed full {STUCK:g} s past the end")
            if rc != ok:
                raise SystemExit(f"record {seq}: code {rc}")
            seq += 1
            if seq == count:
                break
        sub.ring()
        if seq >= pause_at:
            pause_at = seq + rng.randrange(20, 200)
            for _ in range(rng.randrange(0, 200000)):
                pass  # let the consumer catch up and park
    time.sleep(2.0)
    print(json.dumps({"written": seq, **sub.stats()}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(a) for a in args[:7]), float(args[7]))
