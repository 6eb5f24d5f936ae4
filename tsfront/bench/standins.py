"""What the in-process measures stand in for: a stream's slot table and uvicorn's request cycle.

`NullOwner` is the slot table a `tsfront.client.stream.RequestStream` reports to, with nothing
to free or abort (the throughput suite's worker-side measure, the push micro-benchmark).
`TransportCycle` is what `tsfront.serve.core.push.Pusher` and the drain's native pass read of
uvicorn's `RequestResponseCycle`, over a real connection's transport; a measure (or a test)
makes `Pusher` take it for uvicorn's by patching ``tsfront.serve.core.push._cycle_types``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tsfront.client.stream import RequestStream

__all__ = ["NullOwner", "TransportCycle"]


class NullOwner:
    """What a `RequestStream` needs of its slot table (`SlotOwner`): nothing to free or abort."""

    disaggregated = False

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def release(self, stream: RequestStream) -> None:
        pass

    def abort(self, stream: RequestStream, reason: str = "cancelled") -> None:
        pass

    def dropped(self, stream: RequestStream) -> None:
        pass


class _Flow:
    write_paused = False


class TransportCycle:
    """uvicorn's cycle as the native pass reads it: a chunked response in progress on
    ``transport``, never paused, complete or disconnected; its ``send`` is never the pass's
    way, so it raises."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.chunked_encoding = True
        self.scope = {"method": "POST"}
        self.flow = _Flow()
        self.disconnected = False
        self.response_complete = False
        self.transport = transport

    async def send(self, message: dict[str, Any]) -> None:
        raise AssertionError("every event here is the native pass's")
