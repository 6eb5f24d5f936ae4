"""A worker's side of the notify protocol in its own process (test_native_notify.py).

Run as ``python tests/support/notify_reader.py MEMFD EVENTFD WORKERS SPW CAP ENGINES``. It maps the
region, then serves trials read as JSON lines on stdin: ``{"tickets": [...], "deadline": s}``
makes it expect those tickets on its local slots (worker 0) and print ``ready`` (with
``"asleep": true``, parked first, and reading nothing until its eventfd is written); it then polls
as a worker does (poll, park when there is nothing, wait on the eventfd) until every slot has
ended or the deadline passes, and prints one JSON line: per local slot the tokens it read and
the finish code (0 if it never ended), and how many polls it made. ``{"quit": true}`` ends it.
"""

from __future__ import annotations

import json
import mmap
import os
import select
import sys
import time

from tsfront import _native


def serve(memfd: int, efd: int, workers: int, spw: int, cap: int, engines: int) -> None:
    """Answer trials until told to quit (see the module docstring)."""
    size = _native.layout(
        num_workers=workers, slots_per_worker=spw, ring_capacity=cap, max_engines=engines
    )["total_bytes"]
    region = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    reader = _native.Reader(region, 0, workers, spw, cap, engines)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            break
        tickets = msg["tickets"]
        for local, ticket in enumerate(tickets):
            reader.expect(local, ticket)
        tokens: list[list[int]] = [[] for _ in tickets]
        finish = [0] * len(tickets)
        open_slots = set(range(len(tickets)))
        deadline = time.monotonic() + msg["deadline"]
        if msg.get("asleep"):
            # Parked before the writer starts: nothing is read until the writer wakes us.
            assert reader.park()
            print("ready", flush=True)
            select.select([efd], [], [], msg["deadline"])
        else:
            print("ready", flush=True)
        polls = 0
        while open_slots and time.monotonic() < deadline:
            updates = reader.poll()
            polls += 1
            for local, toks, _v, _i, fin, *_rest in updates:
                tokens[local].extend(toks)
                if fin:
                    finish[local] = fin
                    open_slots.discard(local)
            if not updates and reader.park():
                # Parked: only an eventfd write (or the deadline) ends the wait.
                ready, _, _ = select.select([efd], [], [], max(deadline - time.monotonic(), 0))
                if ready:
                    os.read(efd, 8)
        for local in open_slots:
            reader.release(local)
        print(json.dumps({"tokens": tokens, "finish": finish, "polls": polls}), flush=True)


if __name__ == "__main__":
    serve(*(int(a) for a in sys.argv[1:7]))
