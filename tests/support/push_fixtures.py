"""Stand-ins for what `tsfront.serve.core.push.Pusher` and `tsfront.client.stream.RequestStream` use
of their neighbours, shared by the drain's tests (tests/unit/test_native_push.py and
tests/system/test_serve_native.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from tsfront.client.stream import RequestStream
from tsfront.text.detok import TableDetokenizer


class PlainChoice:
    """What `Pusher` uses of a `Choice`: its detokenizer, ``plain`` and the token count."""

    __slots__ = ("detok", "tokens")

    def __init__(self, detok: TableDetokenizer) -> None:
        self.detok = detok
        self.tokens = 0

    def plain(self, tokens: list[int]) -> str:
        self.tokens += len(tokens)
        return self.detok.step(tokens)


class LoggingOwner:
    """What a `RequestStream` asks of its slot table (`SlotOwner`): nothing is freed or
    aborted, each call is appended to ``log``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.disaggregated = False
        self.log: list[Any] = []

    def release(self, stream: RequestStream) -> None:
        self.log.append(("release", stream.rid))

    def abort(self, stream: RequestStream, reason: str = "cancelled") -> None:
        self.log.append(("abort", stream.rid, reason))

    def dropped(self, stream: RequestStream) -> None:
        self.log.append(("dropped", stream.rid))
