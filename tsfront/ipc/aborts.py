"""`RecentAborts`: the rids aborted within the engine's abort memory, so none is reused.

An engine remembers for 300 s every rid it was told to abort while it did not hold it (not
yet arrived, or already finished), and silently drops an ADD that reuses it: the new stream
would never end (CONTRACT §4.5). Whether the engine held the rid when the ABORT arrived is
unknowable from here, so any reuse within the window is refused. A worker keeps one memory
(rids it aborted itself: `generate` raises `RidRecentlyAborted`); the I/O process keeps one
per engine (every ABORT it sent that engine, from any worker: the ADD ends with
`StreamRejected`). Both are bounded; past the bound the oldest entries go first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from tsfront.wire.request import ENGINE_ABORT_MEMORY_S


class RecentAborts:
    """Rids aborted less than ``window`` seconds ago, oldest first, at most ``capacity``."""

    __slots__ = ("capacity", "times", "window")

    def __init__(self, capacity: int, window: float = ENGINE_ABORT_MEMORY_S) -> None:
        self.capacity = capacity
        self.window = window
        # rid → when it was aborted, oldest first. Public: the I/O process's native turn
        # (native/turn.c) looks a rid up here as `age` does, without a Python call.
        self.times: OrderedDict[Hashable, float] = OrderedDict()

    def add(self, rid: Hashable, now: float) -> None:
        """Remember that ``rid`` was aborted at ``now`` (monotonic seconds)."""
        at = self.times
        at[rid] = now
        at.move_to_end(rid)
        horizon = now - self.window
        while at:
            oldest = next(iter(at.values()))
            if oldest > horizon and len(at) <= self.capacity:
                break
            at.popitem(last=False)

    def age(self, rid: Hashable, now: float) -> float | None:
        """Seconds since ``rid`` was aborted, or None if not within the window."""
        at = self.times.get(rid)
        if at is None or now - at >= self.window:
            return None
        return now - at

    def clear(self) -> None:
        """Forget every rid (the engine process they were sent to is gone)."""
        self.times.clear()

    def __len__(self) -> int:
        return len(self.times)
