"""Helpers of the hardening suite (``tests/test_hardening_*.py``); no tests of its own.

A *rank process* is one simulated TokenSpeed rank (`tsfront.sim.engine.SimEngine`) run as its
own OS process by `RankProcess`, with any identity, rank and group size, so a test can kill one
rank (SIGKILL: no sentinel, the kernel closes its sockets), start it again under the same
identity, or run it inside a network namespace (``prefix=["ip", "netns", "exec", ns]``).
`IORig` is an I/O process with rank processes and attached clients, torn down in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from core_fixtures import DEADLINE, wait_until

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


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))
