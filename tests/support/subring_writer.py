"""A worker's side of the submission ring in its own process (test_native_subring.py).

Run as ``python tests/support/subring_writer.py MEMFD EVENTFD RING_BYTES COUNT SECONDS``. It
maps the region (1 worker, the test's geometry), then writes records 0, 1, ... (made by
`support.subring_records`) into worker 0's ring as fast as it can, retrying each that finds
the ring full (so the ring is kept full), until COUNT records or SECONDS have passed; every
few hundred records it stops for a random short while (a busy wait, no sleep), so that the
consumer drains the ring and parks, and the next record must wake it. Then it prints one JSON
line: the records written and its `Submitter.stats()`.
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


def main(memfd: int, efd: int, ring: int, count: int, seconds: float) -> None:
    size = _native.layout(*GEOMETRY, submit_ring_bytes=ring)["total_bytes"]
    region = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    sub = _native.Submitter(region, 0, *GEOMETRY, ring, efd)
    max_record = sub.stats()["max_record"]
    rng = random.Random(7)
    add, abort = sub.add, sub.abort
    ok, full = _native.SUB_OK, _native.SUB_FULL
    end = time.monotonic() + seconds
    seq = 0
    pause_at = rng.randrange(50, 500)
    while seq < count:
        kind, a, b, c = record(seq, max_record)
        rc = abort(a) if kind == 88 else add(a, b, c)
        if rc == full:
            continue  # kept full: retry at once
        if rc != ok:
            raise SystemExit(f"record {seq}: code {rc}")
        seq += 1
        if seq == pause_at:
            pause_at += rng.randrange(50, 500)
            if time.monotonic() > end:
                break
            for _ in range(rng.randrange(0, 20000)):
                pass  # let the consumer catch up and park
    print(json.dumps({"written": seq, **sub.stats()}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
