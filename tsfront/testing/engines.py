"""An I/O process with simulated ranks and an attached client, started and stopped as one.

`engine_rig` starts a real I/O process (``IOProcess.start``: its handshake on loopback TCP,
its engine sockets on private abstract ipc names), a `SimGroup` of ranks dialing it, and one
`EngineClient` attached to it; on the way out it closes every client, stops the I/O process, then
the ranks, in that order (the frontend first, as an orderly shutdown goes), whatever the body
did. `EngineRig.attach` attaches more
clients (closed with the rig). Nothing here imports pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tsfront.client.engine_client import EngineClient
from tsfront.config import ClientConfig
from tsfront.process.ioproc import IOProcess
from tsfront.sim import SimGroup

__all__ = ["DEADLINE", "EngineRig", "engine_rig", "private_addresses"]

#: Seconds a rig waits for its I/O process and ranks to come up (never reached when all works).
DEADLINE = 10.0


def private_addresses() -> dict[str, str]:
    """Input and output addresses on private abstract ipc names, as `ClientConfig` fields.

    An ephemeral TCP port may be one that a rank of another test (or test run) still
    reconnects to, and its ENGINE_CORE_DEAD would then kill our engine. Only the handshake
    must be TCP.
    """
    private = f"ipc://@tsfront-test-{secrets.token_hex(8)}"
    return {"input_address": f"{private}-in", "output_address": f"{private}-out"}


@dataclass
class EngineRig:
    """A running I/O process, its simulated ranks and the clients attached to it."""

    io: IOProcess
    sim: SimGroup
    client: EngineClient
    config: ClientConfig
    clients: list[EngineClient] = field(default_factory=list)
    deadline: float = DEADLINE

    async def attach(self) -> EngineClient:
        """Another worker of the same I/O process (closed with the rig)."""
        client = await EngineClient.attach(self.io.address, timeout=self.deadline)
        self.clients.append(client)
        return client


@contextlib.asynccontextmanager
async def engine_rig(
    ranks: int = 2,
    *,
    first_engine_index: int = 0,
    config: Mapping[str, Any] | None = None,
    rank_options: Mapping[int, Mapping[str, Any]] | None = None,
    deadline: float = DEADLINE,
    **sim_options: Any,
) -> AsyncIterator[EngineRig]:
    """Start an I/O process for ``ranks`` engines, the simulated ranks and one client.

    ``config``: more `ClientConfig` fields; ``rank_options``: per-rank `EngineOptions`
    overrides by 0-based rank; ``sim_options``: `EngineOptions` fields for every rank
    (``step_ms``, ``script``, ``max_batch``...).
    """
    options: dict[str, Any] = private_addresses()
    options.update(config or {})
    cfg = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        num_engines=ranks,
        first_engine_index=first_engine_index,
        handshake_timeout=deadline,
        **options,
    )
    io = await asyncio.to_thread(IOProcess.start, cfg)
    sim = None
    clients: list[EngineClient] = []
    try:
        sim = SimGroup(
            io.handshake_address,
            ranks,
            first_engine_index,
            rank_options=rank_options,
            **sim_options,
        ).start()
        client = await EngineClient.attach(io.address, timeout=deadline)
        clients.append(client)
        yield EngineRig(io, sim, client, cfg, clients, deadline)
    finally:
        # In the order of an orderly shutdown: the frontend goes before its engines (ranks
        # stopped first would send ENGINE_CORE_DEAD, which the I/O process reports as a
        # death, on stderr, in every test).
        for c in reversed(clients):
            await c.close()
        await asyncio.to_thread(io.stop)
        if sim is not None:
            await asyncio.to_thread(sim.stop)
