"""Soak: many requests over 4 ranks and 4 worker processes, with faults injected.

Each worker runs its share with bounded concurrency; per request it either reads to the end,
aborts after the first chunk, or drops the stream unread. Mid-run one worker is SIGKILLed and
replaced, and one rank is SIGKILLed and restarted. Checked: every stream a live worker opened
ends exactly once; every token arrives once and in order (each stream's tokens are a prefix of
the sim's deterministic sequence, the whole of it when it finished); afterwards the I/O
process holds no request (`metrics()["in_flight"] == 0`), its fd count is back to where it
started, and once the rig is closed no process maps its region (the memfd, tsfront's one
shared segment: it names nothing in /dev/shm).

Small size in the test command; the full size is ``scripts/soak`` (100,000 requests), or
``.venv/bin/python tests/hardening/test_hardening_soak.py --requests 100000``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from support.core_fixtures import expected_tokens, reap, request, spawn, wait_until
from support.hardening import fd_count, io_rig, region_inodes, region_mappers, wait_state

from tsfront import EngineClient, StreamError

CONCURRENCY = 48


def soak_worker_main(address: str, tag: str, n: int, seed: int, conn: Any) -> None:
    """Worker body: run ``n`` requests; send back counts (or the first violation)."""

    async def run() -> dict:
        rng = random.Random(seed)
        client = await EngineClient.attach(address, timeout=30)
        counts = dict.fromkeys(("done", "aborted", "dropped", "errors", "tokens"), 0)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(i: int) -> None:
            rid = f"{tag}-{i}"
            n_tokens = rng.randrange(1, 24)
            mode = rng.random()
            async with sem:
                stream = await client.generate(request(rid, n_tokens))
                if mode < 0.05:
                    del stream  # dropped unread: garbage collection aborts it
                    counts["dropped"] += 1
                    return
                got: list[int] = []
                ends = 0
                try:
                    async for chunk in stream:
                        got.extend(chunk.output_ids)
                        if chunk.finished:
                            ends += 1
                        if mode < 0.15:
                            stream.abort()
                            counts["aborted"] += 1
                            break
                except StreamError:
                    ends += 1
                    counts["errors"] += 1
                want = expected_tokens(rid, n_tokens)
                if got != want[: len(got)]:
                    raise AssertionError(f"{rid}: tokens {got} are not a prefix of {want}")
                if mode >= 0.15:
                    if ends != 1:
                        raise AssertionError(f"{rid}: ended {ends} times")
                    counts["done"] += 1
                counts["tokens"] += len(got)

        await asyncio.gather(*(one(i) for i in range(n)))
        await client.close()
        return counts

    try:
        conn.send(("ok", asyncio.run(run())))
    except BaseException as exc:
        conn.send(("error", repr(exc)))
    finally:
        conn.close()


async def soak(requests: int, *, quiet: bool = True) -> dict:
    t0 = time.monotonic()
    async with io_rig(4, max_workers=8, slots_per_worker=256) as r:
        watcher = await r.attach()
        fds0 = fd_count(r.io.pid)
        region = region_inodes(r.io.pid)
        assert region, "the I/O process maps no tsfront region: the leak check would watch nothing"
        share = requests // 4
        workers = {w: spawn(soak_worker_main, r.io.address, f"w{w}", share, w) for w in range(4)}
        await wait_until(lambda: watcher.metrics()["frames"] > 200, "traffic", 30)
        # Fault 1: worker 3 is SIGKILLed mid-run and replaced by a fresh one.
        proc3, _pipe3 = workers.pop(3)
        proc3.kill()
        reap(proc3)
        workers[4] = spawn(soak_worker_main, r.io.address, "w4", share, 4)
        # Fault 2: rank 2 dies (SIGKILL), then comes back.
        r.ranks[2].kill()
        await wait_state(watcher, 2, "dead")
        r.start_rank(2)
        await wait_state(watcher, 2, "live", 30)
        totals: dict[str, int] = {}
        for _w, (proc, pipe) in workers.items():
            ok = await asyncio.to_thread(pipe.poll, 600)
            assert ok, "a soak worker did not report"
            status, counts = pipe.recv()
            assert status == "ok", counts
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
            reap(proc)
        await wait_until(lambda: watcher.metrics()["in_flight"] == 0, "in_flight 0", 30)
        await wait_until(lambda: fd_count(r.io.pid) <= fds0, f"I/O fds back to {fds0}", 30)
        totals["seconds"] = round(time.monotonic() - t0, 1)
        totals["io_fds"] = fd_count(r.io.pid)
        totals["io_fds_before"] = fds0
        totals.update({f"m_{k}": v for k, v in watcher.metrics().items()})
    # The rig is closed and every process of it reaped: nothing maps its region any more.
    assert region_mappers(region) == set(), "a process still maps the closed rig's region"
    if not quiet:
        print(totals)
    return totals


async def test_soak_small():
    totals = await soak(2000)
    print(f"\nsoak: {totals}")
    assert totals["done"] > 1000


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(soak(args.requests, quiet=False))
