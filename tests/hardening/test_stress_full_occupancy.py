"""Full-occupancy stress: every slot of every worker in use, with every fault at once.

One I/O process (`IOProcess.start`) serves ``ranks`` simulated ranks (each its own process,
one decode step every ``step_ms``) and ``workers`` worker processes attached with
``slots_per_worker = slots``. Each worker runs one *lane* per slot: a lane opens a stream,
treats it one way, and opens the next as soon as its slot is free, so every slot is in use for
the whole run. A small ``ring_capacity`` makes slow readers spill. Each stream is one of:

* ``read``   — read to its end;
* ``slow``   — read to its end, sleeping between chunks (its ring fills, the I/O spills);
* ``abort``  — read a few chunks, then `RequestStream.abort` or leave the ``async for``;
* ``drop``   — drop the stream (unread, or after one chunk): garbage collection aborts it;
* ``cancel`` — read in a task that is cancelled after a few milliseconds.

Mid-run one worker is SIGKILLed (a fresh worker runs its share again, so ``streams`` are all
checked; the killed worker's are extra) and one rank is SIGKILLed while it holds streams, then
restarted.

Checked for every stream read to its end: exactly the engine's tokens in order
(`expected_tokens`: the sim's token is a function of rid and position), exactly one end — the
chunk with ``finish_reason="length"`` and ``completion_tokens`` = the request's length, or one
`StreamError`, which may only be `EngineDied` naming the killed rank — and no wait for a chunk
longer than ``stall_s``: a watchdog in each worker reports a stream that waits longer as a hang,
with its rid, its slot and what shared memory says about them (`slot_state`), then aborts it
so the run goes on. Streams left early must have received a prefix of the sequence.
Afterwards: each worker's slots all free on its side, ``in_flight`` 0 and nothing spilling in
the I/O process, every slot idle once the workers have left, the I/O process's and the test
process's fds back to where they started, no new /dev/shm entry.

The size comes from ``TSFRONT_STRESS_*`` environment variables (`StressSize`): the test command
runs the default (20,000 streams, 22-35 s on a 2-core machine); ``scripts/stress``
runs 100,000.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))

from support.core_fixtures import (
    expected_tokens,
    private_addresses,
    reap,
    request,
    spawn,
    wait_until,
)
from support.hardening import (
    fd_count,
    io_rig,
    region_inodes,
    region_mappers,
    slot_state,
    wait_state,
)

from tsfront import Busy, ClientClosed, EngineClient, EngineDied, StreamError

MODES = ("read", "slow", "abort", "drop", "cancel")
MODE_WEIGHTS = (55, 12, 13, 8, 12)
#: Failures kept in full per worker (all are counted).
KEEP = 20


@dataclasses.dataclass(frozen=True)
class StressSize:
    """How big a stress run is; each field can be set as ``TSFRONT_STRESS_<NAME>``.

    ``streams`` in total over ``workers`` worker processes with ``slots`` slots each (one lane
    per slot), ``ranks`` simulated ranks stepping every ``step_ms``, ``ring`` tokens per slot
    ring, ``stall_s`` the longest a stream may wait for a chunk, ``seed`` for every random
    choice, ``timeout_s`` the bound on the whole run (0: 60 s + 10 ms a stream).
    """

    streams: int = 20000
    workers: int = 4
    slots: int = 32
    ranks: int = 4
    ring: int = 16
    step_ms: float = 1.0
    stall_s: float = 5.0
    seed: int = 1
    timeout_s: float = 0.0

    @classmethod
    def from_env(cls, **defaults: Any) -> StressSize:
        """The defaults (the class's, then ``defaults``), overridden by the environment."""
        values = dict(defaults)
        for f in dataclasses.fields(cls):
            raw = os.environ.get(f"TSFRONT_STRESS_{f.name.upper()}")
            if raw is not None:
                values[f.name] = type(f.default)(raw)
        return cls(**values)

    @property
    def deadline_s(self) -> float:
        return self.timeout_s or 60.0 + self.streams * 0.01


# ------------------------------------------------------------------------------ worker side


class Tally:
    """What one worker saw: counts, and the first `KEEP` failures of each kind in full."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.engine_died: Counter[int] = Counter()
        self.failures: dict[str, list[str]] = {"hangs": [], "order": [], "ends": [], "fatal": []}

    def fail(self, kind: str, what: str) -> None:
        self.counts[f"{kind}_errors" if kind != "hangs" else "hangs"] += 1
        if len(self.failures[kind]) < KEEP:
            self.failures[kind].append(what)

    def report(self) -> dict:
        return {
            "counts": dict(self.counts),
            "engine_died": dict(self.engine_died),
            "failures": self.failures,
        }


class Watch:
    """One stream under the watchdog: ``since`` is when its reader began waiting (or None)."""

    __slots__ = ("got", "hung", "n", "rid", "since", "stream")

    def __init__(self, rid: str, stream: Any, n: int) -> None:
        self.rid = rid
        self.stream = stream
        self.n = n
        self.got: list[int] = []
        self.since: float | None = None
        self.hung = False


class Worker:
    """One worker process's run: ``quota`` streams over one lane per slot."""

    def __init__(
        self, client: EngineClient, tag: str, quota: int, seed: int, size: StressSize, conn: Any
    ) -> None:
        self.client = client
        self.att = client._att
        self.tag = tag
        self.quota = quota
        self.rng = random.Random(seed)
        self.size = size
        self.conn = conn
        self.tally = Tally()
        self.watches: set[Watch] = set()
        self.next_index = itertools.count()
        self.progress_every = max(1, quota // 20)
        self.stopping = False

    # -- the run ------------------------------------------------------------------------

    async def run(self) -> dict:
        watchdog = asyncio.create_task(self._watchdog())
        lanes = [asyncio.create_task(self._lane()) for _ in range(self.size.slots)]
        await asyncio.gather(*lanes)
        watchdog.cancel()
        att = self.att
        if len(att.slots.free) != att.spw or len(att.slots.streams):
            held = sorted(set(range(att.spw)) - set(att.slots.free))
            self.tally.fail("ends", f"{self.tag}: slots {held} not free after every stream ended")
        report = self.tally.report()
        report["worker"] = att.worker
        return report

    async def _lane(self) -> None:
        counts = self.tally.counts
        while not self.stopping:
            i = next(self.next_index)
            if i >= self.quota:
                return
            try:
                await self._one(f"{self.tag}-{i}")
            except ClientClosed as exc:
                self.stopping = True
                self.tally.fail("fatal", f"{self.tag}-{i}: {exc!r}")
                return
            except Exception:
                self.stopping = True
                self.tally.fail("fatal", f"{self.tag}-{i}: {traceback.format_exc()}")
                return
            counts["streams"] += 1
            if counts["streams"] % self.progress_every == 0:
                self.conn.send(("progress", counts["streams"]))

    async def _submit(self, rid: str, n: int) -> Any:
        deadline = time.monotonic() + self.size.stall_s
        while True:
            try:
                stream = await self.client.generate(request(rid, n))
            except Busy:
                # A stream left by `break` frees its slot when its generator is finalized, a
                # loop iteration later; a slot that never frees is a leak (fails below).
                self.tally.counts["busy"] += 1
                if time.monotonic() > deadline:
                    raise AssertionError(f"{rid}: Busy for {self.size.stall_s}s") from None
                await asyncio.sleep(0.001)
                continue
            if not self.att.slots.free:
                self.tally.counts["all_slots_busy"] += 1
            return stream

    async def _one(self, rid: str) -> None:
        rng = self.rng
        mode = rng.choices(MODES, MODE_WEIGHTS)[0]
        n = rng.randrange(60, 160) if mode == "slow" else rng.randrange(1, 41)
        self.tally.counts[mode] += 1
        stream = await self._submit(rid, n)
        if mode == "drop":
            await self._drop(rid, n, stream)
        elif mode == "cancel":
            await self._cancel(rid, n, stream)
        else:
            await self._read(rid, n, stream, mode)

    # -- the modes --------------------------------------------------------------------------

    async def _read(self, rid: str, n: int, stream: Any, mode: str) -> None:
        """Read (slowly, or only a few chunks for ``abort``), timing each wait for a chunk."""
        rng = self.rng
        watch = Watch(rid, stream, n)
        self.watches.add(watch)
        leave_after = rng.randrange(0, 4) if mode == "abort" else -1
        by_abort = rng.random() < 0.5
        chunks = ends = after_end = 0
        last = error = None
        left = leave_after == 0
        if left:
            stream.abort()  # before its first chunk
        try:
            watch.since = time.monotonic()
            async for chunk in stream:
                watch.since = None
                chunks += 1
                after_end += ends
                watch.got.extend(chunk.output_ids)
                if chunk.finished:
                    ends += 1
                    last = chunk
                if mode == "slow":
                    await asyncio.sleep(rng.uniform(0.002, 0.03))
                if chunks == leave_after and not chunk.finished:
                    left = True
                    if by_abort:
                        stream.abort()
                    else:
                        break  # the async for's generator aborts when it is collected
                watch.since = time.monotonic()
        except StreamError as exc:
            error = exc
        finally:
            watch.since = None
            self.watches.discard(watch)
        if watch.hung:
            return  # reported by the watchdog
        got = watch.got
        self.tally.counts["tokens"] += len(got)
        if left:
            self.tally.counts["left_early"] += 1
            self._check_prefix(rid, n, got)
            return
        if not stream.finished:
            self.tally.fail("ends", f"{rid}: its reader stopped but it is not finished")
            return
        try:
            extra = await anext(stream)  # cannot wait: the stream has ended
        except StopAsyncIteration:
            extra = None
        except StreamError as exc:
            extra = exc
        if extra is not None or after_end:
            self.tally.fail("ends", f"{rid}: more after its end: {extra!r} ({after_end} chunks)")
        self._check_end(rid, n, got, ends, last, error)

    async def _drop(self, rid: str, n: int, stream: Any) -> None:
        if self.rng.random() < 0.5:
            del stream  # unread: its __del__ aborts the request
            return
        watch = Watch(rid, stream, n)
        self.watches.add(watch)
        watch.since = time.monotonic()
        try:
            chunk = await anext(stream)
        except StreamError as exc:
            self._check_error(rid, exc)
            return
        except StopAsyncIteration:
            if not watch.hung:
                self.tally.fail("ends", f"{rid}: ended without a chunk or an error")
            return
        finally:
            watch.since = None
            watch.stream = None
            self.watches.discard(watch)
        self.tally.counts["tokens"] += len(chunk.output_ids)
        self._check_prefix(rid, n, chunk.output_ids)
        del stream  # after one chunk: its __del__ aborts the request

    async def _cancel(self, rid: str, n: int, stream: Any) -> None:
        got: list[int] = []
        ended: list[Any] = []

        async def reader() -> None:
            async for chunk in stream:
                got.extend(chunk.output_ids)
                if chunk.finished:
                    ended.append(chunk)

        task = asyncio.create_task(reader())
        await asyncio.wait({task}, timeout=self.rng.uniform(0.0, 0.02))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except StreamError as exc:
            self._check_error(rid, exc)
        self.tally.counts["tokens"] += len(got)
        if not stream.finished:
            self.tally.fail("ends", f"{rid}: still running after its reader was cancelled")
        if ended:
            self._check_end(rid, n, got, len(ended), ended[-1], None)
        else:
            self._check_prefix(rid, n, got)

    # -- checks ---------------------------------------------------------------------------------

    def _check_prefix(self, rid: str, n: int, got: list[int]) -> None:
        want = expected_tokens(rid, n)
        if got != want[: len(got)]:
            self.tally.fail("order", f"{rid}: {_diff(got, want)}")

    def _check_error(self, rid: str, error: StreamError) -> None:
        if isinstance(error, EngineDied) and error.engine_index is not None:
            self.tally.engine_died[error.engine_index] += 1
        else:
            self.tally.fail("ends", f"{rid}: ended with {type(error).__name__}: {error}")

    def _check_end(
        self, rid: str, n: int, got: list[int], ends: int, last: Any, error: StreamError | None
    ) -> None:
        want = expected_tokens(rid, n)
        if error is not None:
            if ends:
                self.tally.fail("ends", f"{rid}: a finished chunk and then {error!r}")
            self._check_error(rid, error)
            if got != want[: len(got)]:
                self.tally.fail("order", f"{rid}: {_diff(got, want)}")
            return
        if ends != 1:
            self.tally.fail("ends", f"{rid}: {ends} finished chunks")
            return
        if last.finish_reason != "length" or last.completion_tokens != n:
            self.tally.fail(
                "ends",
                f"{rid}: ended {last.finish_reason!r} at completion {last.completion_tokens}, "
                f"want 'length' at {n}",
            )
        if got != want:
            self.tally.fail("order", f"{rid}: {_diff(got, want)}")
        self.tally.counts["finished"] += 1

    # -- watchdog ----------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        stall = self.size.stall_s
        while True:
            # A polling period, not a synchronisation: it bounds how late a hang is seen.
            await asyncio.sleep(min(0.5, stall / 4))
            now = time.monotonic()
            for watch in list(self.watches):
                if watch.since is None or watch.hung or now - watch.since <= stall:
                    continue
                watch.hung = True
                self.tally.fail("hangs", self._describe_hang(watch, now - watch.since))
                watch.stream.abort()  # ends its reader, so the lane goes on

    def _describe_hang(self, watch: Watch, waited: float) -> str:
        stream = watch.stream
        att = self.att
        local = stream.slot
        what = {
            "rid": watch.rid,
            "worker": att.worker,
            "slot": local,
            "ticket": stream.ticket,
            "waited_s": round(waited, 2),
            "tokens_seen": len(watch.got),
            "tokens_expected": watch.n,
            "slot_state": slot_state(att.region, att.worker, local),
            "io_in_flight": att.region.metrics()["in_flight"],
        }
        # What a direct read of the slot finds now: an update here means the data was
        # published but the worker was never told (a lost notification).
        update = att.reader.read(local)
        what["direct_read"] = (
            None if update is None else {"tokens": len(update[1]), "finish": update[4]}
        )
        return json.dumps(what)


def _diff(got: list[int], want: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if at is None:
        return f"{len(got)} tokens, want {len(want)}"
    return f"token {at} is {got[at]}, want {want[at]} ({len(got)} got, {len(want)} wanted)"


def stress_worker_main(
    address: str, tag: str, quota: int, seed: int, size: dict, conn: Any
) -> None:
    """Worker body: attach, run ``quota`` streams, send back a `Tally` report."""

    async def run() -> dict:
        client = await EngineClient.attach(address, timeout=60)
        try:
            return await Worker(client, tag, quota, seed, StressSize(**size), conn).run()
        finally:
            await client.close()

    try:
        conn.send(("ok", asyncio.run(run())))
    except BaseException:
        conn.send(("error", f"{tag}: {traceback.format_exc()}"))
    finally:
        conn.close()


# ------------------------------------------------------------------------------ the run


class Run:
    """The parent's side: the workers, the faults, the figures."""

    def __init__(self, rig: Any, watcher: EngineClient, size: StressSize) -> None:
        self.r = rig
        self.watcher = watcher
        self.size = size
        share = size.streams // size.workers
        self.quotas = {w: share + (w < size.streams % size.workers) for w in range(size.workers)}
        self.workers: dict[int, tuple[Any, Any]] = {}
        self.progress: Counter[int] = Counter()
        self.reports: dict[int, dict] = {}
        self.faults: dict[str, Any] = {}
        self.max_in_flight = 0

    def spawn(self, w: int, quota: int) -> None:
        seed = self.size.seed * 1000 + w
        size = dataclasses.asdict(self.size)
        self.workers[w] = spawn(stress_worker_main, self.r.io.address, f"w{w}", quota, seed, size)

    async def run(self) -> None:
        size = self.size
        for w in range(size.workers):
            self.spawn(w, self.quotas[w])
        deadline = time.monotonic() + size.deadline_s
        victim_worker = size.workers - 1
        rank_task: asyncio.Task | None = None
        while self.workers:
            await self._collect(0.25)
            if not self.r.io.alive():
                raise AssertionError(
                    f"the I/O process died (exit {self.r.io._proc.poll()}; its stderr is above) "
                    f"after {sum(self.progress.values())} streams; faults so far {self.faults}"
                )
            self.max_in_flight = max(self.max_in_flight, self.watcher.metrics()["in_flight"])
            done = sum(self.progress.values())
            if (
                "worker_killed" not in self.faults
                and victim_worker in self.workers
                and self.progress[victim_worker] >= self.quotas[victim_worker] // 4
            ):
                self._kill_worker(victim_worker)
            if rank_task is None and done >= size.streams * 0.4:
                rank_task = asyncio.create_task(self._kill_rank(1))
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the run did not end within {size.deadline_s:.0f}s: progress "
                    f"{dict(self.progress)}, reported {sorted(self.reports)}"
                )
        assert rank_task is not None, "the run ended before the rank could be killed"
        await rank_task

    async def _collect(self, timeout: float) -> None:
        pipes = {pipe: w for w, (_proc, pipe) in self.workers.items()}
        ready = await asyncio.to_thread(multiprocessing.connection.wait, list(pipes), timeout)
        for pipe in ready:
            w = pipes[pipe]
            try:
                kind, body = pipe.recv()
            except EOFError:
                raise AssertionError(f"worker {w} exited without a report") from None
            if kind == "progress":
                self.progress[w] = body
                continue
            proc, _ = self.workers.pop(w)
            _close_worker(proc, pipe)
            if kind != "ok":
                raise AssertionError(f"worker {w} failed:\n{body}")
            self.reports[w] = body

    def _kill_worker(self, w: int) -> None:
        proc, pipe = self.workers.pop(w)
        proc.kill()
        _close_worker(proc, pipe)
        done = self.progress.pop(w, 0)
        self.faults["worker_killed"] = {"worker": w, "streams_done": done}
        # A fresh worker runs the whole share again: the killed worker's streams cannot be
        # checked (it took its view of them with it), so they do not count towards the size.
        replacement = max(self.quotas) + 1
        self.quotas[replacement] = self.quotas[w]
        self.spawn(replacement, self.quotas[replacement])

    async def _kill_rank(self, rank: int) -> None:
        watcher = self.watcher
        # Kill it while it provably holds streams, so their EngineDied is checked.
        await wait_until(lambda: watcher.load()[rank].in_flight > 0, f"rank {rank} busy", 30)
        held = watcher.load()[rank].in_flight
        t0 = time.monotonic()
        await asyncio.to_thread(self.r.ranks[rank].kill)
        await wait_state(watcher, rank, "dead")
        dead = time.monotonic() - t0
        self.r.start_rank(rank, step_ms=self.size.step_ms)
        await wait_state(watcher, rank, "live", 30)
        self.faults["rank_killed"] = {
            "rank": rank,
            "engine_index": watcher.engines()[rank].index,
            "held_streams": held,
            "dead_after_s": round(dead, 3),
            "live_again_after_s": round(time.monotonic() - t0, 2),
        }


def _close_worker(proc: Any, pipe: Any) -> None:
    reap(proc)
    proc.close()
    pipe.close()


async def stress(size: StressSize) -> dict:
    """Run one stress of ``size``; the figures, with every failure listed (never raised for
    a failed stream: the caller asserts on the figures, so one run reports everything)."""
    # The first spawn starts multiprocessing's resource tracker, which keeps an fd here for
    # the life of the process: start it now, so the fd check sees only what the run leaves.
    multiprocessing.get_context("spawn")
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    gc.collect()
    fds0 = fd_count(os.getpid())
    t0 = time.monotonic()
    ranks = {rank: {"step_ms": size.step_ms} for rank in range(size.ranks)}
    async with io_rig(
        size.ranks,
        rank_options=ranks,
        max_workers=size.workers + 3,
        slots_per_worker=size.slots,
        ring_capacity=size.ring,
        **private_addresses(),
    ) as r:
        watcher = await r.attach(timeout=60)
        io_fds0 = fd_count(r.io.pid)
        region = region_inodes(r.io.pid)
        assert region, "the I/O process maps no tsfront region: the leak check would watch nothing"
        run = Run(r, watcher, size)
        try:
            await run.run()
        finally:
            for proc, pipe in run.workers.values():
                proc.kill()
                _close_worker(proc, pipe)
        seconds = time.monotonic() - t0
        io_pid_alive = r.io.alive()
        await wait_until(lambda: watcher.metrics()["in_flight"] == 0, "in_flight 0", 30)
        await wait_until(lambda: watcher.metrics()["spilling_slots"] == 0, "no spill", 30)
        await wait_until(lambda: fd_count(r.io.pid) <= io_fds0, f"I/O fds back to {io_fds0}", 30)
        metrics = watcher.metrics()
        me = watcher._att.worker
        held = [
            (w, local, st)
            for w in range(size.workers + 3)
            if w != me
            for local in range(size.slots)
            if (st := slot_state(watcher._att.region, w, local))["state"] != "IDLE"
            or st["generation"]
        ]
        io_fds = fd_count(r.io.pid)
    gc.collect()
    await wait_until(lambda: fd_count(os.getpid()) <= fds0, f"test fds back to {fds0}", 10)
    counts: Counter[str] = Counter()
    engine_died: Counter[int] = Counter()
    failures: dict[str, list[str]] = {}
    for report in run.reports.values():
        counts.update(report["counts"])
        engine_died.update({int(k): v for k, v in report["engine_died"].items()})
        for kind, items in report["failures"].items():
            failures.setdefault(kind, []).extend(items)
    return {
        "streams": counts["streams"],
        "streams_in_killed_worker": run.faults.get("worker_killed", {}).get("streams_done"),
        "tokens": counts["tokens"],
        "seconds": round(seconds, 1),
        "hangs": counts["hangs"],
        "order_errors": counts["order_errors"],
        "end_errors": counts["ends_errors"],
        "fatal_errors": counts["fatal_errors"],
        "finished": counts["finished"],
        "left_early": counts["left_early"],
        "modes": {m: counts[m] for m in MODES},
        "engine_died": dict(engine_died),
        "all_slots_busy": counts["all_slots_busy"],
        "workers_at_full": [
            w for w, report in sorted(run.reports.items()) if report["counts"].get("all_slots_busy")
        ],
        "workers_reported": sorted(run.reports),
        "busy": counts["busy"],
        "max_in_flight": run.max_in_flight,
        "capacity": size.workers * size.slots,
        "spilled_tokens": metrics["spilled_tokens"],
        "io_metrics": dict(metrics),
        "in_flight_after": metrics["in_flight"],
        "slots_not_idle_after": held[:KEEP],
        "io_alive": io_pid_alive,
        "io_fds": [io_fds0, io_fds],
        "test_fds": [fds0, fd_count(os.getpid())],
        "region_still_mapped_by": sorted(region_mappers(region)),
        "faults": run.faults,
        "failures": failures,
        "size": dataclasses.asdict(size),
    }


def summary(figures: dict) -> str:
    """One line of the headline figures, then the failures (if any), one per line."""
    head = {k: figures[k] for k in ("streams", "tokens", "seconds", "hangs", "order_errors")}
    lines = [json.dumps(head), json.dumps({k: v for k, v in figures.items() if k != "failures"})]
    for kind, items in figures["failures"].items():
        lines.extend(f"{kind}: {item}" for item in items)
    return "\n".join(lines)


def check(figures: dict) -> None:
    """Assert everything the stress promises; the message carries every failure."""
    text = summary(figures)
    assert figures["hangs"] == 0, f"streams hung:\n{text}"
    assert figures["order_errors"] == 0, f"tokens out of order:\n{text}"
    assert figures["end_errors"] == 0, f"streams did not end exactly once:\n{text}"
    assert figures["fatal_errors"] == 0, f"a worker lost its client:\n{text}"
    assert figures["io_alive"], text
    assert set(figures["faults"]) == {"worker_killed", "rank_killed"}, (
        f"a fault was missed:\n{text}"
    )
    killed = figures["faults"]["rank_killed"]["engine_index"]
    assert set(figures["engine_died"]) <= {killed}, f"EngineDied off the killed rank:\n{text}"
    assert figures["engine_died"], f"the rank kill ended no stream that was read:\n{text}"
    assert figures["in_flight_after"] == 0, text
    # Counted and recovered is still a defect here: under full occupancy the notify ring's
    # invariant must hold and no handler may fail (counters of the I/O process, when it has
    # them).
    assert figures["io_metrics"].get("notify_overflows", 0) == 0, text
    assert figures["io_metrics"].get("handler_errors", 0) == 0, text
    assert figures["slots_not_idle_after"] == [], text
    assert figures["region_still_mapped_by"] == [], text
    assert figures["io_fds"][1] <= figures["io_fds"][0], text
    assert figures["test_fds"][1] <= figures["test_fds"][0], text
    # The limits were reached: every worker had all its slots in use at once (and the I/O
    # process held most of them; sampled, so not all), rings spilled.
    assert figures["workers_at_full"] == figures["workers_reported"], text
    assert figures["max_in_flight"] >= figures["capacity"] // 2, text
    assert figures["spilled_tokens"] > 0, text


@pytest.mark.timeout(300)
async def test_every_stream_ends_once_in_order_at_full_slot_occupancy():
    size = StressSize.from_env()
    figures = await stress(size)
    print(f"\nstress: {summary(figures)}")
    check(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, help="streams in total (default 100,000)")
    args = parser.parse_args()
    size = StressSize.from_env(streams=100_000)
    if args.streams:
        size = dataclasses.replace(size, streams=args.streams)
    figures = asyncio.run(stress(size))
    print(summary(figures))
    try:
        check(figures)
    except AssertionError as exc:
        print(f"FAILED: {str(exc).splitlines()[0]}")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
