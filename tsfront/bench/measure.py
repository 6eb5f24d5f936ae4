"""The throughput suite: processes, phases, CPU accounting and the figures.

CPU of a process is its utime + stime, whole process (every thread, so ZMQ's I/O thread and
the receive path are included). It is read from ``/proc/<pid>/task/*/schedstat`` (the same
kernel counter, ``sum_exec_runtime``, at nanosecond resolution) and cross-checked against
``/proc/<pid>/stat`` (clock ticks). Every figure of one report comes from one run, side by
side on the same frames, so ratios between them hold on any machine.

A *session* is one I/O process (``IOProcess.start``), ``R`` replay engines that handshake
with it, and ``W`` worker processes (``EngineClient.attach``). Its phases:

* **burst** — workers submit ``B`` pinned requests per rank, each consumed by one task;
  every engine then replays ``K`` pre-encoded steps back to back (one token per request per
  step), the last finishing every request. I/O CPU / K is the cost of an engine step.
* **paced** — the same with stamped frames one per ``interval``: each frame is its own loop
  turn in the I/O process (the serving case), so wake-ups per step and latency are measured.
* **idle** — one second with no traffic: CPU of the I/O process and of a parked worker.

The *heap session* (one worker, default ring) measures submission (I/O CPU per request,
submit → engine latency), Python heap per in-flight stream (tracemalloc) and idle CPU with
10,000 streams open.
"""

from __future__ import annotations

import asyncio
import gc
import mmap
import multiprocessing
import os
import secrets
import signal
import socket
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, cast

from tsfront import _native
from tsfront.bench import baselines, replay
from tsfront.bench.cpu import cpu_ns, cpu_stat_ns
from tsfront.bench.replay import make_rids, stamp_age_ns
from tsfront.bench.standins import NullOwner
from tsfront.process.sigint import hold_sigint, ignore_sigint

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext

    from tsfront.client.engine_client import EngineClient
    from tsfront.client.stream import RequestStream
    from tsfront.wire import TokenizedGenerateReqInput


# Rough CPU per row and per frame of each design, only to size K to a target CPU time.
_EST_ROW_US = {
    "tsfront": 0.12,
    "recv": 0.01,
    "recv_port": 0.01,
    "decode": 0.12,
    "forward": 1.2,
    "single": 2.5,
}
_EST_FRAME_US = 12.0


# Set by the driver's SIGINT handler: from then on children get a short grace to exit (one
# may be waiting for frames that will never come) before they are terminated.
_interrupted = threading.Event()
_EXIT_GRACE_S = 10.0
_INTERRUPTED_GRACE_S = 0.5


def _on_sigint(signum: int, frame: object) -> None:
    if _interrupted.is_set():
        return  # already tearing down: a second Ctrl-C must not cut the teardown short
    _interrupted.set()
    raise KeyboardInterrupt


# ----------------------------------------------------------------------------- CPU & stats


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return float(s[k])


def steps_for(design: str, rows: int, target_s: float, minimum: int = 100) -> int:
    """How many steps of a design fit in about ``target_s`` seconds of CPU."""
    per = _EST_FRAME_US + _EST_ROW_US[design] * rows
    return max(minimum, int(target_s * 1e6 / per))


# ----------------------------------------------------------------------------- worker process


def _request(rid: str, rank: int | None) -> TokenizedGenerateReqInput:
    from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

    return TokenizedGenerateReqInput(
        rid=rid,
        input_ids=list(range(100, 116)),
        sampling_params=SamplingParams(max_new_tokens=16384),
        stream=True,
        data_parallel_rank=rank,
    )


async def _generate(client: EngineClient, request: TokenizedGenerateReqInput) -> RequestStream:
    from tsfront.errors import Busy

    while True:
        try:
            return await client.generate(request)
        except Busy:
            await asyncio.sleep(0.0005)


async def _consume(stream: RequestStream, stats: list[int], lat: list[int] | None) -> None:
    from tsfront.errors import StreamError

    chunks = tokens = 0
    try:
        async for chunk in stream:
            chunks += 1
            tokens += len(chunk.output_ids)
            if lat is not None:
                lat.append(stamp_age_ns(chunk.output_ids[-1]))
    except StreamError:
        pass  # the bench closed the client with the stream open
    stats[0] += chunks
    stats[1] += tokens


def worker_main(conn: Connection, address: str, use_uvloop: bool) -> None:
    """Process body of one bench worker: attach, then run the driver's commands."""
    if use_uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(_worker(conn, address))


async def _worker(conn: Connection, address: str) -> None:
    from tsfront.client.engine_client import EngineClient

    client = await EngineClient.attach(address, timeout=60)
    att = client.attachment
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()
    loop.add_reader(conn.fileno(), lambda: commands.put_nowait(conn.recv()))
    os.set_blocking(conn.fileno(), True)  # uvloop made it non-blocking; big replies
    conn.send(("attached", att.worker))
    tasks: list[asyncio.Future] = []
    stats = [0, 0]
    lat: list[int] = []
    spinning = False
    recorder = att.recorder  # request metrics; "record" False/True takes it out and back
    spinner: asyncio.Future | None = None
    held: list = []
    heap_base = 0

    async def spin() -> None:
        while spinning:
            await asyncio.sleep(0)

    while True:
        cmd, *args = await commands.get()
        if cmd == "exit":
            break
        if cmd == "submit":
            rids, ranks, stamped, spacing = args
            requests = [_request(r, k) for r, k in zip(rids, ranks)]
            stats, lat = [0, 0], []
            submit_ns = []
            for req in requests:
                if spacing:
                    await asyncio.sleep(spacing)
                t = time.monotonic_ns()
                stream = await _generate(client, req)
                submit_ns.append(t)
                tasks.append(
                    asyncio.ensure_future(_consume(stream, stats, lat if stamped else None))
                )
            conn.send(("submitted", dict(zip(rids, submit_ns)) if spacing else None))
        elif cmd == "wait":
            await asyncio.gather(*tasks)
            tasks = []
            conn.send(("done", stats, lat))
        elif cmd == "record":
            att.recorder = recorder if args[0] else None
            conn.send(("record", args[0]))
        elif cmd == "wakes":
            conn.send(("wakes", att.reader.wakes()))
        elif cmd == "spin":
            spinning = args[0]
            if spinning:
                spinner = asyncio.ensure_future(spin())
            elif spinner is not None:
                await spinner
                spinner = None
            conn.send(("spin", spinning))
        elif cmd == "heap_submit":
            requests = [_request(r, None) for r in args[0]]
            gc.collect()
            if args[1]:
                tracemalloc.start()
                heap_base = tracemalloc.get_traced_memory()[0]
            for req in requests:
                held.append(await _generate(client, req))
            conn.send(("submitted", len(held)))
        elif cmd == "heap_measure":
            requests = []
            await asyncio.sleep(0.05)
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - heap_base
            tracemalloc.stop()
            conn.send(("heap", used / max(1, len(held))))
        elif cmd == "drop":
            for s in held:
                s.abort()
            held = []
            conn.send(("dropped",))
        else:
            raise RuntimeError(f"unknown command {cmd!r}")
    loop.remove_reader(conn.fileno())
    await client.close()


# ----------------------------------------------------------------------------- in-process


def reader_poll_ns_per_token(rows: int, steps: int = 200, tokens_per_row: int = 1) -> float:
    """`Reader.poll` cost per token: a Writer and a Reader on one private mapping (no IPC).

    Each step ingests one frame of ``rows`` requests (untimed), then one ``poll()`` copies
    every notified slot out (timed with ``time.perf_counter_ns``).
    """
    from tsfront.wire import encode_output

    spw = rows
    lay = _native.layout(num_workers=1, slots_per_worker=spw, ring_capacity=256, max_engines=1)
    mem = mmap.mmap(-1, lay["total_bytes"])
    w = _native.Writer(mem, 1, spw, 256, 1)
    r = _native.Reader(mem, 0, 1, spw, 256, 1)
    rids = make_rids("poll", rows)
    for i, rid in enumerate(rids):
        w.bind(rid.encode(), i, i + 1, False, 18, 0)
        r.expect(i, i + 1)
    batch = replay.batch_of(rids, [1000 + i for i in range(rows)], 1, "", 0)
    batch.output_ids = [[1000 + i + j for j in range(tokens_per_row)] for i in range(rows)]
    frame = encode_output(batch)
    total = 0
    for s in range(steps + 10):
        w.ingest(frame)
        t0 = time.perf_counter_ns()
        out = r.poll()
        dt = time.perf_counter_ns() - t0
        assert len(out) == rows
        del out
        if s >= 10:
            total += dt
    del w, r
    mem.close()
    return total / (steps * rows * tokens_per_row)


def deliver_ns_per_token(rows: int, steps: int = 2000, *, consumers: bool = True) -> dict:
    """The worker's per-token cost, with and without request-metrics recording, side by side.

    One Writer and one worker's Reader on a real region (`Region.create`, metrics area
    included) and ``rows`` streams, each consumed by an ``async for`` task on a uvloop. Each
    step ingests a frame of one-token rows (untimed), then times what the worker does with it:
    the clock reading, ``poll()``, the stream lookup and `RequestStream.deliver` per update
    (as `Attachment._drain` does), `Recorder.updates` on every other step, and the loop
    iteration that runs every consumer task to its next chunk. Only the eventfd read is left
    out. Steps alternate off/on, so both figures share the same frames, cache state and
    machine load; each is the median step (a step the scheduler preempted says nothing).
    Without ``consumers`` no task reads: the step is the delivery path alone, where the
    recording's share is largest.
    """
    import uvloop

    return uvloop.run(_deliver_ns_per_token(rows, steps, consumers))


async def _deliver_ns_per_token(rows: int, steps: int, consumers: bool) -> dict:
    from tsfront.client.stream import RequestStream
    from tsfront.ipc.region import Geometry, Region
    from tsfront.metrics.layout import W_GENERATION_TOKENS
    from tsfront.metrics.recorder import Recorder, monotonic_ns
    from tsfront.wire import encode_output

    g = Geometry(num_workers=1, slots_per_worker=rows, ring_capacity=256, max_engines=1)
    region = Region.create(g)
    w = _native.Writer(region.map, 1, rows, 256, 1)
    r = _native.Reader(region.map, 0, 1, rows, 256, 1)
    rec = Recorder(region, 0, rows)
    att = NullOwner(asyncio.get_running_loop())
    rids = make_rids("rec", rows)
    streams = {}
    t0 = monotonic_ns()
    for i, rid in enumerate(rids):
        w.bind(rid.encode(), i, i + 1, False, 18, 0)
        r.expect(i, i + 1)
        streams[i] = RequestStream(att, rid, i, i + 1)
        rec.started(i, t0)
    consumed = [0]

    async def consume(stream: RequestStream) -> None:
        async for chunk in stream:
            consumed[0] += len(chunk.output_ids)

    tasks = [asyncio.ensure_future(consume(st)) for st in streams.values()] if consumers else []
    await asyncio.sleep(0)  # every task waits on its stream
    batch = replay.batch_of(rids, [1000 + i for i in range(rows)], 1, "", 0)
    frame = encode_output(batch)
    times: dict[bool, list[int]] = {False: [], True: []}
    for s in range(2 * steps + 20):
        on = s % 2 == 1
        w.ingest(frame)
        want = consumed[0] + rows if consumers else 0
        t = time.perf_counter_ns()
        now = monotonic_ns()
        updates = r.poll()
        for update in updates:
            stream = streams.get(update[0])
            if stream is not None:
                stream.deliver(update)
        if on and updates:
            rec.updates(updates, now)
        while consumed[0] < want:
            await asyncio.sleep(0)
        dt = time.perf_counter_ns() - t
        if not consumers:
            for stream in streams.values():
                stream.take_ready()  # what a reading task would take (untimed)
        if s >= 20:
            times[on].append(dt)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # Every token of an "on" step (warm-up included) was counted: the recording really ran.
    assert rec.words[W_GENERATION_TOKENS] == (steps + 10) * rows
    del w, r, rec, streams, updates, tasks
    region.close()
    off = statistics.median(times[False]) / rows
    on_ = statistics.median(times[True]) / rows
    return {
        "worker_ns_per_token_no_recording": off,
        "worker_ns_per_token_recording": on_,
        "recording_cost_ratio": on_ / off,
        "recording_ns_per_token": on_ - off,
        "steps_each": steps,
    }


def ingest_us_per_frame(rows: int, steps: int = 500) -> float:
    """`Writer.ingest` alone (no I/O), for reference: µs per frame of ``rows`` requests."""
    spw = rows
    lay = _native.layout(num_workers=1, slots_per_worker=spw, ring_capacity=256, max_engines=1)
    mem = mmap.mmap(-1, lay["total_bytes"])
    w = _native.Writer(mem, 1, spw, 256, 1)
    r = _native.Reader(mem, 0, 1, spw, 256, 1)
    rids = make_rids("ing", rows)
    for i, rid in enumerate(rids):
        w.bind(rid.encode(), i, i + 1, False, 18, 0)
        r.expect(i, i + 1)
    frame = replay.build_frames(rids, 0).running[0]
    total = 0
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        w.ingest(frame)
        total += time.perf_counter_ns() - t0
        r.poll()
    del w, r
    mem.close()
    return total / steps / 1000


# ----------------------------------------------------------------------------- sessions


def _child_main(target: Callable[..., None], conn: Connection, *args: Any) -> None:
    """Entry of every bench child: ignore SIGINT (the driver answers it), then run."""
    ignore_sigint()
    target(conn, *args)


class _Child:
    """A spawned process and the driver's end of its pipe."""

    def __init__(self, ctx: SpawnContext, target: Callable[..., None], *args: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(target, child, *args), daemon=True)
        # Ctrl-C reaches the whole process group; the driver alone answers it (it tears the
        # children down). SIGINT is held while the child starts: it inherits the block and
        # ignores SIGINT before unblocking it, so it never raises KeyboardInterrupt, not even
        # while still importing; here the signal stays pending, raised below.
        hold = hold_sigint()
        try:
            self.proc.start()
        finally:
            child.close()
            try:
                hold.release()
            except KeyboardInterrupt:
                if self.proc.pid is not None:
                    self.close()  # started, but no session holds it yet: stop it here
                raise

    @property
    def pid(self) -> int:
        return cast(int, self.proc.pid)  # started in __init__

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def recv(self, timeout: float = 120.0) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"bench child {self.pid} did not answer in {timeout}s")
        return self.conn.recv()

    def close(self) -> None:
        """Stop every worker, replay engine and the I/O process."""
        try:
            self.conn.send(("exit",))
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(_INTERRUPTED_GRACE_S if _interrupted.is_set() else _EXIT_GRACE_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


@dataclass
class Snapshot:
    """CPU time of some processes (scheduler and /proc/stat views) at one moment."""

    sched: dict[int, int]
    stat: dict[int, int]
    t: float

    @classmethod
    def take(cls, pids: list[int]) -> Snapshot:
        """Read the CPU time of ``pids`` now."""
        return cls(
            {p: cpu_ns(p) for p in pids}, {p: cpu_stat_ns(p) for p in pids}, time.monotonic()
        )

    def cpu_s(self, later: Snapshot, pid: int) -> float:
        """Seconds of CPU ``pid`` used between this snapshot and ``later`` (scheduler clock)."""
        return (later.sched[pid] - self.sched[pid]) / 1e9

    def stat_s(self, later: Snapshot, pid: int) -> float:
        """The same from /proc/<pid>/stat (utime + stime, tick resolution)."""
        return (later.stat[pid] - self.stat[pid]) / 1e9


class Session:
    """One I/O process, R replay engines and W workers."""

    def __init__(
        self,
        rows: int,
        workers: int,
        ranks: int,
        *,
        ring_capacity: int,
        slots_per_worker: int,
        use_uvloop: bool,
    ) -> None:
        from tsfront.config import ClientConfig
        from tsfront.process.ioproc import IOProcess

        self.rows, self.nw, self.nr = rows, workers, ranks
        self.mp = multiprocessing.get_context("spawn")
        self.config = ClientConfig(
            handshake_address="tcp://127.0.0.1:0",
            num_engines=ranks,
            max_workers=workers,
            slots_per_worker=slots_per_worker,
            ring_capacity=ring_capacity,
            handshake_timeout=60.0,
            submit_queue_depth=16384,
            # Bursts of 10,000 ADDs back to back: room for them in the ring too.
            submit_ring_bytes=16 << 20,
        )
        self.io = IOProcess.start(self.config)
        self.engines: list[_Child] = []
        self.workers: list[_Child] = []
        self.rounds = 0
        try:
            for rank in range(ranks):
                hs = (self.io.handshake_address, rank, rank, ranks)
                self.engines.append(_Child(self.mp, replay.engine_main, hs))
            for _ in range(workers):
                self.workers.append(_Child(self.mp, worker_main, self.io.address, use_uvloop))
            for e in self.engines:
                assert e.recv()[0] == "ready"
            for w in self.workers:
                assert w.recv()[0] == "attached"
        except BaseException:
            self.close()
            raise

    @property
    def io_pid(self) -> int:
        """The I/O process's pid."""
        return self.io.pid

    def close(self) -> None:
        """Stop every worker, then the I/O process, then the replay engines.

        The I/O process goes before the engines: an engine leaving a live I/O process is an
        engine death (logged as a warning), which our own teardown is not.
        """
        for c in self.workers:
            c.close()
        self.io.stop()
        for c in self.engines:
            c.close()

    # -- rounds ---------------------------------------------------------------------------

    def new_round(self, rows: int | None = None, ranks: int | None = None) -> dict:
        """Fresh rids (``rows`` per rank on the first ``ranks`` ranks) and their frames."""
        rows = rows or self.rows
        ranks = ranks or self.nr
        self.rounds += 1
        name = f"q{self.rounds}"
        per_rank = [make_rids(f"{name}r{k}", rows) for k in range(ranks)]
        offsets = []
        for k in range(ranks):
            self.engines[k].send("build", name, per_rank[k], k)
        for k in range(ranks):
            offsets.append(self.engines[k].recv()[1])
        flat = [
            (rid, k) for i in range(rows) for k, rids in enumerate(per_rank) for rid in [rids[i]]
        ]
        return {
            "name": name,
            "per_rank": per_rank,
            "flat": flat,
            "offset": offsets[0],
            "rows": rows,
            "ranks": ranks,
        }

    def submit(self, rnd: dict, *, stamped: bool, workers: int | None = None) -> None:
        """Have the workers submit one round's requests, shared out round-robin."""
        nw = workers or self.nw
        for w in range(nw):
            share = rnd["flat"][w::nw]
            self.workers[w].send("submit", [r for r, _ in share], [k for _, k in share], stamped, 0)
        for w in range(nw):
            assert self.workers[w].recv()[0] == "submitted"
        for k in range(rnd["ranks"]):
            self.engines[k].send("expect", rnd["rows"])
        for k in range(rnd["ranks"]):
            assert self.engines[k].recv()[0] == "got"

    def set_recording(self, on: bool) -> None:
        """Turn every worker's request-metrics recording on or off (it is on by default)."""
        for w in self.workers:
            w.send("record", on)
        for w in self.workers:
            assert w.recv()[0] == "record"

    def wakes(self) -> list[int]:
        """Each worker's count of eventfd wake-ups so far."""
        for w in self.workers:
            w.send("wakes")
        return [w.recv()[1] for w in self.workers]

    def wait_workers(self, nw: int) -> list[tuple]:
        """Wait until the first ``nw`` workers have seen their streams end; their reports."""
        for w in self.workers[:nw]:
            w.send("wait")
        return [self.workers[i].recv(600) for i in range(nw)]

    def run(self, rnd: dict, k: int, *, interval: float = 0.0, workers: int | None = None) -> dict:
        """Replay ``k`` steps of ``rnd`` (burst, or paced with stamps) and account for them."""
        nw = workers or self.nw
        pids = [self.io_pid] + [w.pid for w in self.workers[:nw]]
        wakes0 = self.wakes()
        before = Snapshot.take(pids)
        for e in self.engines[: rnd["ranks"]]:
            if interval:
                e.send("paced", rnd["name"], k, interval, None)
            else:
                e.send("burst", rnd["name"], k, None)
        for e in self.engines[: rnd["ranks"]]:
            assert e.recv(600)[0] == "sent"
        done = self.wait_workers(nw)
        after = Snapshot.take(pids)
        wakes1 = self.wakes()
        chunks = sum(d[1][0] for d in done)
        tokens = sum(d[1][1] for d in done)
        lat = [x for d in done for x in d[2]]
        steps = k * rnd["ranks"]
        io_s = before.cpu_s(after, self.io_pid)
        worker_s = sum(before.cpu_s(after, w.pid) for w in self.workers[:nw])
        return {
            "steps": k,
            "rows": rnd["rows"],
            "ranks": rnd["ranks"],
            "workers": nw,
            "wall_s": after.t - before.t,
            "io_cpu_s": io_s,
            "io_cpu_stat_s": before.stat_s(after, self.io_pid),
            "worker_cpu_s": worker_s,
            "chunks": chunks,
            "tokens": tokens,
            "expected_tokens": rnd["rows"] * steps,
            "wakes_per_worker_step": sum(b - a for a, b in zip(wakes0, wakes1)) / (nw * k),
            "latency_ns": lat,
        }

    def idle(self, seconds: float = 1.0) -> dict:
        """CPU percent of the I/O process and a parked worker over ``seconds`` of no traffic."""
        pids = [self.io_pid, self.workers[0].pid]
        before = Snapshot.take(pids)
        time.sleep(seconds)
        after = Snapshot.take(pids)
        dt = after.t - before.t
        return {
            "io_percent": 100 * before.cpu_s(after, self.io_pid) / dt,
            "worker_percent": 100 * before.cpu_s(after, self.workers[0].pid) / dt,
        }

    # -- baselines --------------------------------------------------------------------------

    def baseline(self, mode: str, rnd: dict, k: int, *, interval: float = 0.0) -> dict:
        """Run one baseline on rank 0's frames of ``rnd``: receiver CPU per step, latency."""
        engine = self.engines[0]
        rids = rnd["per_rank"][0]
        extra: list[_Child] = []
        if mode == "single":
            recv = _Child(self.mp, baselines.single_main, rids, True)
        else:
            opts: dict = {"offset": rnd["offset"]}
            if mode == "forward":
                token = secrets.token_hex(4)
                opts.update(
                    workers=self.nw,
                    token=token,
                    owner={rid: i % self.nw for i, rid in enumerate(rids)},
                )
            recv = _Child(self.mp, baselines.receiver_main, mode, opts)
        try:
            address = recv.recv()[1]
            if mode == "forward":
                for w in range(self.nw):
                    ipc = f"ipc://@tsfront-bench-fwd-{token}-{w}"
                    extra.append(
                        _Child(self.mp, baselines.receiver_main, "forward_sink", {"address": ipc})
                    )
                for c in extra:
                    c.recv()
            time.sleep(0.2)  # let the connections settle
            before = Snapshot.take([recv.pid])
            recv.send("run", k)
            for w, c in enumerate(extra):
                c.send("run", k * len(rids[w :: self.nw]))
            if mode == "single":
                assert recv.recv()[0] == "armed"
            if interval:
                engine.send("paced", rnd["name"], k, interval, address)
            else:
                engine.send("burst", rnd["name"], k, address)
            assert engine.recv(600)[0] == "sent"
            out = recv.recv(600)
            after = Snapshot.take([recv.pid])
            for c in extra:
                c.recv(600)
            return {
                "mode": mode,
                "steps": k,
                "rows": len(rids),
                "cpu_s": before.cpu_s(after, recv.pid),
                "wall_s": after.t - before.t,
                "latency_ns": out[1] if mode == "recv_lat" else [],
                "counts": out[1] if mode == "single" else None,
            }
        finally:
            for c in [recv, *extra]:
                c.close()


# ----------------------------------------------------------------------------- submit floor


def submit_floor(mp: SpawnContext, n: int, interval: float) -> float:
    """The floor of ``n`` requests submitted one at a time, ``interval`` apart: CPU µs per
    request of a process that is only woken by another process's write and sends one message
    to a third asleep in ``recv`` (`baselines.submit_floor_main`), as the I/O process is woken
    by a worker's submission and sends its ADD to an engine."""
    sink = _Child(mp, baselines.wake_sink_main)
    floor: _Child | None = None
    waker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        port = sink.recv()[1]
        floor = _Child(mp, baselines.submit_floor_main, port)
        name = floor.recv()[1]
        sink.send("run", n)
        floor.send("run", n)
        waker.connect(name)
        assert floor.recv()[0] == "serving"
        before = Snapshot.take([floor.pid])
        due = time.monotonic()
        for _ in range(n):
            waker.send(b"x")
            due += interval
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the pace of the submissions, as the worker's
        served = floor.recv(120)
        after = Snapshot.take([floor.pid])
        got = sink.recv(120)
        assert served == ("served", n) and got == ("got", n * baselines.SUBMIT_FLOOR_BYTES)
        return before.cpu_s(after, floor.pid) * 1e6 / n
    finally:
        waker.close()
        for child in (floor, sink):
            if child is not None:
                child.close()


# ----------------------------------------------------------------------------- heap session


def heap_session(streams: int, paced_submits: int, use_uvloop: bool) -> dict:
    """Submission cost and latency, heap per in-flight stream, idle CPU with streams open."""
    s = Session(
        1,
        1,
        1,
        ring_capacity=256,
        slots_per_worker=streams + paced_submits + 16,
        use_uvloop=use_uvloop,
    )
    try:
        w, e = s.workers[0], s.engines[0]
        before = Snapshot.take([s.io_pid])
        w.send("heap_submit", make_rids("burst", streams), False)
        assert w.recv()[0] == "submitted"
        e.send("expect", streams)
        assert e.recv(300)[0] == "got"
        after = Snapshot.take([s.io_pid])
        w.send("drop")
        w.recv()
        w.send("heap_submit", make_rids("heap", streams), True)
        assert w.recv()[0] == "submitted"
        e.send("expect", streams)
        assert e.recv(300)[0] == "got"
        w.send("heap_measure")
        heap = w.recv()[1]
        idle = s.idle(1.0)
        rids2 = make_rids("paced", paced_submits)
        paced_before = Snapshot.take([s.io_pid])
        w.send("submit", rids2, [None] * paced_submits, False, 0.001)
        submitted = w.recv(300)[1]
        e.send("expect", paced_submits)
        arrived = e.recv(300)[1]
        paced_after = Snapshot.take([s.io_pid])
        lat = [arrived[r] - submitted[r] for r in rids2 if r in arrived]
        floor = submit_floor(s.mp, paced_submits, 0.001)
        return {
            "streams": streams,
            "submit_io_us_per_request": before.cpu_s(after, s.io_pid) * 1e6 / streams,
            "submit_burst_wall_s": after.t - before.t,
            # One at a time (1 ms apart): every ADD its own wake-up of the I/O process.
            "submit_paced_io_us_per_request": paced_before.cpu_s(paced_after, s.io_pid)
            * 1e6
            / paced_submits,
            # The least a Python process pays for the same: woken, one send (`submit_floor`).
            "floor_submit_paced_us_per_request": floor,
            "heap_bytes_per_stream": heap,
            "idle_io_percent_10k_streams": idle["io_percent"],
            "idle_worker_percent_10k_streams": idle["worker_percent"],
            "submit_to_engine_p50_us": percentile(lat, 0.5) / 1000,
            "submit_to_engine_p99_us": percentile(lat, 0.99) / 1000,
        }
    finally:
        s.close()


def shm_bytes_per_stream() -> dict:
    """Shared memory per stream for the default ClientConfig (and the slot alone)."""
    from tsfront.config import ClientConfig

    c = ClientConfig()
    lay = _native.layout(
        num_workers=c.max_workers,
        slots_per_worker=c.slots_per_worker,
        ring_capacity=c.ring_capacity,
        max_engines=c.num_engines,
    )
    return {
        "slot_bytes": lay["slot_bytes"],
        "region_bytes_per_stream": lay["total_bytes"] / (c.max_workers * c.slots_per_worker),
        "ring_capacity": c.ring_capacity,
    }


def summarize_latency(values_ns: list[int]) -> dict:
    """p50/p99/p999 (µs) of latencies given in nanoseconds."""
    us = [v / 1000 for v in values_ns]
    return {
        "p50_us": percentile(us, 0.5),
        "p99_us": percentile(us, 0.99),
        "p999_us": percentile(us, 0.999),
        "mean_us": statistics.fmean(us) if us else float("nan"),
        "n": len(us),
        # (quantile, µs) points of the distribution, for the CDF plot.
        "cdf": [(q, percentile(us, q)) for q in _CDF_QUANTILES] if us else [],
    }


_CDF_QUANTILES = [i / 100 for i in range(100)] + [0.995, 0.999, 1.0]


# ----------------------------------------------------------------------------- the suite


@dataclass
class Params:
    """What one run of the suite measures."""

    batches: tuple[int, ...] = (64, 256, 1024)
    workers: tuple[int, ...] = (1, 2, 4)
    ranks: int = 1
    primary_batch: int = 256
    target_cpu_s: float = 1.0
    paced_steps: int = 1000
    paced_interval_s: float = 0.002
    latency_steps: int = 2000
    latency_interval_s: float = 0.001
    latency_batch: int = 1
    heap_streams: int = 10_000
    recording_steps: int = 2000
    submit_paced: int = 300
    ring_capacity: int = 1024
    uvloop: bool = True

    @classmethod
    def quick(cls) -> Params:
        """The ``--quick`` parameters: B=256, one worker, short targets (under a minute)."""
        return cls(
            batches=(256,),
            workers=(1,),
            target_cpu_s=0.25,
            paced_steps=250,
            latency_steps=400,
            submit_paced=100,
            recording_steps=500,
        )


def _bursts(s: Session, rows: int, p: Params) -> dict:
    """Back-to-back bursts totalling about ``p.target_cpu_s`` of I/O CPU, summed.

    A burst is at most ``ring_capacity - 8`` steps, so however far a starved worker falls
    behind, no token ever takes the spill path: the figure is the ring path's.
    """
    total = steps_for("tsfront", rows, p.target_cpu_s)
    per = max(1, min(total, p.ring_capacity - 8))
    acc: dict | None = None
    for _ in range(max(1, round(total / per))):
        rnd = s.new_round()
        s.submit(rnd, stamped=False)
        r = s.run(rnd, per)
        if acc is None:
            acc = r
            acc["wakes"] = r["wakes_per_worker_step"] * per
            continue
        for key in (
            "steps",
            "wall_s",
            "io_cpu_s",
            "io_cpu_stat_s",
            "worker_cpu_s",
            "chunks",
            "tokens",
            "expected_tokens",
        ):
            acc[key] += r[key]
        acc["wakes"] += r["wakes_per_worker_step"] * per
    assert acc is not None  # the loop runs at least once
    acc["wakes_per_worker_step"] = acc["wakes"] / acc["steps"]
    return acc


def _burst_figures(b: dict) -> dict:
    steps = b["steps"] * b["ranks"]
    req_steps = b["rows"] * steps
    return {
        "io_us_per_step": b["io_cpu_s"] * 1e6 / steps,
        "io_request_steps_per_s": req_steps / b["io_cpu_s"],
        "io_cpu_s_per_mtok": b["io_cpu_s"] * 1e6 / b["tokens"],
        "io_stat_us_per_step": b["io_cpu_stat_s"] * 1e6 / steps,
        "wall_request_steps_per_s": req_steps / b["wall_s"],
        "worker_us_per_chunk": b["worker_cpu_s"] * 1e6 / max(1, b["chunks"]),
        "worker_ns_per_token_e2e": b["worker_cpu_s"] * 1e9 / max(1, b["tokens"]),
        "chunks_per_request_step": b["chunks"] / req_steps,
        "tokens_ok": b["tokens"] == b["expected_tokens"],
        "wakes_per_worker_step": b["wakes_per_worker_step"],
        "steps": b["steps"],
        "wall_s": b["wall_s"],
    }


def _baseline_figures(r: dict) -> dict:
    rows = r["rows"] * r["steps"]
    return {
        "us_per_step": r["cpu_s"] * 1e6 / r["steps"],
        "request_steps_per_s": rows / r["cpu_s"] if r["cpu_s"] else float("inf"),
        "cpu_s_per_mtok": r["cpu_s"] * 1e6 / rows,
        "wall_request_steps_per_s": rows / r["wall_s"],
        "steps": r["steps"],
    }


class _Progress:
    """Progress lines on stderr: phase k of n, percent done, time so far."""

    def __init__(self, p: Params, verbose: bool) -> None:
        self.verbose = verbose
        # A session's bursts and four baselines; the primary batch adds paced, two latency
        # phases and idle; each extra worker count is one session; then the heap session.
        self.total = 5 * len(p.batches) + 4 * (p.primary_batch in p.batches)
        self.total += len(p.workers[1:]) + 1
        self.done = 0
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        if not self.verbose:
            return
        percent = 100 * self.done // self.total
        self.done += 1
        elapsed = time.monotonic() - self.start
        sys.stderr.write(
            f"tsfront bench: [{self.done}/{self.total} {percent:3d}% {elapsed:5.1f}s] {message}\n"
        )
        sys.stderr.flush()


def run_suite(p: Params, verbose: bool = False) -> dict:
    """Run every measurement; returns the report (flat headline keys plus details).

    With ``verbose``, one progress line per phase goes to stderr. SIGINT (Ctrl-C) raises
    `KeyboardInterrupt` here after every child is stopped; the children ignore it.
    """
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        return _run_suite(p, verbose)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_suite(p: Params, verbose: bool) -> dict:
    t_start = time.monotonic()
    out: dict = {"by_batch": {}, "by_workers": {}}
    w0 = p.workers[0]
    _log = _Progress(p, verbose)
    for rows in p.batches:
        _log(f"session B={rows} W={w0} R={p.ranks}: bursts")
        streams = rows * p.ranks
        s = Session(
            rows,
            w0,
            p.ranks,
            ring_capacity=p.ring_capacity,
            slots_per_worker=-(-streams // w0) + 8,
            use_uvloop=p.uvloop,
        )
        try:
            entry: dict = {}
            entry["tsfront"] = _burst_figures(_bursts(s, rows, p))
            rnd = s.new_round()
            for mode in ("recv", "decode", "forward", "single"):
                kb = steps_for(mode, rows, p.target_cpu_s)
                _log(f"  baseline {mode} K={kb}")
                entry[mode] = _baseline_figures(s.baseline(mode, rnd, kb))
            entry["reader_poll_ns_per_token"] = reader_poll_ns_per_token(rows)
            entry["recording"] = deliver_ns_per_token(rows, p.recording_steps)
            entry["recording_delivery_only"] = deliver_ns_per_token(
                rows, p.recording_steps, consumers=False
            )
            entry["ingest_only_us_per_frame"] = ingest_us_per_frame(rows)
            if rows == p.primary_batch:
                seconds = p.paced_steps * p.paced_interval_s * 3
                _log(
                    f"  paced: 3 runs of {p.paced_steps} steps, one per "
                    f"{p.paced_interval_s * 1e3:g} ms (~{seconds:.0f}s)"
                )
                rnd = s.new_round()
                s.submit(rnd, stamped=True)
                paced = s.run(rnd, p.paced_steps, interval=p.paced_interval_s)
                entry["paced"] = {
                    **_burst_figures(paced),
                    "latency_all_tasks": summarize_latency(paced["latency_ns"]),
                    "interval_s": p.paced_interval_s,
                }
                for mode in ("recv", "recv_port", "decode"):
                    r = s.baseline(mode, rnd, p.paced_steps, interval=p.paced_interval_s)
                    entry[f"{mode}_paced"] = _baseline_figures(r)
                lat_rows = p.latency_batch
                for mode in ("parked", "busy"):
                    seconds = p.latency_steps * p.latency_interval_s
                    _log(f"  latency {mode}: {p.latency_steps} steps (~{seconds:.1f}s)")
                    rnd = s.new_round(rows=lat_rows, ranks=1)
                    s.submit(rnd, stamped=True, workers=1)
                    if mode == "busy":
                        s.workers[0].send("spin", True)
                        s.workers[0].recv()
                    r = s.run(rnd, p.latency_steps, interval=p.latency_interval_s, workers=1)
                    if mode == "busy":
                        s.workers[0].send("spin", False)
                        s.workers[0].recv()
                    entry[f"latency_{mode}"] = {
                        **summarize_latency(r["latency_ns"]),
                        "io_us_per_step": r["io_cpu_s"] * 1e6 / r["steps"],
                        "wakes_per_worker_step": r["wakes_per_worker_step"],
                    }
                hop = s.baseline("recv_lat", rnd, p.latency_steps, interval=p.latency_interval_s)
                entry["zmq_hop"] = summarize_latency(hop["latency_ns"])
                entry["zmq_hop"]["us_per_step"] = hop["cpu_s"] * 1e6 / hop["steps"]
                _log("  idle (1s)")
                entry["idle"] = s.idle(1.0)
            out["by_batch"][rows] = entry
        finally:
            s.close()
    for nw in p.workers[1:]:
        rows = p.primary_batch
        _log(f"session B={rows} W={nw} R={p.ranks}")
        streams = rows * p.ranks
        s = Session(
            rows,
            nw,
            p.ranks,
            ring_capacity=p.ring_capacity,
            slots_per_worker=-(-streams // nw) + 8,
            use_uvloop=p.uvloop,
        )
        try:
            entry = {"tsfront": _burst_figures(_bursts(s, rows, p))}
            rnd = s.new_round()
            kb = steps_for("forward", rows, p.target_cpu_s)
            entry["forward"] = _baseline_figures(s.baseline("forward", rnd, kb))
            out["by_workers"][nw] = entry
        finally:
            s.close()
    if p.primary_batch in p.batches and w0 not in out["by_workers"]:
        e = out["by_batch"][p.primary_batch]
        out["by_workers"][w0] = {"tsfront": e["tsfront"], "forward": e["forward"]}
    _log(f"heap session: {p.heap_streams} streams")
    out["heap"] = heap_session(p.heap_streams, p.submit_paced, p.uvloop)
    out["shm"] = shm_bytes_per_stream()
    out["elapsed_s"] = time.monotonic() - t_start
    out.update(_headline(p, out))
    return out


def _headline(p: Params, out: dict) -> dict:
    primary = p.primary_batch if p.primary_batch in out["by_batch"] else p.batches[0]
    e = out["by_batch"][primary]
    t = e["tsfront"]
    hop50 = e.get("zmq_hop", {}).get("p50_us", float("nan"))
    busy = e.get("latency_busy", {})
    parked = e.get("latency_parked", {})
    paced = e.get("paced", {})
    idle = e.get("idle", {})
    rec = e.get("recording", {})
    h = {
        "batch": primary,
        "workers": p.workers[0],
        "ranks": p.ranks,
        "io_us_per_step": t["io_us_per_step"],
        "io_request_steps_per_s": t["io_request_steps_per_s"],
        "io_tokens_per_s": t["io_request_steps_per_s"],  # one token per request-step
        "io_cpu_s_per_mtok": t["io_cpu_s_per_mtok"],
        "io_us_per_step_paced": paced.get("io_us_per_step", float("nan")),
        "floor_recv_us_per_step": e["recv"]["us_per_step"],
        "floor_decode_us_per_step": e["decode"]["us_per_step"],
        "floor_recv_us_per_step_paced": e.get("recv_paced", {}).get("us_per_step", float("nan")),
        "floor_recv_port_us_per_step_paced": e.get("recv_port_paced", {}).get(
            "us_per_step", float("nan")
        ),
        "floor_decode_us_per_step_paced": e.get("decode_paced", {}).get(
            "us_per_step", float("nan")
        ),
        "forwarding_us_per_step": e["forward"]["us_per_step"],
        "forwarding_cpu_s_per_mtok": e["forward"]["cpu_s_per_mtok"],
        "single_process_request_steps_per_s": e["single"]["request_steps_per_s"],
        "ratio_vs_decode_floor": e["decode"]["us_per_step"] / t["io_us_per_step"],
        "ratio_vs_forwarding": e["forward"]["cpu_s_per_mtok"] / t["io_cpu_s_per_mtok"],
        "worker_ns_per_token": e["reader_poll_ns_per_token"],
        "worker_us_per_chunk": paced.get("worker_us_per_chunk", float("nan")),
        "worker_us_per_chunk_burst": t["worker_us_per_chunk"],
        "worker_ns_per_token_burst": t["worker_ns_per_token_e2e"],
        "worker_ns_per_token_recording": rec.get("worker_ns_per_token_recording", float("nan")),
        "worker_ns_per_token_no_recording": rec.get(
            "worker_ns_per_token_no_recording", float("nan")
        ),
        "recording_cost_ratio": rec.get("recording_cost_ratio", float("nan")),
        "recording_cost_ratio_delivery_only": e.get("recording_delivery_only", {}).get(
            "recording_cost_ratio", float("nan")
        ),
        "wakes_per_worker_step": paced.get("wakes_per_worker_step", float("nan")),
        "wakes_per_worker_step_burst": t["wakes_per_worker_step"],
        "idle_cpu_percent": max(
            idle.get("io_percent", float("nan")),
            idle.get("worker_percent", float("nan")),
            out["heap"]["idle_io_percent_10k_streams"],
            out["heap"]["idle_worker_percent_10k_streams"],
        ),
        "send_to_task_p50_us_busy": busy.get("p50_us", float("nan")),
        "send_to_task_p50_us_parked": parked.get("p50_us", float("nan")),
        "zmq_hop_p50_us": hop50,
        "frame_to_task_p50_us": busy.get("p50_us", float("nan")) - hop50,
        "frame_to_task_p99_us": busy.get("p99_us", float("nan")) - hop50,
        "frame_to_task_p999_us": busy.get("p999_us", float("nan")) - hop50,
        "frame_to_task_p50_us_parked": parked.get("p50_us", float("nan")) - hop50,
        "frame_to_task_p99_us_parked": parked.get("p99_us", float("nan")) - hop50,
        "frame_to_task_p999_us_parked": parked.get("p999_us", float("nan")) - hop50,
        "submit_io_us_per_request": out["heap"]["submit_io_us_per_request"],
        "submit_paced_io_us_per_request": out["heap"]["submit_paced_io_us_per_request"],
        "floor_submit_paced_us_per_request": out["heap"]["floor_submit_paced_us_per_request"],
        "submit_to_engine_p50_us": out["heap"]["submit_to_engine_p50_us"],
        "submit_to_engine_p99_us": out["heap"]["submit_to_engine_p99_us"],
        "shm_bytes_per_stream": out["shm"]["region_bytes_per_stream"],
        "heap_bytes_per_stream": out["heap"]["heap_bytes_per_stream"],
    }
    return h
