"""The notify protocol between a native Writer and a native Reader in two processes.

Every slot of the worker is busy while the Writer streams tokens and ends as fast as it can and
the Reader (tests/support/notify_reader.py, its own process) polls and parks as a worker does. Pins:
every token and every end reaches the reader, in order, in every trial; the Writer never has
more than ``slots_per_worker`` entries outstanding on a ring (the invariant), so an honest run
counts no overflow; a reader that breaks the protocol (clears flags without consuming, so the
ring fills) gets its overflow counted and a rescan that still delivers every end; and the race
itself, made deterministic in one process (the writer publishing from inside a poll), loses
nothing. The two-process tests catch the old race only when both processes happen to run at
once (on a loaded 2-core machine, about one run in three); the in-process one always does.
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import random
import select
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tsfront import _native
from tsfront.wire import BatchTokenIDOutSlim, encode_output

WORKERS, SPW, CAP, ENGINES = 1, 64, 4096, 1
FIN_DUPLICATE = 18
HELPER = Path(__file__).parents[1] / "support" / "notify_reader.py"
# Offsets inside a worker control block and a slot's line A (native/region.h).
CTL_HEAD, CTL_TAIL = 0, 64
SLOT_NOTIFIED = 44


def encode(rows: list[tuple[str, list[int], str]]) -> bytes:
    """A 14-element output frame, one row per (rid, tokens, finish)."""
    n = len(rows)
    batch = BatchTokenIDOutSlim(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [3] * n,
        [0] * n,
        [0] * n,
        [[] for _ in rows],
        [[] for _ in rows],
        0,
        n,
        0,
        1,
        100,
    )
    return encode_output(batch, form=14)


class Pair:
    """A Writer here and worker 0's Reader in a child process, over one memfd."""

    def __init__(self, spw: int = SPW, cap: int = CAP) -> None:
        self.spw, self.cap = spw, cap
        self.layout = _native.layout(
            num_workers=WORKERS, slots_per_worker=spw, ring_capacity=cap, max_engines=ENGINES
        )
        self.memfd = os.memfd_create("tsfront-notify-test", os.MFD_CLOEXEC)
        os.ftruncate(self.memfd, self.layout["total_bytes"])
        self.map = mmap.mmap(self.memfd, self.layout["total_bytes"], mmap.MAP_SHARED)
        self.writer = _native.Writer(self.map, WORKERS, spw, cap, ENGINES)
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.writer.set_worker_fd(0, self.efd)
        self.child = subprocess.Popen(
            [sys.executable, str(HELPER)]
            + [str(v) for v in (self.memfd, self.efd, WORKERS, spw, cap, ENGINES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(self.memfd, self.efd),
        )
        self.ticket = 0

    def line(self, timeout: float) -> str:
        """The child's next output line, or fail after `timeout` seconds."""
        ready, _, _ = select.select([self.child.stdout], [], [], timeout)
        assert ready, f"the reader process said nothing for {timeout} s"
        out = self.child.stdout.readline()
        assert out, f"the reader process exited (rc={self.child.poll()})"
        return out

    def start_trial(self, deadline: float = 5.0, asleep: bool = False) -> list[bytes]:
        """Have the reader expect a fresh ticket on every slot, then bind them all."""
        tickets = [self.ticket + 1 + i for i in range(self.spw)]
        self.ticket += self.spw
        msg = {"tickets": tickets, "deadline": deadline, "asleep": asleep}
        self.child.stdin.write(json.dumps(msg) + "\n")
        self.child.stdin.flush()
        assert self.line(30).strip() == "ready"
        rids = [f"t{t}".encode() for t in tickets]
        for local, (rid, ticket) in enumerate(zip(rids, tickets, strict=True)):
            assert self.writer.bind(rid, local, ticket, False, FIN_DUPLICATE, 0)
        return rids

    def result(self) -> dict:
        return json.loads(self.line(30))

    def outstanding(self) -> int:
        """head - tail of worker 0's notify ring, as the shared control block says now."""
        off = self.layout["workers_off"]
        head = struct.unpack_from("<Q", self.map, off + CTL_HEAD)[0]
        tail = struct.unpack_from("<Q", self.map, off + CTL_TAIL)[0]
        return head - tail

    def close(self) -> None:
        if self.child.poll() is None:
            try:
                self.child.stdin.write('{"quit": true}\n')
                self.child.stdin.flush()
                self.child.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.child.kill()
                self.child.wait()
        self.child.stdin.close()
        self.child.stdout.close()
        self.writer.set_worker_fd(0, -1)
        del self.writer
        self.map.close()
        os.close(self.memfd)
        os.close(self.efd)


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def stream_frames(
    rids: list[bytes], steps: int, rng: random.Random, burst: int = 1
) -> tuple[list[bytes], list]:
    """Frames for one trial: each step gives every open slot `burst` tokens (numbered on), rows
    in a random order; each slot ends with "stop" on its own step among the last eight, so
    slots end while the others still stream. Returns the frames and, per slot, the tokens the
    reader must see."""
    ends = [steps - 1 - rng.randrange(8) for _ in rids]
    expected: list[list[int]] = [[] for _ in rids]
    frames = []
    for step in range(steps):
        rows = []
        for local, rid in enumerate(rids):
            if step > ends[local]:
                continue
            toks = list(range(step * burst, (step + 1) * burst))
            expected[local].extend(toks)
            rows.append((rid.decode(), toks, "stop" if step == ends[local] else ""))
        rng.shuffle(rows)
        frames.append(encode(rows))
    return frames, expected


def run_trial(
    pair: Pair, rng: random.Random, steps: int, sample: list[int] | None, burst: int = 1
) -> dict:
    rids = pair.start_trial()
    frames, expected = stream_frames(rids, steps, rng, burst)
    writer = pair.writer
    for f in frames:
        writer.ingest(f)
        writer.flush_spills()
        writer.wake()
        if sample is not None:
            sample.append(pair.outstanding())
    while writer.flush_spills():
        writer.wake()
    writer.wake()
    got = pair.result()
    return {"got": got, "expected": expected}


def test_every_token_and_end_reaches_a_reader_polling_in_another_process(pair):
    """All 64 slots busy, 60 trials: no end and no token is ever lost (a ring that overran lost
    ends and tokens in some of the trials of most runs)."""
    rng = random.Random(9)
    lost = []
    for trial in range(60):
        # Bursts of tokens make each poll slow next to a frame, so the writer keeps publishing
        # while the reader is half-way through its entries: the window where a ring overran.
        out = run_trial(pair, rng, steps=24, sample=None, burst=48)
        got, expected = out["got"], out["expected"]
        for local in range(SPW):
            if got["finish"][local] != _native.FIN_STOP or got["tokens"][local] != expected[local]:
                lost.append((trial, local, got["finish"][local], len(got["tokens"][local])))
    assert lost == [], f"{len(lost)} streams lost their end or tokens: {lost[:5]}"
    assert pair.writer.stats()["notify_overflows"] == 0


def test_outstanding_notify_entries_never_exceed_slots_per_worker(pair):
    """The invariant, hammered: with every slot busy and the reader polling concurrently, head -
    tail of the ring never exceeds slots_per_worker, and no overflow is ever counted."""
    rng = random.Random(90)
    sample: list[int] = []
    for _ in range(8):
        out = run_trial(pair, rng, steps=120, sample=sample)
        assert out["got"]["tokens"] == out["expected"]
    assert max(sample) <= SPW, f"{sum(s > SPW for s in sample)} samples above {SPW}"
    assert pair.writer.stats()["notify_overflows"] == 0


def test_a_reader_that_breaks_the_protocol_is_counted_and_rescanned(pair):
    """A lying reader clears its slots' `notified` flags without consuming their entries (its
    tail stays put). The Writer then finds the ring full: it must not overwrite an entry, must
    count the overflow, and must make the reader rescan, so every end still arrives."""
    rids = pair.start_trial(asleep=True)
    half = SPW // 2
    writer = pair.writer
    slots_off, slot_bytes = pair.layout["slots_off"], pair.layout["slot_bytes"]

    def lie() -> None:
        for local in range(SPW):
            struct.pack_into("<I", pair.map, slots_off + local * slot_bytes + SLOT_NOTIFIED, 0)

    # The reader is parked and reads nothing until the wake at the end.
    writer.ingest(encode([(rids[i].decode(), [1], "") for i in range(half)]))
    lie()
    writer.ingest(encode([(rids[i].decode(), [2], "") for i in range(half)]))
    lie()
    assert pair.outstanding() == SPW  # the ring is full of entries for the first half
    # The second half ends: none of them has an entry, and there is no room for one.
    writer.ingest(encode([(rids[i].decode(), [7], "stop") for i in range(half, SPW)]))
    stats = writer.stats()
    assert stats["notify_overflows"] == half
    assert pair.outstanding() == SPW  # nothing was overwritten
    writer.ingest(encode([(rids[i].decode(), [3], "stop") for i in range(half)]))
    writer.wake()
    got = pair.result()
    assert got["finish"] == [_native.FIN_STOP] * SPW
    assert got["tokens"] == [[1, 2, 3]] * half + [[7]] * half


def test_a_writer_publishing_while_a_poll_is_half_way_loses_nothing():
    """The race, made deterministic in one process: the Writer publishes while the Reader is
    half-way through a poll (run from a garbage-collector callback, which CPython calls from
    the poll's own list allocations). The ring is full (all 64 slots notified), half the slots
    have ended, and mid-poll the other half stream on: every end must still be delivered. A
    reader that cleared flags before consuming its entries lost the ends whose entries the
    writer overwrote.

    The poll's tuples and lists come from CPython's free lists whenever those hold any, and an
    object taken from a free list counts nothing towards a collection: an earlier test that
    left them full made the poll trigger none (seen in CI). So each run first holds enough
    tuples, lists and dicts to empty them (`_drain_free_lists`), and the poll's allocations are
    new objects. CPython still skips a collection while another thread's is under way, so a
    run whose poll saw none is made again (a run takes microseconds); none in 50 fails."""
    for _ in range(50):
        if _publish_mid_poll_once():
            return
    state = (
        f"collector on: {gc.isenabled()}, counts {gc.get_count()}, thresholds "
        f"{gc.get_threshold()}, frozen {gc.get_freeze_count()}, threads "
        f"{threading.active_count()}"
    )
    raise AssertionError(f"the writer did not run during the poll (50 tries; {state})")


def _drain_free_lists() -> list[object]:
    """Objects that, while held, leave CPython 3.11's free lists empty: 2,000 tuples of each
    size below 20 (its `PyTuple_MAXFREELIST`, `PyTuple_MAXSAVESIZE`), 80 lists and dicts."""
    held: list[object] = [tuple(range(size)) for size in range(1, 21) for _ in range(2001)]
    held += [[None] for _ in range(81)]
    held += [{0: None} for _ in range(81)]
    return held


def _publish_mid_poll_once() -> bool:
    """One run of the race; False if no collection came during the poll (nothing checked)."""
    spw = SPW
    size = _native.layout(
        num_workers=1, slots_per_worker=spw, ring_capacity=CAP, max_engines=ENGINES
    )["total_bytes"]
    region = mmap.mmap(-1, size)
    writer = _native.Writer(region, 1, spw, CAP, ENGINES)
    reader = _native.Reader(region, 0, 1, spw, CAP, ENGINES)
    rids = [f"r{i}" for i in range(spw)]
    for local, rid in enumerate(rids):
        reader.expect(local, local + 1)
        assert writer.bind(rid.encode(), local, local + 1, False, FIN_DUPLICATE, 0)
    writer.ingest(encode([(rid, [0], "") for rid in rids]))  # 64 entries: the ring is full
    ended = range(0, spw, 2)
    writer.ingest(encode([(rids[i], [1], "stop") for i in ended]))  # already on the ring
    streaming = encode([(rids[i], [1], "") for i in range(1, spw, 2)])
    fired = []

    def publish_mid_poll(phase, _info):
        if phase == "start" and not fired:
            fired.append(True)
            writer.ingest(streaming)

    held = _drain_free_lists()
    threshold = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.callbacks.append(publish_mid_poll)
    gc.set_threshold(1)
    gc.enable()
    try:
        first = reader.poll()
    finally:
        if not was_enabled:
            gc.disable()
        gc.set_threshold(*threshold)
        gc.callbacks.remove(publish_mid_poll)
    del held
    if not fired:
        return False
    updates = first + reader.poll()
    finish = {u[0]: u[4] for u in updates if u[4]}
    tokens: dict[int, list[int]] = {}
    for u in updates:
        tokens.setdefault(u[0], []).extend(u[1])
    assert sorted(finish) == list(ended), f"ends lost: {sorted(set(ended) - set(finish))}"
    assert all(tokens[i] == [0, 1] for i in range(spw))
    assert writer.stats()["notify_overflows"] == 0
    return True
