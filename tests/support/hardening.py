"""Helpers of the hardening suite (``tests/hardening/test_hardening_*.py``); no tests of its own.

A *rank process* is one simulated TokenSpeed rank (`tsfront.sim.engine.SimEngine`) run as its
own OS process by `RankProcess`, with any identity, rank and group size, so a test can kill one
rank (SIGKILL: no sentinel, the kernel closes its sockets), start it again under the same
identity, or run it inside a network namespace (``prefix=["ip", "netns", "exec", ns]``).
`IORig` is an I/O process with rank processes and attached clients, torn down in reverse.
`slot_state` reads one slot (and its worker's notify ring) out of a mapping of the region, to
say why a stream hangs; `fd_count`, `region_inodes` and `region_mappers` check for leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from support.core_fixtures import DEADLINE, wait_until
from tsfront import ClientConfig, EngineClient, IOProcess

RANK_MAIN = """
import json, os, signal, sys
from tsfront.sim.engine import EngineOptions, SimEngine
address, index, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
options = EngineOptions(**json.loads(sys.argv[5])).replace(hard_exit=True)
engine = SimEngine(address, index, data_parallel_rank=rank, data_parallel_size=size,
                   options=options)
signal.signal(signal.SIGTERM, lambda *_: engine.request_stop())
outcome = engine.run()
os._exit(0 if outcome == "stopped" else 1)
"""


class RankProcess:
    """One simulated rank in its own process (optionally under a command ``prefix``)."""

    def __init__(
        self,
        handshake: str,
        index: int,
        rank: int,
        size: int,
        prefix: Sequence[str] = (),
        **options: Any,
    ) -> None:
        argv = [sys.executable, "-c", RANK_MAIN, handshake, str(index), str(rank), str(size)]
        self.proc = subprocess.Popen(
            [*prefix, *argv, json.dumps(options)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.index = index

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no ENGINE_CORE_DEAD, the kernel closes the sockets."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(DEADLINE)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class IORig:
    io: IOProcess
    config: ClientConfig
    ranks: dict[int, RankProcess] = field(default_factory=dict)  # by rank
    clients: list[EngineClient] = field(default_factory=list)

    def start_rank(self, rank: int, prefix: Sequence[str] = (), **options: Any) -> RankProcess:
        old = self.ranks.get(rank)
        if old is not None:
            old.stop()
        options.setdefault("step_ms", 2.0)
        p = RankProcess(
            self.io.handshake_address,
            self.config.first_engine_index + rank,
            rank,
            self.config.num_engines,
            prefix,
            **options,
        )
        self.ranks[rank] = p
        return p

    async def attach(self, timeout: float = DEADLINE) -> EngineClient:
        client = await EngineClient.attach(self.io.address, timeout=timeout)
        self.clients.append(client)
        return client


@contextlib.asynccontextmanager
async def io_rig(
    num_engines: int,
    *,
    start_ranks: bool = True,
    rank_options: dict[int, dict[str, Any]] | None = None,
    **config: Any,
) -> AsyncIterator[IORig]:
    """An I/O process for ``num_engines`` ranks, each a `RankProcess` (unless told not to)."""
    config.setdefault("handshake_address", "tcp://127.0.0.1:0")
    config.setdefault("handshake_timeout", 30.0)
    cfg = ClientConfig(num_engines=num_engines, **config)
    io = await asyncio.to_thread(IOProcess.start, cfg)
    r = IORig(io, cfg)
    try:
        if start_ranks:
            for rank in range(num_engines):
                r.start_rank(rank, **(rank_options or {}).get(rank, {}))
        yield r
    finally:
        for c in reversed(r.clients):
            await c.close()
        for p in r.ranks.values():
            await asyncio.to_thread(p.stop)
        await asyncio.to_thread(io.stop)


async def wait_state(client: EngineClient, rank: int, state: str, timeout: float = DEADLINE):
    """Poll the engine table until ``rank`` is in ``state``; the seconds it took."""
    t0 = time.monotonic()
    await wait_until(
        lambda: client.load()[rank].state == state, f"rank {rank} {state}", timeout, 0.002
    )
    return time.monotonic() - t0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def region_inodes(pid: int) -> set[int]:
    """Inodes of the tsfront memfds (the slot region) process ``pid`` has mapped.

    tsfront names nothing in /dev/shm: its one shared segment is an anonymous memfd, which
    the kernel frees with the last descriptor and mapping of it. So "no segment outlives its
    owner" means: once the rig is closed and its processes reaped, no live process maps it."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/memfd:tsfront"):
                inodes.add(int(fields[4]))
    return inodes


def region_mappers(inodes: set[int]) -> set[int]:
    """The live processes that still map one of these memfd inodes."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if (
                        len(fields) == 6
                        and fields[5].startswith("/memfd:")
                        and (int(fields[4]) in inodes)
                    ):
                        found.add(int(entry))
                        break
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return found


# Mirrors of the native layout (native/: slot_a_t, slot_b_t, worker_ctl_t), for diagnostics
# only: a hang report shows what the slot and the notify ring said.
_SLOT_LINE0 = struct.Struct("<QQIIIIIiIIQ")
_SLOT_LINE0_FIELDS = (
    "generation",
    "write_seq",
    "state",
    "finish",
    "prompt",
    "completion",
    "cached",
    "engine_index",
    "flags",
    "notified",
    "spilled",
)
_SLOT_STATES = {0: "IDLE", 1: "LIVE", 2: "DONE"}
_WORKER_BYTES = 128


def slot_state(region: Any, worker: int, local: int) -> dict[str, Any]:
    """What shared memory says about ``worker``'s slot ``local``: the slot's header (both
    lines) and the worker's notify ring (head, tail, parked, and whether the slot is among
    the pending entries). Plain reads of a live region: a snapshot for a failure message."""
    lay = region.layout
    spw = lay["slots_per_worker"]
    buf = region.map
    at = lay["slots_off"] + (worker * spw + local) * lay["slot_bytes"]
    state = dict(zip(_SLOT_LINE0_FIELDS, _SLOT_LINE0.unpack_from(buf, at), strict=True))
    state["state"] = _SLOT_STATES.get(state["state"], state["state"])
    (state["read_seq"],) = struct.unpack_from("<Q", buf, at + 64)
    ctl = lay["workers_off"] + worker * _WORKER_BYTES
    # ctl + 16: the rescan request of a native writer that found the ring overrun (padding,
    # so 0, where the layout has no such flag).
    head, wakes, rescan = struct.unpack_from("<QQI", buf, ctl)
    tail, parked = struct.unpack_from("<QI", buf, ctl + 64)
    ring = lay["notify_off"] + worker * spw * 4
    pending = [
        struct.unpack_from("<I", buf, ring + (i % spw) * 4)[0]
        for i in range(tail, min(head, tail + spw))
    ]
    state.update(
        notify_head=head,
        notify_tail=tail,
        parked=parked,
        wakes=wakes,
        rescan=rescan,
        on_notify_ring=local in pending,
    )
    return state
