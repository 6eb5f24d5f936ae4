"""A worker's side of the submission ring in its own process (test_native_subring.py).

Run as ``python tests/support/subring_writer.py MEMFD EVENTFD RING_BYTES COUNT SECONDS BURST
MAX_RECORD GAP`` (records sized for a ring whose largest record is MAX_RECORD bytes). It maps
the region (1 worker, the test's geometry), then writes records 0, 1, ... (made by
`support.subring_records`) into worker 0's ring as fast as it can, in bursts of 1 to BURST
records (a random length each) published without a doorbell, then one `Submitter.ring`, as a
worker rings once at the end of a loop turn. A record that finds the ring full is retried at
once, after one ring (the records already published must be announced before waiting for room:
the worker's turn would end there too), so with a small ring the ring is kept full. Every few
hundred records, after a burst, it stops for a random short while (a busy wait, no sleep), so
that the consumer drains the ring and parks, and the next burst's ring must wake it; with
GAP > 0 it also stops after every burst for up to GAP loop iterations (a worker's turns a little
apart). It stops after COUNT records or SECONDS, then prints one JSON line: the records
written, the bursts, the rings made because the ring was full, and its `Submitter.stats()`.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support.subring_records import record
from tsfront import _native

GEOMETRY = (1, 4, 16, 1)


def main(
    memfd: int,
    efd: int,
    ring: int,
    count: int,
    seconds: float,
    burst: int,
    max_record: int,
    gap: int,
) -> None:
    size = _native.layout(*GEOMETRY, submit_ring_bytes=ring)["total_bytes"]
    region = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    sub = _native.Submitter(region, 0, *GEOMETRY, ring, efd)
    rng = random.Random(7)
    add, abort, bell = sub.add, sub.abort, sub.ring
    ok, full = _native.SUB_OK, _native.SUB_FULL
    end = time.monotonic() + seconds
    seq = bursts = full_rings = 0
    pause_at = rng.randrange(50, 500)
    while seq < count and time.monotonic() < end:
        for _ in range(rng.randrange(1, burst + 1)):
            kind, a, b, c = record(seq, max_record)
            rang = False
            while (rc := abort(a) if kind == 88 else add(a, b, c)) == full:
                if not rang:  # announce what is published, then retry at once
                    bell()  # (a ring holding records never lets the consumer park)
                    rang = True
                    full_rings += 1
            if rc != ok:
                raise SystemExit(f"record {seq}: code {rc}")
            seq += 1
            if seq == count:
                break
        bell()
        bursts += 1
        if gap:
            for _ in range(rng.randrange(0, gap)):
                pass
        if seq >= pause_at:
            pause_at = seq + rng.randrange(50, 500)
            for _ in range(rng.randrange(0, 20000)):
                pass  # let the consumer catch up and park
    stats = sub.stats()
    print(json.dumps({"written": seq, "bursts": bursts, "full_rings": full_rings, **stats}))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(a) for a in args[:4]), float(args[4]), *(int(a) for a in args[5:8]))
